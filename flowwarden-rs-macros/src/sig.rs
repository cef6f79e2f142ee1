//! Signature checks of the methods the attributes mark. Parameters are classified by their
//! syntax only; rustc checks the actual types through the generated calls.

use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, PathArguments, ReturnType, Signature, Type};

use crate::ctxt::Ctxt;

/// What a handler parameter is, judged from its type's syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParamKind {
    /// `&ChangeContext<T>`.
    Context,
    /// `T`: the decoded document, required.
    Document,
    /// `Option<T>`: the decoded document when the event carries one.
    OptionalDocument,
    /// `&Transaction` (any path whose last segment ends in `Transaction`): the attempt's
    /// transaction handle, for `transactional = true` streams.
    Transaction,
}

/// One classified parameter.
#[derive(Clone, Debug)]
pub(crate) struct Param {
    pub(crate) kind: ParamKind,
    /// The parameter's type, for errors about it (for a transaction, the type behind `&`).
    pub(crate) ty: Type,
}

/// A checked handler signature.
#[derive(Clone, Debug)]
pub(crate) struct HandlerSig {
    pub(crate) is_async: bool,
    pub(crate) params: Vec<Param>,
    /// The user's return type, `None` for an implicit `()`: the `IntoHandlerResult` check is
    /// written on it, so rustc's error lands there.
    pub(crate) ret: Option<Type>,
}

/// A checked pipeline, filter, error hook or key: only its return type is needed, for the
/// checks written on it.
#[derive(Clone, Debug)]
pub(crate) struct HookSig {
    pub(crate) ret: Type,
}

const HANDLER_SHAPES: &str = "expected `fn(&self, ctx: &ChangeContext<T>)`, `fn(&self, doc: T)` or `fn(&self, doc: T, ctx: &ChangeContext<T>)` (`Option<T>` for a document that may be absent), `async` or not, returning `()` or `Result<(), E>`";

/// The type behind `&` when `ty` is `&X` and `X`'s last path segment ends in `Transaction`
/// (`&flowwarden_rs_mongo::Transaction`, `&MemoryTransaction`).
pub(crate) fn transaction_referent(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Reference(r) if r.mutability.is_none() => match &*r.elem {
            Type::Path(p)
                if p.path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident.to_string().ends_with("Transaction")) =>
            {
                Some(&r.elem)
            }
            _ => None,
        },
        Type::Group(g) => transaction_referent(&g.elem),
        Type::Paren(p) => transaction_referent(&p.elem),
        _ => None,
    }
}

/// Whether `ty` is `&ChangeContext<..>` (any path ending in `ChangeContext`).
pub(crate) fn is_context(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) => last_segment_is(&r.elem, "ChangeContext"),
        Type::Group(g) => is_context(&g.elem),
        Type::Paren(p) => is_context(&p.elem),
        _ => false,
    }
}

fn last_segment_is(ty: &Type, name: &str) -> bool {
    match ty {
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == name),
        Type::Group(g) => last_segment_is(&g.elem, name),
        Type::Paren(p) => last_segment_is(&p.elem, name),
        _ => false,
    }
}

fn is_option(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p.path.segments.last().is_some_and(|s| {
            s.ident == "Option"
                && matches!(&s.arguments, PathArguments::AngleBracketed(a)
                    if a.args.len() == 1 && matches!(a.args[0], GenericArgument::Type(_)))
        }),
        Type::Group(g) => is_option(&g.elem),
        _ => false,
    }
}

/// The declared return type (callers have reported a missing one).
fn ret_type(sig: &Signature) -> Type {
    match &sig.output {
        ReturnType::Default => syn::parse_quote!(()),
        ReturnType::Type(_, ty) => (**ty).clone(),
    }
}

/// `self`, `&self`, `&mut self` or `self: T`, as written.
fn receiver_text(r: &syn::Receiver) -> String {
    if r.colon_token.is_some() {
        return format!("self: {}", type_text(&r.ty));
    }
    match (&r.reference, &r.mutability) {
        (Some(_), Some(_)) => "&mut self".to_owned(),
        (Some(_), None) => "&self".to_owned(),
        (None, _) => "self".to_owned(),
    }
}

