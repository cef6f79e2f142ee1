//! A minimal HTTP/1.1 client (on `hyper`) for the service's admin API: one `POST` with a bearer
//! token. Plain `http://` only: the admin API serves no TLS (reach a remote one through a
//! tunnel or a port-forward).

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, HOST};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::error::CliError;

/// How long one admin request may take, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// An answer of the admin API.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: String,
}

/// A parsed `--admin` base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AdminUrl {
    /// `host:port`.
    authority: String,
    /// The path prefix, without a trailing `/`.
    prefix: String,
}

impl AdminUrl {
    /// Parses `http://host:port[/prefix]` (or `host:port`).
    pub(crate) fn parse(text: &str) -> Result<AdminUrl, CliError> {
        let text = text.trim();
        let with_scheme = if text.contains("://") {
            text.to_owned()
        } else {
            format!("http://{text}")
        };
        let bad = |why: &str| {
            CliError::Usage(format!(
                "--admin '{text}' {why}; give the service's admin API as http://HOST:PORT (FLOWWARDEN_ADMIN_ADDR of the service)"
            ))
        };
        let uri: Uri = with_scheme.parse().map_err(|_| bad("is not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "is https: the admin API serves plain HTTP (reach a remote one through a tunnel or port-forward)",
                ))
            }
            _ => return Err(bad("is not an http:// URL")),
        }
        let authority = uri.authority().ok_or_else(|| bad("has no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        Ok(AdminUrl {
            authority: format!("{}:{port}", authority.host()),
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// The URL for people.
    pub(crate) fn display(&self) -> String {
        format!("http://{}{}", self.authority, self.prefix)
    }
}

/// Percent-encodes one path segment (everything but RFC 3986 unreserved characters).
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `POST {base}{path}` with an empty body and, when given, `Authorization: Bearer <token>`.
pub(crate) async fn post(
    base: &AdminUrl,
    path: &str,
    token: Option<&str>,
) -> Result<Answer, CliError> {
    tokio::time::timeout(REQUEST_TIMEOUT, post_once(base, path, token))
        .await
        .map_err(|_| {
            CliError::Admin(format!(
                "the admin API at {} did not answer within {} s",
                base.display(),
                REQUEST_TIMEOUT.as_secs()
            ))
        })?
}

async fn post_once(base: &AdminUrl, path: &str, token: Option<&str>) -> Result<Answer, CliError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        CliError::Admin(format!(
            "cannot reach the admin API at {}: {e}; is the service running with its admin API on (FLOWWARDEN_ADMIN_ADDR)?",
            base.display()
        ))
    };
    let stream = TcpStream::connect(&base.authority)
        .await
        .map_err(|e| unreachable(&e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&e))?;
    let driver = tokio::spawn(connection);
    let mut request = Request::post(format!("{}{path}", base.prefix))
        .header(HOST, &base.authority)
        .header(CONTENT_LENGTH, 0);
    if let Some(t) = token {
        request = request.header(AUTHORIZATION, format!("Bearer {t}"));
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| CliError::Usage(format!("cannot build the admin request: {e}")))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| unreachable(&e))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(&e))?
        .to_bytes();
    driver.abort();
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = AdminUrl::parse("http://127.0.0.1:9090/").expect("parses");
        assert_eq!(u.authority, "127.0.0.1:9090");
        assert_eq!(u.prefix, "");
        let u = AdminUrl::parse("localhost:9090/ops").expect("parses");
        assert_eq!(u.display(), "http://localhost:9090/ops");
        assert!(matches!(
            AdminUrl::parse("https://h:1"),
            Err(CliError::Usage(m)) if m.contains("tunnel")
        ));
        assert!(AdminUrl::parse("ftp://h").is_err());
    }

    #[test]
    fn ids_are_encoded() {
        assert_eq!(path_segment("orders:82AB"), "orders%3A82AB");
        assert_eq!(path_segment("a b/{\"x\"}"), "a%20b%2F%7B%22x%22%7D");
    }
}
