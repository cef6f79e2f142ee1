//! The validated model of one `#[change_stream]` impl: the only input of code generation.
//!
//! [`Stream::from_ast`] reads the parsed attributes and the impl's methods, checks each
//! method's signature, and runs the cross-attribute rules of [`crate::check`]. Every problem
//! is reported to the [`Ctxt`]; a model is returned only when there was none.

use proc_macro2::Span;
use syn::{Ident, ImplItem, ItemImpl, Path, Type, TypePath};

use crate::attr::change_stream::ChangeStreamArgs;
use crate::attr::checkpoint::CheckpointArgs;
use crate::attr::method::{take_roles, Role, RoleAttr};
use crate::attr::restart::RestartArgs;
use crate::attr::retry::RetryArgs;
use crate::attr::value::Spanned;
use crate::check;
use crate::ctxt::Ctxt;
use crate::naming;
use crate::sig::{self, HandlerSig, HookSig};
use crate::symbol;

mod concurrency;
mod deployment;

pub(crate) use concurrency::Concurrency;
pub(crate) use deployment::{Deployment, DeploymentKind};

/// Runtime defaults the macro needs for its own checks (the generated code takes the rest
/// from the runtime's `DEFAULT` constants).
pub(crate) mod defaults {
    /// `RetryConfig::DEFAULT.initial_delay_ms`.
    pub(crate) const RETRY_INITIAL_DELAY_MS: u64 = 500;
    /// `RetryConfig::DEFAULT.max_delay_ms`.
    pub(crate) const RETRY_MAX_DELAY_MS: u64 = 30_000;
    /// `RestartConfig::DEFAULT.initial_delay_ms`.
    pub(crate) const RESTART_INITIAL_DELAY_MS: u64 = 1_000;
    /// `RestartConfig::DEFAULT.max_delay_ms`.
    pub(crate) const RESTART_MAX_DELAY_MS: u64 = 60_000;
}

/// Mirrors the runtime's `FullDocument`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FullDocument {
    Default,
    UpdateLookup,
    WhenAvailable,
    Required,
}

/// Mirrors the runtime's `FullDocumentBeforeChange`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FullDocumentBeforeChange {
    Off,
    WhenAvailable,
    Required,
}

/// Mirrors the runtime's `StartPosition`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartPosition {
    Resume,
    Latest,
    Snapshot,
}

/// Mirrors the runtime's `OnHistoryLost`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnHistoryLost {
    Fail,
    ResumeFromOplogStart,
    ResumeFromNow,
}

/// Mirrors the runtime's `ResumeStrategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResumeStrategy {
    ProcessedFirst,
    SeenFirst,
}

/// An operation a typed handler takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Insert,
    Update,
    Replace,
    Delete,
}

impl Op {
    pub(crate) const ALL: [Op; 4] = [Op::Insert, Op::Update, Op::Replace, Op::Delete];

    fn from_role(role: Role) -> Option<Op> {
        Some(match role {
            Role::OnInsert => Op::Insert,
            Role::OnUpdate => Op::Update,
            Role::OnReplace => Op::Replace,
            Role::OnDelete => Op::Delete,
            _ => return None,
        })
    }

    /// The server's spelling.
    pub(crate) fn wire_name(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Replace => "replace",
            Op::Delete => "delete",
        }
    }
}

/// Where the collection name comes from.
pub(crate) enum Collection {
    /// `collection = "..."`.
    Named(String),
    /// `<T as CollectionName>::COLLECTION`.
    FromDocument(TypePath),
}

/// A handler method.
pub(crate) struct Handler {
    pub(crate) ident: Ident,
    pub(crate) sig: HandlerSig,
    /// Its attributes, in the order written (typed operations and `#[on_change]`).
    pub(crate) roles: Vec<RoleAttr>,
}

/// A `#[pipeline]`, `#[filter]`, `#[on_error]` or `#[key]` method.
pub(crate) struct Hook {
    pub(crate) ident: Ident,
    pub(crate) sig: HookSig,
    /// The attribute, for errors about it.
    pub(crate) attr_span: Span,
}

/// `#[checkpoint]`: only the keys written; the rest is the runtime's default.
#[derive(Default)]
pub(crate) struct Checkpoint {
    pub(crate) save_every_n: Option<u32>,
    pub(crate) save_interval_secs: Option<u64>,
    pub(crate) start_position: Option<StartPosition>,
    /// Where `start_position` was written, for the rules that judge it.
    pub(crate) start_position_span: Option<proc_macro2::Span>,
    pub(crate) on_history_lost: Option<OnHistoryLost>,
    pub(crate) resume_strategy: Option<ResumeStrategy>,
}