fn type_text(ty: &Type) -> String {
    quote::quote!(#ty)
        .to_string()
        .replace(" < ", "<")
        .replace(" >", ">")
        .replace("< ", "<")
        .replace(" :: ", "::")
}

/// Checks what every marked method shares: no generics, no `unsafe`, no `extern`, no
/// variadics. `what` names the attribute for the message.
fn plain_fn(cx: &Ctxt, sig: &Signature, what: &str) -> bool {
    let mut ok = true;
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        cx.error_spanned_by(
            &sig.generics,
            format!("wrong {what} signature: it cannot be generic, the stream calls it with one concrete document type; remove the generic parameters"),
        );
        ok = false;
    }
    if let Some(u) = &sig.unsafety {
        cx.error_spanned_by(u, format!("wrong {what} signature: it cannot be `unsafe`"));
        ok = false;
    }
    if let Some(abi) = &sig.abi {
        cx.error_spanned_by(
            abi,
            format!("wrong {what} signature: it cannot have an `extern` ABI"),
        );
        ok = false;
    }
    if let Some(v) = &sig.variadic {
        cx.error_spanned_by(v, format!("wrong {what} signature: it cannot be variadic"));
        ok = false;
    }
    ok
}

/// Checks that the first parameter is `&self`; reports and returns false otherwise.
fn ref_self(cx: &Ctxt, sig: &Signature, what: &str, shape: &str) -> bool {
    match sig.inputs.first() {
        Some(FnArg::Receiver(r)) => {
            if r.colon_token.is_some() && !matches!(*r.ty, Type::Reference(_)) {
                cx.error_spanned_by(
                    r,
                    format!("wrong {what} signature: take `&self`, not `self: {}` — the runtime keeps one shared instance: {shape}", type_text(&r.ty)),
                );
                false
            } else if r.reference.is_none() {
                cx.error_spanned_by(
                    r,
                    format!("wrong {what} signature: take `&self`, not `self` — the runtime keeps one shared instance: {shape}"),
                );
                false
            } else if r.mutability.is_some() {
                cx.error_spanned_by(
                    r,
                    format!("wrong {what} signature: take `&self`, not `&mut self` — events may be handled while the instance is shared; keep mutable state behind a `Mutex` or atomics"),
                );
                false
            } else {
                true
            }
        }
        _ => {
            cx.error_at(
                sig.ident.span(),
                format!(
                    "wrong {what} signature: `{}` needs `&self` as its first parameter: {shape}",
                    sig.ident
                ),
            );
            false
        }
    }
}

