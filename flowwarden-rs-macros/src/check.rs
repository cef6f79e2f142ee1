//! Rules that span several attributes or methods, run on the assembled model.

use proc_macro2::Span;

use crate::attr::method::Role;
use crate::ctxt::Ctxt;
use crate::model::{FullDocument, Handler, Op, StartPosition, Stream};
use crate::sig::ParamKind;

/// Runs every cross rule. `any_handler_attr` tells whether some method carried a handler
/// attribute (even one whose signature was rejected).
pub(crate) fn stream(cx: &Ctxt, s: &Stream, any_handler_attr: bool) {
    check_has_handler(cx, s, any_handler_attr);
    check_filter_with_delete(cx, s);
    check_key_needs_concurrency(cx, s);
    check_snapshot_has_insert_handler(cx, s);
    check_transactional_runs_alone(cx, s);
    for h in &s.handlers {
        check_document_availability(cx, s, h);
        check_transaction_param(cx, s, h);
    }
}

/// A transactional stream commits each event's writes with the checkpoint that passes it: the
/// checkpoint must be the position of that very event, so events run one at a time.
fn check_transactional_runs_alone(cx: &Ctxt, s: &Stream) {
    let Some(span) = s.transactional else {
        return;
    };
    if let Some(n) = s.concurrency.concurrency.filter(|n| *n > 1) {
        cx.error_at(
            span,
            format!("`transactional = true` handles one event at a time (each event's writes commit together with the checkpoint that moves past it), so it cannot be combined with `concurrency = {n}`: remove `concurrency`, or drop `transactional` and make the handler idempotent"),
        );
    }
}

/// A `&Transaction` parameter needs a transactional stream, and an async handler (the
/// transaction's operations are async; a blocking handler could not use them).
fn check_transaction_param(cx: &Ctxt, s: &Stream, h: &Handler) {
    let Some(p) = h
        .sig
        .params
        .iter()
        .find(|p| p.kind == ParamKind::Transaction)
    else {
        return;
    };
    if s.transactional.is_none() {
        cx.error_spanned_by(
            &p.ty,
            format!("`{}` takes a transaction handle, but the stream `{}` is not transactional: add `transactional = true` to #[change_stream(..)] so its writes commit together with the checkpoint (to receive the document instead, take it by value)", h.ident, s.name),
        );
    } else if !h.sig.is_async {
        cx.error_at(
            h.ident.span(),
            format!("`{}` takes the transaction, so it must be `async`: the transaction's reads and writes are async; write `async fn {}(..)`", h.ident, h.ident),
        );
    }
}

fn check_has_handler(cx: &Ctxt, s: &Stream, any_handler_attr: bool) {
    if s.handlers.is_empty() && !any_handler_attr {
        cx.error_at(
            Span::call_site(),
            format!(
                "no handler: the stream `{}` would receive events and do nothing with them; mark a method with #[on_insert], #[on_update], #[on_replace], #[on_delete] or #[on_change]",
                s.name
            ),
        );
    }
}

fn check_filter_with_delete(cx: &Ctxt, s: &Stream) {
    let (Some(filter), Some(delete)) = (&s.filter, s.handler_for(Op::Delete)) else {
        return;
    };
    cx.error_at(
        filter.attr_span,
        format!(
            "#[filter] cannot be combined with #[on_delete] (`{}`): a delete event carries no document, so the filter would judge every delete without one; filter deletes inside the #[on_delete] handler (`ctx.document_key()`, `ctx.document_before_change()`), or in the #[pipeline] (`$match` on `documentKey`)",
            delete.ident
        ),
    );
}

/// An initial snapshot hands every existing document over as an insert: a stream with no
/// handler for inserts would read the whole collection and drop every document.
fn check_snapshot_has_insert_handler(cx: &Ctxt, s: &Stream) {
    if s.checkpoint.start_position != Some(StartPosition::Snapshot)
        || s.handler_for(Op::Insert).is_some()
        || s.catch_all().is_some()
        || s.handlers.is_empty()
    {
        return;
    }
    cx.error_at(
        s.checkpoint
            .start_position_span
            .unwrap_or_else(Span::call_site),
        format!(
            "`start_position = Snapshot` hands every existing document of `{}` to the insert handler, but the stream has none: add an #[on_insert] or #[on_change] handler, or start with `Resume`",
            s.name
        ),
    );
}

/// A `#[key]` only changes which events may run at the same time; with one event at a time it
/// could never have an effect, so it is rejected rather than silently ignored.
fn check_key_needs_concurrency(cx: &Ctxt, s: &Stream) {
    let Some(key) = &s.key else {
        return;
    };
    match s.concurrency.concurrency {
        // `concurrency = 0` is reported on its own.
        Some(0) => {}
        Some(1) => cx.error_at(
            key.attr_span,
            format!(
                "#[key] orders events only with concurrency > 1: `{}` would never be called, since with `concurrency = 1` every event already runs alone, in stream order; raise `concurrency` in #[change_stream(..)], or remove #[key]",
                key.ident
            ),
        ),
        None => cx.error_at(
            key.attr_span,
            format!(
                "#[key] orders events only with concurrency > 1: `{}` would never be called, since without `concurrency = N` (default 1) every event already runs alone, in stream order; add e.g. `concurrency = 8` to #[change_stream(..)], or remove #[key]",
                key.ident
            ),
        ),
        Some(_) => {}
    }
}

fn check_document_availability(cx: &Ctxt, s: &Stream, h: &Handler) {
    let Some(doc) = h
        .sig
        .params
        .iter()
        .find(|p| matches!(p.kind, ParamKind::Document | ParamKind::OptionalDocument))
    else {
        return;
    };
    let optional = doc.kind == ParamKind::OptionalDocument;
    if s.document.is_none() {
        cx.error_spanned_by(
            &doc.ty,
            format!(
                "`{}` asks for the document, but the stream declares no document type: add `document = MyType` to #[change_stream(..)], or take only the context and read `ctx.document()` (a `bson::Document`)",
                h.ident
            ),
        );
        return;
    }
    for r in &h.roles {
        match r.role {
            Role::OnDelete => {
                cx.error_spanned_by(
                    &doc.ty,
                    format!(
                        "#[on_delete] handler `{}` asks for the document, but a delete event never carries it: take only the context and use `ctx.document_key()` (and `ctx.document_before_change()` with `full_document_before_change`)",
                        h.ident
                    ),
                );
            }
            Role::OnChange if !optional => {
                cx.error_spanned_by(
                    &doc.ty,
                    format!(
                        "#[on_change] handler `{}` takes `T`, but most operations it catches (delete, drop, rename, invalidate..) carry no document: take `Option<T>`, or only the context",
                        h.ident
                    ),
                );
            }
            Role::OnUpdate if !optional => match s.full_document {
                FullDocument::UpdateLookup | FullDocument::Required => {}
                FullDocument::WhenAvailable => cx.error_spanned_by(
                    &doc.ty,
                    format!(
                        "#[on_update] handler `{}` takes `T`, but with `full_document = \"whenAvailable\"` an update may come without its document: take `Option<T>`, or set `full_document = \"required\"`",
                        h.ident
                    ),
                ),
                FullDocument::Default => cx.error_spanned_by(
                    &doc.ty,
                    format!(
                        "#[on_update] handler `{}` asks for the document, but updates carry it only when the stream requests it: add `full_document = \"updateLookup\"` (or \"required\") to #[change_stream(..)], or take only the context and read `ctx.update_description()`",
                        h.ident
                    ),
                ),
            },
            _ => {}
        }
    }
}