/// `#[retry]`: only the keys written.
#[derive(Default)]
pub(crate) struct Retry {
    pub(crate) max_attempts: Option<u32>,
    pub(crate) initial_delay_ms: Option<u64>,
    pub(crate) multiplier: Option<f64>,
    pub(crate) max_delay_ms: Option<u64>,
    pub(crate) jitter: Option<bool>,
}

/// `#[restart]`: only the keys written.
#[derive(Default)]
pub(crate) struct Restart {
    pub(crate) max_attempts: Option<u32>,
    pub(crate) initial_delay_ms: Option<u64>,
    pub(crate) max_delay_ms: Option<u64>,
}

/// Everything codegen needs, validated.
pub(crate) struct Stream {
    /// The runtime's path (`::flowwarden` unless `crate = "..."`).
    pub(crate) krate: Path,
    pub(crate) self_ty: Type,
    pub(crate) type_name: String,
    pub(crate) name: String,
    pub(crate) database: Option<String>,
    pub(crate) collection: Collection,
    pub(crate) document: Option<TypePath>,
    pub(crate) full_document: FullDocument,
    pub(crate) full_document_before_change: FullDocumentBeforeChange,
    pub(crate) enabled: bool,
    pub(crate) auto_start: bool,
    pub(crate) checkpoint: Checkpoint,
    pub(crate) retry: Retry,
    pub(crate) restart: Restart,
    pub(crate) deployment: Deployment,
    pub(crate) concurrency: Concurrency,
    /// `transactional = true`, with the span of its value.
    pub(crate) transactional: Option<Span>,
    pub(crate) handlers: Vec<Handler>,
    pub(crate) pipeline: Option<Hook>,
    pub(crate) filter: Option<Hook>,
    pub(crate) on_error: Option<Hook>,
    /// The `#[key]` method: orders events by its value instead of their `documentKey`.
    pub(crate) key: Option<Hook>,
}

impl Stream {
    /// Which handler takes `op`, if any (typed handlers only).
    pub(crate) fn handler_for(&self, op: Op) -> Option<&Handler> {
        self.handlers
            .iter()
            .find(|h| h.roles.iter().any(|r| Op::from_role(r.role) == Some(op)))
    }

    /// The `#[on_change]` catch-all, if any.
    pub(crate) fn catch_all(&self) -> Option<&Handler> {
        self.handlers
            .iter()
            .find(|h| h.roles.iter().any(|r| r.role == Role::OnChange))
    }

    /// Builds the model, stripping every method attribute off `item`. Reports every problem
    /// to `cx`; returns `None` when there was one.
    pub(crate) fn from_ast(
        cx: &Ctxt,
        args: ChangeStreamArgs,
        companions: Companions,
        item: &mut ItemImpl,
    ) -> Option<Stream> {
        let self_ty = self_type(cx, item);
        let methods = collect_methods(cx, item);

        let deployment = Deployment::from_args(cx, &args);
        let concurrency = Concurrency::from_args(cx, &args);
        let krate = args
            .krate
            .map_or_else(|| syn::parse_quote!(::flowwarden), |p| p.value);
        let collection = match (args.collection, &args.document) {
            (Some(c), _) => Some(Collection::Named(c.value)),
            (None, Some(doc)) => Some(Collection::FromDocument(doc.clone())),
            // A `collection` or `document` key was written but rejected: already reported.
            (None, None)
                if args.written.contains(&symbol::COLLECTION)
                    || args.written.contains(&symbol::DOCUMENT) =>
            {
                None
            }
            (None, None) => {
                cx.error_at(
                    Span::call_site(),
                    "missing `collection`: add `collection = \"orders\"` to #[change_stream(..)], or set `document = MyType` where `MyType` implements `flowwarden::CollectionName`",
                );
                None
            }
        };
        let full_document = args
            .full_document
            .map_or(FullDocument::Default, |s| s.value);

        let mut stream = Stream {
            krate,
            self_ty: *item.self_ty.clone(),
            type_name: self_ty.as_ref().map(|(_, n)| n.clone()).unwrap_or_default(),
            name: String::new(),
            database: args.database.map(|d| d.value),
            collection: collection.unwrap_or(Collection::Named(String::new())),
            document: args.document,
            full_document,
            full_document_before_change: args
                .full_document_before_change
                .map_or(FullDocumentBeforeChange::Off, |s| s.value),
            enabled: args.enabled.is_none_or(|s| s.value),
            auto_start: args.auto_start.is_none_or(|s| s.value),
            checkpoint: companions.checkpoint(),
            retry: companions.retry(),
            restart: companions.restart(),
            deployment,
            concurrency,
            transactional: args
                .transactional
                .as_ref()
                .filter(|t| t.value)
                .map(|t| t.span),
            handlers: Vec::new(),
            pipeline: None,
            filter: None,
            on_error: None,
            key: None,
        };
        stream.name = match (args.name, &self_ty) {
            (Some(n), _) => n.value,
            (None, Some((ident, _))) => naming::kebab_case(&ident.to_string()),
            (None, None) => String::new(),
        };

        let mut any_handler_attr = false;
        let mut claims = Vec::new();
        for m in methods {
            any_handler_attr |= m.roles.iter().any(|r| r.role.is_handler());
            stream.add_method(cx, m, &mut claims);
        }
        check::stream(cx, &stream, any_handler_attr);

        if cx.has_errors() {
            None
        } else {
            Some(stream)
        }
    }

