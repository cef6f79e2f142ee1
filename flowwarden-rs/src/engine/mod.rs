//! The stream engine: reading, routing, retrying, dead-lettering and checkpointing one stream.

use std::any::Any;
use std::sync::Arc;

use crate::definition::StreamDefinition;
use crate::handler::StreamHandler;
use crate::handler_error::{HandlerError, HandlerErrorKind};

/// A stream with its handler type erased.
pub(crate) trait ErasedStream: Send + Sync + 'static {
    fn definition(&self) -> &'static StreamDefinition;
}

/// The typed side of [`ErasedStream`].
pub(crate) struct TypedStream<H: StreamHandler> {
    handler: Arc<H>,
}

impl<H: StreamHandler> TypedStream<H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler: Arc::new(handler),
        }
    }
}

impl<H: StreamHandler> ErasedStream for TypedStream<H> {
    fn definition(&self) -> &'static StreamDefinition {
        let _ = &self.handler;
        H::definition()
    }
}

/// Turns a caught panic payload into a handler failure.
pub(crate) fn panic_error(payload: Box<dyn Any + Send>) -> HandlerError {
    let message = if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    };
    HandlerError::kind_msg(
        HandlerErrorKind::Panicked,
        format!("handler panicked: {message}"),
    )
}