/// Checks a handler (`#[on_insert]`, `#[on_update]`, `#[on_delete]`, `#[on_replace]`,
/// `#[on_change]`) and classifies its parameters.
pub(crate) fn handler(cx: &Ctxt, sig: &Signature) -> Option<HandlerSig> {
    let what = "handler";
    let mut ok = plain_fn(cx, sig, what);
    ok &= ref_self(cx, sig, what, HANDLER_SHAPES);
    let mut params = Vec::new();
    for input in sig.inputs.iter().skip(1) {
        let FnArg::Typed(pt) = input else {
            continue;
        };
        let ty = &*pt.ty;
        if let Some(inner) = transaction_referent(ty) {
            params.push(Param {
                kind: ParamKind::Transaction,
                ty: inner.clone(),
            });
            continue;
        }
        let kind = if is_context(ty) {
            ParamKind::Context
        } else if let Type::Reference(_) = ty {
            cx.error_spanned_by(
                ty,
                "wrong handler signature: take the document by value (`T` or `Option<T>`), or borrow it from the context with `ctx.document()`",
            );
            ok = false;
            continue;
        } else if is_option(ty) {
            ParamKind::OptionalDocument
        } else {
            ParamKind::Document
        };
        params.push(Param {
            kind,
            ty: ty.clone(),
        });
    }
    if let Some(i) = params.iter().position(|p| p.kind == ParamKind::Transaction) {
        if i + 1 != params.len() {
            cx.error_spanned_by(
                &params[i].ty,
                "wrong handler signature: the transaction comes last, after the document and the context: `async fn(&self, doc: T, ctx: &ChangeContext<T>, tx: &Transaction)`",
            );
            ok = false;
        }
    }
    let kinds: Vec<ParamKind> = params
        .iter()
        .map(|p| p.kind)
        .filter(|k| *k != ParamKind::Transaction)
        .collect();
    use ParamKind::*;
    match kinds.as_slice() {
        [] | [Context] | [Document | OptionalDocument] | [Document | OptionalDocument, Context] => {
        }
        [Context, Document | OptionalDocument] => {
            cx.error_spanned_by(
                &params[0].ty,
                "wrong handler signature: the document comes first, then the context: `fn(&self, doc: T, ctx: &ChangeContext<T>)`",
            );
            ok = false;
        }
        [Context, Context, ..] => {
            cx.error_spanned_by(
                &params[1].ty,
                "wrong handler signature: the context is passed once; remove this parameter",
            );
            ok = false;
        }
        [Document | OptionalDocument, Document | OptionalDocument, ..] => {
            cx.error_spanned_by(
                &params[1].ty,
                format!("wrong handler signature: a handler receives one document; remove this parameter ({HANDLER_SHAPES})"),
            );
            ok = false;
        }
        _ => {
            let extra = params
                .iter()
                .filter(|p| p.kind != Transaction)
                .nth(2)
                .map_or(&params[0].ty, |p| &p.ty);
            cx.error_spanned_by(
                extra,
                format!("wrong handler signature: too many parameters; {HANDLER_SHAPES}"),
            );
            ok = false;
        }
    }
    ok.then(|| HandlerSig {
        is_async: sig.asyncness.is_some(),
        params,
        ret: match &sig.output {
            ReturnType::Default => None,
            ReturnType::Type(_, ty) => Some((**ty).clone()),
        },
    })
}

/// Checks a `#[pipeline]`: `fn name() -> Vec<bson::Document>`.
pub(crate) fn pipeline(cx: &Ctxt, sig: &Signature) -> Option<HookSig> {
    let what = "#[pipeline]";
    let shape = "`fn pipeline() -> Vec<bson::Document>`";
    let mut ok = plain_fn(cx, sig, what);
    if let Some(a) = &sig.asyncness {
        cx.error_spanned_by(a, format!("#[pipeline] cannot be `async`: the stages are built once, when the stream opens; {shape}"));
        ok = false;
    }
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(r) => cx.error_spanned_by(
                r,
                format!("#[pipeline] is an associated function without `self`: the stages are built before any instance is used; remove `{}`: {shape}", receiver_text(r)),
            ),
            FnArg::Typed(t) => cx.error_spanned_by(
                t,
                format!("#[pipeline] takes no parameters; remove this one: {shape}"),
            ),
        }
        ok = false;
    }
    if let ReturnType::Default = sig.output {
        cx.error_at(
            sig.ident.span(),
            format!("#[pipeline] must return the stages: {shape}"),
        );
        ok = false;
    }
    ok.then(|| HookSig { ret: ret_type(sig) })
}

/// Checks a `#[filter]`: `fn name(&self, ctx: &ChangeContext<T>) -> bool`.
pub(crate) fn filter(cx: &Ctxt, sig: &Signature) -> Option<HookSig> {
    let what = "#[filter]";
    let shape = "`fn(&self, ctx: &ChangeContext<T>) -> bool`";
    let mut ok = plain_fn(cx, sig, what);
    if let Some(a) = &sig.asyncness {
        cx.error_spanned_by(a, format!("#[filter] cannot be `async`: it runs on every event before dispatch and must be quick; {shape}"));
        ok = false;
    }
    ok &= ref_self(cx, sig, what, shape);
    ok &= hook_params(cx, sig, &[HookParam::Context], what, shape);
    if let ReturnType::Default = sig.output {
        cx.error_at(
            sig.ident.span(),
            format!("#[filter] must return `bool`: {shape}"),
        );
        ok = false;
    }
    ok.then(|| HookSig { ret: ret_type(sig) })
}