    fn add_method(&mut self, cx: &Ctxt, m: Method, claims: &mut Vec<(Role, String)>) {
        let Method { ident, sig, roles } = m;
        let (handler_roles, hook_roles): (Vec<RoleAttr>, Vec<RoleAttr>) =
            roles.into_iter().partition(|r| r.role.is_handler());
        if !handler_roles.is_empty() {
            if let Some(hook) = hook_roles.first() {
                cx.error_at(
                    hook.span,
                    format!(
                        "`{ident}` is already a handler (#[{}]); #[{}] needs a method of its own",
                        handler_roles[0].role.name(),
                        hook.role.name()
                    ),
                );
                return;
            }
            self.add_handler(cx, ident, &sig, handler_roles, claims);
            return;
        }
        let mut hooks = hook_roles.into_iter();
        let Some(first) = hooks.next() else {
            return;
        };
        if let Some(second) = hooks.next() {
            cx.error_at(
                second.span,
                format!(
                    "`{ident}` is already the #[{}]; #[{}] needs a method of its own",
                    first.role.name(),
                    second.role.name()
                ),
            );
            return;
        }
        if let Some((_, existing)) = claims.iter().find(|(role, _)| *role == first.role) {
            let what = first.role.name();
            let why = match first.role {
                Role::Pipeline => "merge the stages into one `Vec`",
                Role::Filter => "combine the conditions in one method",
                Role::Key => "an event has one key: return every part of it from one method, e.g. a tuple `(String, i32)`",
                _ => "decide every case in one method",
            };
            cx.error_at(
                first.span,
                format!(
                    "a second #[{what}]: `{existing}` is already the #[{what}] of this stream; {why}"
                ),
            );
            return;
        }
        claims.push((first.role, ident.to_string()));
        let (checked, slot) = match first.role {
            Role::Pipeline => (sig::pipeline(cx, &sig), &mut self.pipeline),
            Role::Filter => (sig::filter(cx, &sig), &mut self.filter),
            Role::Key => (sig::key(cx, &sig), &mut self.key),
            _ => (sig::on_error(cx, &sig), &mut self.on_error),
        };
        if let Some(sig) = checked {
            *slot = Some(Hook {
                ident,
                sig,
                attr_span: first.span,
            });
        }
    }

    fn add_handler(
        &mut self,
        cx: &Ctxt,
        ident: Ident,
        sig: &syn::Signature,
        roles: Vec<RoleAttr>,
        claims: &mut Vec<(Role, String)>,
    ) {
        let mut kept: Vec<RoleAttr> = Vec::new();
        for r in roles {
            // Claims are recorded even for methods whose signature is rejected, so a second
            // handler for the same operation is still reported.
            let taken_by = claims
                .iter()
                .find(|(role, _)| *role == r.role)
                .map(|(_, method)| method.clone());
            match taken_by {
                Some(other) if r.role == Role::OnChange => cx.error_at(
                    r.span,
                    format!("a second #[on_change]: `{other}` is already the catch-all of this stream; one method takes every operation without a typed handler"),
                ),
                Some(other) => {
                    let op = Op::from_role(r.role).map_or("", Op::wire_name);
                    cx.error_at(
                        r.span,
                        format!("two handlers for `{op}`: `{other}` already handles it; keep one #[{}] per stream (one method may carry several attributes, e.g. #[on_update] #[on_replace])", r.role.name()),
                    );
                }
                None => {
                    claims.push((r.role, ident.to_string()));
                    kept.push(r);
                }
            }
        }
        let Some(sig) = sig::handler(cx, sig) else {
            return;
        };
        if !kept.is_empty() {
            self.handlers.push(Handler {
                ident,
                sig,
                roles: kept,
            });
        }
    }
}

