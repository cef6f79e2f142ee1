//! `GET /openapi.json`: the OpenAPI 3 document of the admin API, hand-written in
//! `openapi.json` beside this file and checked against [`super::routes()`] by a test.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// The document.
pub(crate) const DOCUMENT: &str = include_str!("openapi.json");

/// `GET /openapi.json`.
pub(crate) async fn document() -> Response {
    let mut response = DOCUMENT.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn the_document_describes_exactly_the_routes() {
        let doc: serde_json::Value = serde_json::from_str(DOCUMENT).expect("openapi.json parses");
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let served: BTreeSet<(String, String)> = super::super::routes()
            .iter()
            .map(|r| (r.method().to_owned(), r.path().to_owned()))
            .collect();
        assert_eq!(documented, served);
        for route in super::super::routes().iter().filter(|r| r.requires_token()) {
            let op = &doc["paths"][route.path()][route.method().to_lowercase()];
            assert!(
                op["security"].is_array(),
                "{} {} documents its token",
                route.method(),
                route.path()
            );
        }
    }
}
