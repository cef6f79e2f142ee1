//! Checkpoints: the two persisted tokens of a stream, the store they live in, and the tracker
//! that decides what may be written (only the contiguous settled prefix).

mod model;
mod store;
mod tracker;

pub use model::{is_claim_only, Checkpoint, CheckpointParseError, StoredPosition, CLAIMED_AT};
pub use store::CheckpointStore;
pub(crate) use tracker::{Settlement, Tracker};
