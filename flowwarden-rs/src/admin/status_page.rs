//! `GET /`: the live status page, one self-contained HTML document (inline CSS and JavaScript,
//! no external resources) in `status_page.html` beside this file. It polls the JSON API and
//! sends the token the operator types as `Authorization: Bearer`.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// The page.
pub(crate) const PAGE: &str = include_str!("status_page.html");

/// `GET /`.
pub(crate) async fn page() -> Response {
    let mut response = PAGE.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Nothing but the page itself and same-origin fetches.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
