//! The admin API configured from the environment (`FLOWWARDEN_ADMIN_ADDR`,
//! `FLOWWARDEN_ADMIN_TOKEN`). One test function in its own binary: the environment is global
//! to the process.
#![cfg(feature = "admin")]

mod support;

use std::net::SocketAddr;

use flowwarden::admin::{ADMIN_ADDR_VAR, ADMIN_TOKEN_VAR};
use flowwarden::{MemoryBackend, StreamState};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends one HTTP/1.1 request and returns the status code.
async fn status_of(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> u16 {
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(request.as_bytes()).await.expect("writes");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.expect("reads");
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer}"))
}

#[tokio::test]
async fn the_admin_api_is_configured_from_the_environment() {
    // A bad address is a startup error naming the variable; nothing starts.
    std::env::set_var(ADMIN_ADDR_VAR, "not an address");
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let err = flowwarden::builder()
        .discover(false)
        .any_stream(flowwarden::AnyStream::with_definition(
            probe.clone(),
            def("env-admin", |_| {}),
        ))
        .backend(backend.clone())
        .start()
        .await
        .err()
        .expect("a bad FLOWWARDEN_ADMIN_ADDR stops the start");
    assert!(err.to_string().contains(ADMIN_ADDR_VAR), "{err}");

    // A bare port binds 127.0.0.1; the token comes from the environment too.
    std::env::set_var(ADMIN_ADDR_VAR, "0");
    std::env::set_var(ADMIN_TOKEN_VAR, "from-the-env");
    let rt = start(&backend, &probe, def("env-admin", |_| {})).await;
    std::env::remove_var(ADMIN_ADDR_VAR);
    std::env::remove_var(ADMIN_TOKEN_VAR);
    let addr = rt
        .handle()
        .admin_addr()
        .expect("served from the environment");
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_eq!(status_of(addr, "GET", "/health/live", None).await, 200);
    assert_eq!(
        status_of(addr, "POST", "/streams/env-admin/stop", Some("wrong")).await,
        401
    );
    assert_eq!(
        status_of(
            addr,
            "POST",
            "/streams/env-admin/stop",
            Some("from-the-env")
        )
        .await,
        200
    );
    wait_status(&rt, "env-admin", |s| s.state == StreamState::Stopped).await;
    rt.shutdown().await;
}
