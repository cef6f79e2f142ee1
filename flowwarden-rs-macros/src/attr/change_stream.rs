//! `#[change_stream(..)]` arguments.

use proc_macro2::TokenStream;
use syn::{Path, TypePath};

use super::value::{self, Spanned};
use super::{args_or_report, Keys};
use crate::ctxt::Ctxt;
use crate::model::{DeploymentKind, FullDocument, FullDocumentBeforeChange};
use crate::symbol::*;

/// What `#[change_stream(..)]` declares, each key checked on its own.
#[derive(Default)]
pub(crate) struct ChangeStreamArgs {
    pub(crate) name: Option<Spanned<String>>,
    pub(crate) collection: Option<Spanned<String>>,
    pub(crate) database: Option<Spanned<String>>,
    pub(crate) document: Option<TypePath>,
    pub(crate) full_document: Option<Spanned<FullDocument>>,
    pub(crate) full_document_before_change: Option<Spanned<FullDocumentBeforeChange>>,
    pub(crate) enabled: Option<Spanned<bool>>,
    pub(crate) auto_start: Option<Spanned<bool>>,
    pub(crate) krate: Option<Spanned<Path>>,
    pub(crate) deployment: Option<Spanned<DeploymentKind>>,
    pub(crate) lease_secs: Option<Spanned<u64>>,
    pub(crate) renew_secs: Option<Spanned<u64>>,
    pub(crate) standby_poll_secs: Option<Spanned<u64>>,
    pub(crate) concurrency: Option<Spanned<u32>>,
    pub(crate) max_in_flight: Option<Spanned<u32>>,
    pub(crate) transactional: Option<Spanned<bool>>,
    /// Every key written (valid spelling, not repeated), even when its value was rejected.
    pub(crate) written: Vec<&'static str>,
}

const FULL_DOCUMENT_CHOICES: &[(&str, FullDocument)] = &[
    ("updateLookup", FullDocument::UpdateLookup),
    ("whenAvailable", FullDocument::WhenAvailable),
    ("required", FullDocument::Required),
    ("default", FullDocument::Default),
];

const BEFORE_CHANGE_CHOICES: &[(&str, FullDocumentBeforeChange)] = &[
    ("whenAvailable", FullDocumentBeforeChange::WhenAvailable),
    ("required", FullDocumentBeforeChange::Required),
    ("off", FullDocumentBeforeChange::Off),
];

impl ChangeStreamArgs {
    /// Reads the arguments, reporting every bad key or value to `cx`.
    pub(crate) fn parse(cx: &Ctxt, args: TokenStream) -> Self {
        let mut out = Self::default();
        let mut keys = Keys::new(cx, CHANGE_STREAM, CHANGE_STREAM_KEYS);
        for arg in args_or_report(cx, args) {
            let Some(key) = keys.accept(&arg) else {
                continue;
            };
            out.written.push(key);
            match key {
                NAME => out.name = value::non_empty_string(cx, &arg, "\"order-stream\""),
                COLLECTION => {
                    out.collection = value::non_empty_string(cx, &arg, "\"orders\"");
                }
                DATABASE => out.database = value::non_empty_string(cx, &arg, "\"shop\""),
                DOCUMENT => out.document = value::type_path(cx, &arg, "Order"),
                FULL_DOCUMENT => {
                    out.full_document = value::choice(cx, &arg, FULL_DOCUMENT_CHOICES);
                }
                FULL_DOCUMENT_BEFORE_CHANGE => {
                    out.full_document_before_change =
                        value::choice(cx, &arg, BEFORE_CHANGE_CHOICES);
                }
                ENABLED => out.enabled = value::boolean(cx, &arg),
                AUTO_START => out.auto_start = value::boolean(cx, &arg),
                CRATE => out.krate = value::path_in_string(cx, &arg, "\"flowwarden\""),
                DEPLOYMENT => {
                    out.deployment = value::choice(
                        cx,
                        &arg,
                        &[
                            ("AllInstances", DeploymentKind::AllInstances),
                            ("SingleLeader", DeploymentKind::SingleLeader),
                        ],
                    );
                }
                LEASE_SECS => out.lease_secs = value::integer::<u64>(cx, &arg, "30"),
                RENEW_SECS => out.renew_secs = value::integer::<u64>(cx, &arg, "10"),
                STANDBY_POLL_SECS => {
                    out.standby_poll_secs = value::integer::<u64>(cx, &arg, "5");
                }
                CONCURRENCY => out.concurrency = value::integer::<u32>(cx, &arg, "8"),
                MAX_IN_FLIGHT => out.max_in_flight = value::integer::<u32>(cx, &arg, "32"),
                TRANSACTIONAL => out.transactional = value::boolean(cx, &arg),
                _ => unreachable!("key {key} accepted but not read"),
            }
        }
        out
    }
}
