//! `deployment = ..` and the lease keys of `#[change_stream]`, validated.

use proc_macro2::Span;

use crate::attr::change_stream::ChangeStreamArgs;
use crate::ctxt::Ctxt;
use crate::symbol;

/// `deployment = ..` as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeploymentKind {
    AllInstances,
    SingleLeader,
}

/// The validated deployment mode; `None` fields take the runtime's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Deployment {
    AllInstances,
    SingleLeader {
        lease_secs: Option<u64>,
        renew_secs: Option<u64>,
        standby_poll_secs: Option<u64>,
    },
}

/// Runtime defaults of the lease (mirrors `flowwarden::LeaseConfig::DEFAULT`), for the
/// compile-time check of the renew interval.
const DEFAULT_LEASE_SECS: u64 = 30;
const DEFAULT_RENEW_SECS: u64 = 10;

impl Deployment {
    /// Validates the deployment keys, reporting problems at the offending key's value.
    pub(crate) fn from_args(cx: &Ctxt, args: &ChangeStreamArgs) -> Deployment {
        let leader = matches!(
            args.deployment.as_ref().map(|d| d.value),
            Some(DeploymentKind::SingleLeader)
        );
        let lease_keys = [
            (symbol::LEASE_SECS, &args.lease_secs),
            (symbol::RENEW_SECS, &args.renew_secs),
            (symbol::STANDBY_POLL_SECS, &args.standby_poll_secs),
        ];
        for (key, v) in lease_keys {
            let Some(v) = v else { continue };
            if !leader {
                cx.error_at(
                    v.span,
                    format!("`{key}` applies to `deployment = SingleLeader` only: add `deployment = SingleLeader` or remove `{key}`"),
                );
            } else if v.value == 0 {
                cx.error_at(v.span, format!("`{key}` must be at least 1 second"));
            }
        }
        if !leader {
            return Deployment::AllInstances;
        }
        let lease = args
            .lease_secs
            .as_ref()
            .map_or(DEFAULT_LEASE_SECS, |v| v.value);
        let renew = args
            .renew_secs
            .as_ref()
            .map_or(DEFAULT_RENEW_SECS, |v| v.value);
        if lease > 0 && renew > 0 && renew.saturating_mul(2) > lease {
            let span = args
                .renew_secs
                .as_ref()
                .or(args.lease_secs.as_ref())
                .map_or_else(Span::call_site, |v| v.span);
            cx.error_at(
                span,
                format!("`renew_secs = {renew}` is too close to `lease_secs = {lease}`: the leader must renew well before its lease expires; use at most half the lease (a third is the default: 10 of 30)"),
            );
        }
        Deployment::SingleLeader {
            lease_secs: args.lease_secs.as_ref().map(|v| v.value),
            renew_secs: args.renew_secs.as_ref().map(|v| v.value),
            standby_poll_secs: args.standby_poll_secs.as_ref().map(|v| v.value),
        }
    }
}
