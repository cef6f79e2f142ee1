//! The NATS JetStream bridge (feature `nats`): forwards change events to JetStream as owned,
//! versioned integration events, and lets the engine checkpoint an event only after JetStream
//! acknowledged it.
//!
//! A change event is not an integration event: its shape follows storage. The bridge publishes
//! an [`Envelope`] (`specversion`, `id`, `stream`, `operation`, `key`, `clusterTime`,
//! `wallTime`, `data`) whose `data` a mapping function makes from the event's
//! [`ChangeContext`](crate::ChangeContext) — never the raw event. It goes to
//! `flowwarden.<stream>.<operation>` unless configured otherwise, with the header
//! `Nats-Msg-Id` = the event's id, so a redelivery (after a crash between publish and
//! checkpoint) is dropped by the JetStream stream's duplicate window.
//!
//! - [`NatsBridge`]: call [`NatsBridge::publish`] from your handler, or turn the bridge into a
//!   ready-made stream with [`NatsBridge::into_stream`].
//! - [`async_nats`]: the client the bridge is built on, re-exported so that your connection
//!   and the bridge use the same version.
//!
//! Sizing the duplicate window, failure behaviour and the client choice:
//! `docs/integrations/nats.md`.

mod bridge;
mod envelope;
mod error;
mod stream;
mod subject;

pub use async_nats;
pub use bridge::{InvalidSubjectPrefix, NatsBridge, Published, DEFAULT_ACK_TIMEOUT};
pub use envelope::{ClusterTime, Envelope, SPEC_VERSION};
pub use error::NatsBridgeError;
pub use subject::{subject_token, DEFAULT_SUBJECT_PREFIX};
