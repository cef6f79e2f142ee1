//! The backend conformance suite: every contract the engine relies on from a
//! [`flowwarden::Backend`] (change source, checkpoint store, lease store, dead-letter store),
//! checked through the public traits only, so any backend runs it with one call.
//!
//! ```ignore
//! struct MyTarget;
//! #[async_trait::async_trait]
//! impl ConformanceTarget for MyTarget { /* fresh, insert, update, delete, ... */ }
//!
//! #[tokio::test(flavor = "multi_thread")]
//! async fn my_backend_conforms() {
//!     flowwarden_testkit::conformance::run(&MyTarget).await;
//! }
//! ```
//!
//! Each case gets its own [`ConformanceTarget::fresh`] instance, runs bounded by
//! [`CASE_TIMEOUT`], and reports [`Outcome::Passed`], [`Outcome::Failed`] (a panic or a
//! timeout counts as a failure) or [`Outcome::NotApplicable`] (the target lacks a store or
//! cannot inject a fault). [`run_report`] returns every outcome; [`run`] panics naming every
//! failed case. The list of cases is [`CASES`]; `docs/implementing-a-backend.md` describes
//! the contract each one checks.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

mod checkpoint;
mod dead_letter;
mod lease;
mod report;
mod source;
mod support;
mod target;

pub use report::{CaseOutcome, Outcome, Report};
pub use target::{ConformanceTarget, Fresh};

use support::{CaseResult, Cx, Failure};

/// How long one case may run before it is reported as failed.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(60);

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

async fn settle<F: std::future::Future<Output = CaseResult>>(case: F) -> Outcome {
    match tokio::time::timeout(CASE_TIMEOUT, AssertUnwindSafe(case).catch_unwind()).await {
        Err(_) => Outcome::Failed(format!("did not finish within {CASE_TIMEOUT:?}")),
        Ok(Err(panic)) => Outcome::Failed(format!("panicked: {}", panic_message(&*panic))),
        Ok(Ok(Ok(()))) => Outcome::Passed,
        Ok(Ok(Err(Failure::Failed(why)))) => Outcome::Failed(why),
        Ok(Ok(Err(Failure::NotApplicable(why)))) => Outcome::NotApplicable(why),
    }
}

macro_rules! suite {
    ($($area:ident :: $case:ident),* $(,)?) => {
        /// Every case of the suite, `area.case`, in the order [`run_report`] runs them.
        pub const CASES: &[&str] = &[$(concat!(stringify!($area), ".", stringify!($case))),*];

        /// Runs every case against `target`, each on a fresh instance, and returns every
        /// outcome; never panics on a failed case.
        pub async fn run_report<T: ConformanceTarget>(target: &T) -> Report {
            let mut report = Report::default();
            $(
                let name = concat!(stringify!($area), ".", stringify!($case));
                let outcome = match target.fresh().await {
                    Err(e) => Outcome::Failed(format!("target.fresh(): {e}")),
                    Ok(fresh) => {
                        let cx = Cx::new(target, fresh);
                        settle($area::$case(&cx)).await
                    }
                };
                report.push(name, outcome);
            )*
            report
        }
    };
}

suite! {
    checkpoint::unknown_stream_loads_none,
    checkpoint::save_then_load_round_trips,
    checkpoint::fenced_save_by_current_leader_round_trips,
    checkpoint::save_after_newer_claim_is_fenced,
    checkpoint::claim_with_older_epoch_is_fenced,
    checkpoint::claim_alone_is_no_checkpoint,
    checkpoint::save_fenced_by_current_lease,
    checkpoint::corrupt_document_is_corrupt,
    lease::acquire_free_lease_gets_epoch_1,
    lease::held_lease_refuses_another_owner,
    lease::renew_extends,
    lease::expired_lease_goes_to_another_owner_with_higher_epoch,
    lease::epochs_never_restart,
    lease::release_frees_at_once,
    lease::holder_reacquire_bumps_epoch,
    lease::current_reports_holder,
    dead_letter::put_then_get_round_trips,
    dead_letter::list_filters_by_stream_status_and_limit,
    dead_letter::set_status_replays_and_discards,
    dead_letter::put_twice_is_idempotent,
    dead_letter::oversized_record_is_too_large_until_truncated,
    dead_letter::put_with_stale_epoch_is_fenced,
    source::reads_events_in_order,
    source::resume_after_token_continues_exactly_after,
    source::lost_history_is_history_lost,
    source::open_at_now_sees_only_later_events,
    source::now_initial_position_resumes_without_gap,
    source::idle_tick_token_resumes_without_gap,
}

/// Runs every case against `target` and panics, naming every failed case and why, when one
/// failed; otherwise returns the report (to check which cases were not applicable).
pub async fn run<T: ConformanceTarget>(target: &T) -> Report {
    let report = run_report(target).await;
    report.assert_no_failure();
    report
}
