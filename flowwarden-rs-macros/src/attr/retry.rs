//! `#[retry(..)]` arguments.

use proc_macro2::TokenStream;

use super::value::{self, Spanned};
use super::{args_or_report, Keys};
use crate::ctxt::Ctxt;
use crate::model::defaults;
use crate::symbol::*;

/// What `#[retry(..)]` declares; absent keys keep the runtime's defaults.
#[derive(Default)]
pub(crate) struct RetryArgs {
    pub(crate) max_attempts: Option<Spanned<u32>>,
    pub(crate) initial_delay_ms: Option<Spanned<u64>>,
    pub(crate) multiplier: Option<Spanned<f64>>,
    pub(crate) max_delay_ms: Option<Spanned<u64>>,
    pub(crate) jitter: Option<Spanned<bool>>,
}

impl RetryArgs {
    /// Reads the arguments, reporting every bad key or value to `cx`.
    pub(crate) fn parse(cx: &Ctxt, args: TokenStream) -> Self {
        let mut out = Self::default();
        let mut keys = Keys::new(cx, RETRY, RETRY_KEYS);
        for arg in args_or_report(cx, args) {
            let Some(key) = keys.accept(&arg) else {
                continue;
            };
            match key {
                MAX_ATTEMPTS => {
                    out.max_attempts = value::integer::<u32>(cx, &arg, "3");
                    if let Some(n) = &out.max_attempts {
                        if n.value == 0 {
                            cx.error_at(
                                n.span,
                                "`max_attempts` must be at least 1: it counts every attempt, the first one included (`max_attempts = 1` means no retry)",
                            );
                        }
                    }
                }
                INITIAL_DELAY_MS => {
                    out.initial_delay_ms = value::integer::<u64>(cx, &arg, "500");
                }
                MULTIPLIER => {
                    out.multiplier = value::number(cx, &arg, "2.0");
                    if let Some(m) = &out.multiplier {
                        if m.value < 1.0 {
                            cx.error_at(
                                m.span,
                                "`multiplier` must be at least 1.0: delays never shrink between attempts (`multiplier = 1.0` keeps them constant)",
                            );
                        }
                    }
                }
                MAX_DELAY_MS => out.max_delay_ms = value::integer::<u64>(cx, &arg, "30000"),
                JITTER => out.jitter = value::boolean(cx, &arg),
                _ => unreachable!("key {key} accepted but not read"),
            }
        }
        check_delays(
            cx,
            &out.initial_delay_ms,
            &out.max_delay_ms,
            defaults::RETRY_INITIAL_DELAY_MS,
            defaults::RETRY_MAX_DELAY_MS,
        );
        out
    }
}

/// `initial_delay_ms` must not exceed `max_delay_ms` (either may be the default). Reported on
/// the value the user wrote.
pub(crate) fn check_delays(
    cx: &Ctxt,
    initial: &Option<Spanned<u64>>,
    max: &Option<Spanned<u64>>,
    default_initial: u64,
    default_max: u64,
) {
    let (i, m) = (
        initial.as_ref().map_or(default_initial, |s| s.value),
        max.as_ref().map_or(default_max, |s| s.value),
    );
    if i <= m {
        return;
    }
    match (initial, max) {
        (Some(init), Some(_)) => cx.error_at(
            init.span,
            format!("`initial_delay_ms` ({i}) is greater than `max_delay_ms` ({m}): lower `initial_delay_ms` or raise `max_delay_ms`"),
        ),
        (Some(init), None) => cx.error_at(
            init.span,
            format!("`initial_delay_ms` ({i}) is greater than the default `max_delay_ms` ({m}): lower it, or set `max_delay_ms` too"),
        ),
        (None, Some(max)) => cx.error_at(
            max.span,
            format!("`max_delay_ms` ({m}) is smaller than the default `initial_delay_ms` ({i}): raise it, or set `initial_delay_ms` too"),
        ),
        (None, None) => {}
    }
}
