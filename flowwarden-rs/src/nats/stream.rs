//! [`NatsBridge::into_stream`]: a ready-made stream that publishes every event it receives.

use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::bridge::NatsBridge;
use crate::context::ChangeContext;
use crate::definition::{
    CheckpointConfig, Deployment, FullDocument, FullDocumentBeforeChange, RestartConfig,
    RetryConfig, SourceLocation, StreamDefinition,
};
use crate::engine::AnyStream;
use crate::handler::{HandlerFuture, StreamHandler};

/// The handler of [`NatsBridge::into_stream`]: like `#[on_change]`, it takes every operation.
struct BridgeStream<T> {
    bridge: NatsBridge<T>,
}

impl<T: DeserializeOwned + Send + Sync + 'static> StreamHandler for BridgeStream<T> {
    type Document = T;

    fn definition() -> &'static StreamDefinition {
        // Never the running definition: `into_stream` always supplies one. A valid placeholder
        // all the same, disabled, so that nothing could start it by mistake.
        static PLACEHOLDER: StreamDefinition = StreamDefinition {
            name: "nats-bridge",
            type_name: "NatsBridge",
            database: None,
            collection: "nats-bridge",
            full_document: FullDocument::Default,
            full_document_before_change: FullDocumentBeforeChange::Off,
            enabled: false,
            auto_start: false,
            checkpoint: CheckpointConfig::DEFAULT,
            retry: RetryConfig::DEFAULT,
            restart: RestartConfig::DEFAULT,
            deployment: Deployment::AllInstances,
            concurrency: crate::ConcurrencyConfig::DEFAULT,
            transactional: false,
            source: SourceLocation {
                file: file!(),
                line: line!(),
            },
        };
        &PLACEHOLDER
    }

    fn handle(self: Arc<Self>, ctx: Arc<ChangeContext<T>>) -> Option<HandlerFuture> {
        Some(Box::pin(async move { self.bridge.publish(&ctx).await }))
    }
}

impl<T: DeserializeOwned + Send + Sync + 'static> NatsBridge<T> {
    /// A stream that publishes every event of `definition` (every operation, like an
    /// `#[on_change]` handler) through this bridge; give it to
    /// [`Builder::any_stream`](crate::Builder::any_stream). For a stream that publishes only
    /// some events, or does more, call [`publish`](Self::publish) from your own handler.
    pub fn into_stream(self, definition: &'static StreamDefinition) -> AnyStream {
        AnyStream::with_definition(BridgeStream { bridge: self }, definition)
    }
}
