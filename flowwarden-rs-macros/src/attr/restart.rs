//! `#[restart(..)]` arguments.

use proc_macro2::TokenStream;

use super::retry::check_delays;
use super::value::{self, Spanned};
use super::{args_or_report, Keys};
use crate::ctxt::Ctxt;
use crate::model::defaults;
use crate::symbol::*;

/// What `#[restart(..)]` declares; absent keys keep the runtime's defaults.
#[derive(Default)]
pub(crate) struct RestartArgs {
    pub(crate) max_attempts: Option<Spanned<u32>>,
    pub(crate) initial_delay_ms: Option<Spanned<u64>>,
    pub(crate) max_delay_ms: Option<Spanned<u64>>,
}

impl RestartArgs {
    /// Reads the arguments, reporting every bad key or value to `cx`.
    pub(crate) fn parse(cx: &Ctxt, args: TokenStream) -> Self {
        let mut out = Self::default();
        let mut keys = Keys::new(cx, RESTART, RESTART_KEYS);
        for arg in args_or_report(cx, args) {
            let Some(key) = keys.accept(&arg) else {
                continue;
            };
            match key {
                MAX_ATTEMPTS => out.max_attempts = value::integer::<u32>(cx, &arg, "0"),
                INITIAL_DELAY_MS => {
                    out.initial_delay_ms =
                        non_zero_delay(cx, value::integer(cx, &arg, "1000"), key);
                }
                MAX_DELAY_MS => {
                    out.max_delay_ms = non_zero_delay(cx, value::integer(cx, &arg, "60000"), key);
                }
                _ => unreachable!("key {key} accepted but not read"),
            }
        }
        check_delays(
            cx,
            &out.initial_delay_ms,
            &out.max_delay_ms,
            defaults::RESTART_INITIAL_DELAY_MS,
            defaults::RESTART_MAX_DELAY_MS,
        );
        out
    }
}

fn non_zero_delay(cx: &Ctxt, v: Option<Spanned<u64>>, key: &str) -> Option<Spanned<u64>> {
    let v = v?;
    if v.value == 0 {
        cx.error_at(
            v.span,
            format!("`{key}` of #[restart] must be greater than 0: a zero delay re-opens a failing stream in a tight loop against the server (the default is {})",
                if key == INITIAL_DELAY_MS { defaults::RESTART_INITIAL_DELAY_MS } else { defaults::RESTART_MAX_DELAY_MS }),
        );
        return None;
    }
    Some(v)
}