/// The impl-level companions found on the impl.
#[derive(Default)]
pub(crate) struct Companions {
    pub(crate) checkpoint: Option<CheckpointArgs>,
    pub(crate) retry: Option<RetryArgs>,
    pub(crate) restart: Option<RestartArgs>,
}

fn v<T>(s: Option<Spanned<T>>) -> Option<T> {
    s.map(|s| s.value)
}

impl Companions {
    fn checkpoint(&self) -> Checkpoint {
        let Some(c) = &self.checkpoint else {
            return Checkpoint::default();
        };
        Checkpoint {
            save_every_n: v(c.save_every_n.clone()),
            save_interval_secs: v(c.save_interval_secs.clone()),
            start_position: v(c.start_position.clone()),
            start_position_span: c.start_position.as_ref().map(|s| s.span),
            on_history_lost: v(c.on_history_lost.clone()),
            resume_strategy: v(c.resume_strategy.clone()),
        }
    }

    fn retry(&self) -> Retry {
        let Some(r) = &self.retry else {
            return Retry::default();
        };
        Retry {
            max_attempts: v(r.max_attempts.clone()),
            initial_delay_ms: v(r.initial_delay_ms.clone()),
            multiplier: v(r.multiplier.clone()),
            max_delay_ms: v(r.max_delay_ms.clone()),
            jitter: v(r.jitter.clone()),
        }
    }

    fn restart(&self) -> Restart {
        let Some(r) = &self.restart else {
            return Restart::default();
        };
        Restart {
            max_attempts: v(r.max_attempts.clone()),
            initial_delay_ms: v(r.initial_delay_ms.clone()),
            max_delay_ms: v(r.max_delay_ms.clone()),
        }
    }
}

/// A method carrying at least one of our attributes.
struct Method {
    ident: Ident,
    sig: syn::Signature,
    roles: Vec<RoleAttr>,
}

/// Strips every method attribute off the impl's items, reporting those on items that are not
/// methods, and returns the marked methods.
fn collect_methods(cx: &Ctxt, item: &mut ItemImpl) -> Vec<Method> {
    let mut out = Vec::new();
    for it in &mut item.items {
        match it {
            ImplItem::Fn(f) => {
                let roles = take_roles(cx, &mut f.attrs);
                if !roles.is_empty() {
                    out.push(Method {
                        ident: f.sig.ident.clone(),
                        sig: f.sig.clone(),
                        roles,
                    });
                }
            }
            ImplItem::Const(c) => misplaced(cx, take_roles(cx, &mut c.attrs)),
            ImplItem::Type(t) => misplaced(cx, take_roles(cx, &mut t.attrs)),
            ImplItem::Macro(m) => misplaced(cx, take_roles(cx, &mut m.attrs)),
            _ => {}
        }
    }
    out
}

fn misplaced(cx: &Ctxt, roles: Vec<RoleAttr>) {
    for r in roles {
        cx.error_at(
            r.span,
            format!("#[{}] goes on a method (`fn`) of this impl", r.role.name()),
        );
    }
}

/// Checks the impl's header; returns the type's last ident and its display name.
fn self_type(cx: &Ctxt, item: &ItemImpl) -> Option<(Ident, String)> {
    let mut ok = true;
    if let Some((_, path, _)) = &item.trait_ {
        cx.error_spanned_by(
            path,
            "#[change_stream] goes on an inherent impl (`impl MyStream { .. }`), not on a trait impl: it writes the `StreamHandler` impl itself",
        );
        ok = false;
    }
    if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
        cx.error_spanned_by(
            &item.generics,
            "#[change_stream] needs a concrete type: a generic impl cannot be registered (each stream is one registered type); write the impl for a concrete type, e.g. a type alias or a newtype",
        );
        ok = false;
    }
    if let Some(u) = &item.unsafety {
        cx.error_spanned_by(u, "#[change_stream] impls cannot be `unsafe`");
        ok = false;
    }
    let path = match &*item.self_ty {
        Type::Path(p) if p.qself.is_none() => &p.path,
        other => {
            cx.error_spanned_by(
                other,
                "#[change_stream] needs a named type: `impl MyStream { .. }`",
            );
            return None;
        }
    };
    let last = path.segments.last()?;
    if !last.arguments.is_empty() && item.generics.params.is_empty() {
        cx.error_spanned_by(
            &last.arguments,
            "#[change_stream] needs a type without generic arguments: a stream is one registered type",
        );
        ok = false;
    }
    let name = path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::");
    ok.then(|| (last.ident.clone(), name))
}
