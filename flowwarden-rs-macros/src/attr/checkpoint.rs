//! `#[checkpoint(..)]` arguments.

use proc_macro2::TokenStream;

use super::value::{self, Spanned};
use super::{args_or_report, Keys};
use crate::ctxt::Ctxt;
use crate::model::{OnHistoryLost, ResumeStrategy, StartPosition};
use crate::symbol::*;

/// What `#[checkpoint(..)]` declares; absent keys keep the runtime's defaults.
#[derive(Default)]
pub(crate) struct CheckpointArgs {
    pub(crate) save_every_n: Option<Spanned<u32>>,
    pub(crate) save_interval_secs: Option<Spanned<u64>>,
    pub(crate) start_position: Option<Spanned<StartPosition>>,
    pub(crate) on_history_lost: Option<Spanned<OnHistoryLost>>,
    pub(crate) resume_strategy: Option<Spanned<ResumeStrategy>>,
}

impl CheckpointArgs {
    /// Reads the arguments, reporting every bad key or value to `cx`.
    pub(crate) fn parse(cx: &Ctxt, args: TokenStream) -> Self {
        let mut out = Self::default();
        let mut keys = Keys::new(cx, CHECKPOINT, CHECKPOINT_KEYS);
        for arg in args_or_report(cx, args) {
            let Some(key) = keys.accept(&arg) else {
                continue;
            };
            match key {
                SAVE_EVERY_N => {
                    out.save_every_n = value::integer::<u32>(cx, &arg, "5");
                    if let Some(n) = &out.save_every_n {
                        if n.value == 0 {
                            cx.error_at(
                                n.span,
                                "`save_every_n` must be at least 1: it counts handled events between checkpoint writes (`save_every_n = 1` writes after every event)",
                            );
                        }
                    }
                }
                SAVE_INTERVAL_SECS => {
                    out.save_interval_secs = value::integer::<u64>(cx, &arg, "10");
                }
                START_POSITION => {
                    out.start_position = value::choice(
                        cx,
                        &arg,
                        &[
                            ("Resume", StartPosition::Resume),
                            ("Latest", StartPosition::Latest),
                            ("Snapshot", StartPosition::Snapshot),
                        ],
                    );
                }
                ON_HISTORY_LOST => {
                    out.on_history_lost = value::choice(
                        cx,
                        &arg,
                        &[
                            ("Fail", OnHistoryLost::Fail),
                            ("ResumeFromOplogStart", OnHistoryLost::ResumeFromOplogStart),
                            ("ResumeFromNow", OnHistoryLost::ResumeFromNow),
                        ],
                    );
                }
                RESUME_STRATEGY => {
                    out.resume_strategy = value::choice(
                        cx,
                        &arg,
                        &[
                            ("ProcessedFirst", ResumeStrategy::ProcessedFirst),
                            ("SeenFirst", ResumeStrategy::SeenFirst),
                        ],
                    );
                }
                _ => unreachable!("key {key} accepted but not read"),
            }
        }
        out
    }
}
