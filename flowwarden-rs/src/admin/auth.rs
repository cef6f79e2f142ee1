//! The bearer token of the mutating routes.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::router::AppState;

/// Lets the request through when it carries `Authorization: Bearer <token>` with the configured
/// token; 403 when no token is configured, 401 when it is missing or wrong.
pub(crate) async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    match check(state.token.as_deref(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

fn check(configured: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let expected = configured.ok_or(ApiError::TokenNotConfigured)?;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .ok_or(ApiError::Unauthorized)?;
    if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// Compares without stopping at the first difference, so the time taken does not tell how much
/// of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn tokens() {
        assert!(matches!(
            check(None, &with("Bearer x")),
            Err(ApiError::TokenNotConfigured)
        ));
        assert!(matches!(
            check(Some("s3cret"), &HeaderMap::new()),
            Err(ApiError::Unauthorized)
        ));
        assert!(matches!(
            check(Some("s3cret"), &with("Bearer s3creT")),
            Err(ApiError::Unauthorized)
        ));
        assert!(matches!(
            check(Some("s3cret"), &with("Basic s3cret")),
            Err(ApiError::Unauthorized)
        ));
        assert!(check(Some("s3cret"), &with("Bearer s3cret")).is_ok());
        assert!(check(Some("s3cret"), &with("bearer s3cret")).is_ok());
    }
}
