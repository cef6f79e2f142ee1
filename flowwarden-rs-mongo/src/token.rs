//! Conversions between the runtime's resume token (a BSON document) and the driver's.

use bson::Bson;
use flowwarden::port::{SourceError, SourceErrorKind};
use flowwarden::ResumeToken;
use mongodb::change_stream::event::ResumeToken as DriverToken;

/// The driver's token for a stored one.
pub(crate) fn to_driver(token: &ResumeToken) -> Result<DriverToken, SourceError> {
    bson::from_bson::<DriverToken>(Bson::Document(token.as_document().clone())).map_err(|e| {
        SourceError::new(
            SourceErrorKind::InvalidToken,
            format!("resume token {token} cannot be handed to the driver: {e}"),
        )
    })
}

/// The runtime's token for the driver's (`None` when it is not a document).
pub(crate) fn from_driver(token: &DriverToken) -> Option<ResumeToken> {
    match bson::to_bson(token) {
        Ok(Bson::Document(d)) if !d.is_empty() => Some(ResumeToken::from_document(d)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn round_trips_through_the_driver_type() {
        let t = ResumeToken::from_document(doc! {"_data": "8200AB"});
        let d = to_driver(&t).expect("converts");
        assert_eq!(from_driver(&d), Some(t));
    }
}
