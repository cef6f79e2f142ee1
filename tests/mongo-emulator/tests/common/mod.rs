//! Helpers shared by the emulator's own test suite (which drives it with the real driver only).
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use mongo_emulator::Emulator;
use mongodb::bson::Document;
use mongodb::change_stream::{event::ChangeStreamEvent, ChangeStream};
use mongodb::error::{Error, ErrorKind, WriteFailure};
use mongodb::options::ClientOptions;
use mongodb::Client;

/// Runs a test body with an upper bound, so a broken test fails instead of hanging.
pub async fn bounded<F: Future<Output = T>, T>(fut: F) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .expect("test body exceeded its 30 s bound")
}

/// A driver client for the emulator, with short selection timeouts.
pub async fn client_for(uri: &str) -> Client {
    let mut options = ClientOptions::parse(uri).await.expect("uri parses");
    options.server_selection_timeout = Some(Duration::from_secs(5));
    options.connect_timeout = Some(Duration::from_secs(2));
    Client::with_options(options).expect("client builds")
}

/// Starts an emulator and a replica-set client for it.
pub async fn setup() -> (Emulator, Client) {
    let emu = Emulator::start().await.expect("emulator starts");
    let client = client_for(&emu.uri()).await;
    (emu, client)
}

/// The server error code carried by a driver error, if any.
pub fn server_code(e: &Error) -> Option<i32> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::InsertMany(m) => m
            .write_errors
            .as_ref()
            .and_then(|w| w.first())
            .map(|w| w.code),
        _ => None,
    }
}

/// The next change event, within 10 s.
pub async fn next_event(
    stream: &mut ChangeStream<ChangeStreamEvent<Document>>,
) -> ChangeStreamEvent<Document> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event within 10 s")
        .expect("stream still open")
        .expect("no stream error")
}
