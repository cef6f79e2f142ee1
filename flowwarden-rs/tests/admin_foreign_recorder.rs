//! `/metrics` when the process installed its own global metrics recorder before the runtime
//! started: flowwarden does not replace it, and `/metrics` says so with a 501 (its own test
//! binary, so the global recorder of the other admin tests does not interfere).
#![cfg(feature = "admin")]

mod support;

use flowwarden::MemoryBackend;
use metrics_util::debugging::DebuggingRecorder;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn metrics_answers_501_when_another_recorder_is_installed() {
    DebuggingRecorder::new()
        .install()
        .expect("no recorder installed yet");
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = start_with(&backend, &probe, def("foreign", |_| {}), |b| {
        b.admin("127.0.0.1:0".parse().unwrap())
    })
    .await;
    let addr = rt.handle().admin_addr().unwrap();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    rt.shutdown().await;
    assert!(answer.starts_with("HTTP/1.1 501"), "{answer}");
    assert!(
        answer.contains("another global metrics recorder"),
        "{answer}"
    );
    assert!(answer.contains("recorder_not_installed"), "{answer}");
}
