//! The generated code raises no warning of its own, even under strict lint levels, and the
//! imports of the companions count as used.
#![deny(warnings, missing_docs, unused, rust_2018_idioms, unreachable_pub)]

use flowwarden::{change_stream, checkpoint, restart, retry, ChangeContext};

/// A stream.
#[derive(Default)]
pub struct Quiet;

#[change_stream(collection = "quiet")]
#[checkpoint(save_every_n = 1, save_interval_secs = 5, start_position = Resume,
    on_history_lost = Fail, resume_strategy = ProcessedFirst)]
#[retry(max_attempts = 3, initial_delay_ms = 500, multiplier = 2.0, max_delay_ms = 30000, jitter = true)]
#[restart(max_attempts = 0, initial_delay_ms = 1000, max_delay_ms = 60000)]
impl Quiet {
    #[on_insert]
    fn created(&self, ctx: &ChangeContext<bson::Document>) {
        let _ = ctx.document_key();
    }
}

fn main() {
    let def = <Quiet as flowwarden::StreamHandler>::definition();
    assert_eq!(def.checkpoint, flowwarden::CheckpointConfig::DEFAULT);
    assert_eq!(def.retry, flowwarden::RetryConfig::DEFAULT);
    assert_eq!(def.restart, flowwarden::RestartConfig::DEFAULT);
}