/// Checks a `#[key]`: `fn name(&self, ctx: &ChangeContext<T>) -> K` where `K: Hash` (rustc
/// checks the bound on the return type, through the generated code).
pub(crate) fn key(cx: &Ctxt, sig: &Signature) -> Option<HookSig> {
    let what = "#[key]";
    let shape = "`fn(&self, ctx: &ChangeContext<T>) -> K` where `K: Hash` (e.g. `String`, `u64`, `(String, i32)`, `Option<String>`)";
    let mut ok = plain_fn(cx, sig, what);
    if let Some(a) = &sig.asyncness {
        cx.error_spanned_by(
            a,
            format!("#[key] cannot be `async`: it runs on every event as it is received, to decide which events it must wait for; compute the key from the context: {shape}"),
        );
        ok = false;
    }
    ok &= ref_self(cx, sig, what, shape);
    let typed: Vec<&syn::PatType> = sig
        .inputs
        .iter()
        .filter_map(|i| match i {
            FnArg::Typed(t) => Some(t),
            FnArg::Receiver(_) => None,
        })
        .collect();
    match typed.as_slice() {
        // The document (or anything else) instead of the context: say where the document is.
        [only] if !is_context(&only.ty) => {
            cx.error_spanned_by(
                &only.ty,
                format!("wrong #[key] signature: take the context, `ctx: &ChangeContext<T>`, and read the document through it (`ctx.document()`, `ctx.document_key()`): {shape}"),
            );
            ok = false;
        }
        _ => ok &= hook_params(cx, sig, &[HookParam::Context], what, shape),
    }
    if let ReturnType::Default = sig.output {
        cx.error_at(
            sig.ident.span(),
            format!("#[key] must return the key that orders events: {shape}"),
        );
        ok = false;
    }
    ok.then(|| HookSig { ret: ret_type(sig) })
}

/// Checks an `#[on_error]`:
/// `fn name(&self, err: &HandlerError, ctx: &ChangeContext<T>) -> ErrorAction`.
pub(crate) fn on_error(cx: &Ctxt, sig: &Signature) -> Option<HookSig> {
    let what = "#[on_error]";
    let shape = "`fn(&self, error: &HandlerError, ctx: &ChangeContext<T>) -> ErrorAction`";
    let mut ok = plain_fn(cx, sig, what);
    if let Some(a) = &sig.asyncness {
        cx.error_spanned_by(
            a,
            format!("#[on_error] cannot be `async`: it only decides what happens next; {shape}"),
        );
        ok = false;
    }
    ok &= ref_self(cx, sig, what, shape);
    ok &= hook_params(
        cx,
        sig,
        &[HookParam::Reference, HookParam::Context],
        what,
        shape,
    );
    if let ReturnType::Default = sig.output {
        cx.error_at(
            sig.ident.span(),
            format!("#[on_error] must return an `ErrorAction`: {shape}"),
        );
        ok = false;
    }
    ok.then(|| HookSig { ret: ret_type(sig) })
}

#[derive(Clone, Copy)]
enum HookParam {
    Context,
    Reference,
}

fn hook_params(
    cx: &Ctxt,
    sig: &Signature,
    expected: &[HookParam],
    what: &str,
    shape: &str,
) -> bool {
    let typed: Vec<&syn::PatType> = sig
        .inputs
        .iter()
        .filter_map(|i| match i {
            FnArg::Typed(t) => Some(t),
            FnArg::Receiver(_) => None,
        })
        .collect();
    if typed.len() != expected.len() {
        let span = typed
            .get(expected.len())
            .map_or_else(|| sig.paren_token.span.join(), |t| t.span());
        cx.error_at(
            span,
            format!(
                "wrong {what} signature: expected {} parameter(s) after `&self`, found {}: {shape}",
                expected.len(),
                typed.len()
            ),
        );
        return false;
    }
    let mut ok = true;
    for (t, want) in typed.iter().zip(expected) {
        let fits = match want {
            HookParam::Context => is_context(&t.ty),
            HookParam::Reference => matches!(*t.ty, Type::Reference(_)),
        };
        if !fits {
            cx.error_spanned_by(&t.ty, format!("wrong {what} signature: {shape}"));
            ok = false;
        }
    }
    ok
}
