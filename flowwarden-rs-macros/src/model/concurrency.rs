//! `concurrency = N` and `max_in_flight = M` of `#[change_stream]`, validated.

use crate::attr::change_stream::ChangeStreamArgs;
use crate::ctxt::Ctxt;
use crate::symbol;

/// Keyed concurrency as written; `None` takes the runtime's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Concurrency {
    pub(crate) concurrency: Option<u32>,
    pub(crate) max_in_flight: Option<u32>,
}

impl Concurrency {
    /// Validates the keys, reporting problems at the offending value.
    pub(crate) fn from_args(cx: &Ctxt, args: &ChangeStreamArgs) -> Concurrency {
        if let Some(n) = &args.concurrency {
            if n.value == 0 {
                cx.error_at(
                    n.span,
                    format!(
                        "`{}` must be at least 1 (1 handles one event at a time)",
                        symbol::CONCURRENCY
                    ),
                );
            }
        }
        let n = args.concurrency.as_ref().map_or(1, |n| n.value);
        if let Some(m) = &args.max_in_flight {
            if m.value == 0 {
                cx.error_at(
                    m.span,
                    format!(
                        "`{}` must be at least 1; leave it out for the default (4 x concurrency)",
                        symbol::MAX_IN_FLIGHT
                    ),
                );
            } else if n > 0 && m.value < n {
                cx.error_at(
                    m.span,
                    format!("`max_in_flight = {}` is below `concurrency = {n}`: at most {} handlers could ever run; use at least {n}, or leave it out for the default (4 x concurrency)", m.value, m.value),
                );
            }
        }
        Concurrency {
            concurrency: args.concurrency.as_ref().map(|v| v.value),
            max_in_flight: args.max_in_flight.as_ref().map(|v| v.value),
        }
    }
}
