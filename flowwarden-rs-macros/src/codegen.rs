//! Code generation from the validated [`Stream`] model: the `StreamHandler` impl, the static
//! definition and the `inventory` registration, all inside one `const _: () = { .. };`.
//!
//! Every path is absolute (`::core::..`) or goes through `<crate>::__private`, so names the
//! user's code shadows (`Result`, `Option`, `Vec`, ..) cannot change what the code means.
//! Calls into user methods carry the span of the user's return type, so rustc's type errors
//! (and the `on_unimplemented` hints of the runtime's traits) land on the user's code.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{Path, Type, TypePath};

use crate::model::{
    Collection, Deployment, FullDocument, FullDocumentBeforeChange, Handler, OnHistoryLost, Op,
    ResumeStrategy, StartPosition, Stream,
};
use crate::sig::ParamKind;

/// `<crate>::__private`.
fn private(krate: &Path) -> TokenStream {
    quote!(#krate::__private)
}

/// The stream's `Document` type.
fn document_type(krate: &Path, document: Option<&TypePath>) -> TokenStream {
    let p = private(krate);
    match document {
        Some(t) => quote!(#t),
        None => quote!(#p::bson::Document),
    }
}

/// Everything generated for a valid stream (the user's impl is emitted by the caller).
pub(crate) fn expand(s: &Stream) -> TokenStream {
    let p = private(&s.krate);
    let self_ty = &s.self_ty;
    let doc = document_type(&s.krate, s.document.as_ref());
    let definition = definition(s);
    let pipeline = pipeline(s);
    let filter = filter(s);
    let handle = handle(s);
    let on_error = on_error(s);
    let key = key(s);
    let transaction_types = transaction_types(s);
    quote! {
        const _: () = {
            #[automatically_derived]
            impl #p::StreamHandler for #self_ty {
                type Document = #doc;

                #definition
                #pipeline
                #filter
                #handle
                #on_error
                #key
                #transaction_types
            }

            #[doc(hidden)]
            fn __fw_build_default() -> ::core::option::Option<#p::AnyStream> {
                #[allow(unused_imports)]
                use #p::ViaDefault as _;
                #[allow(unused_imports)]
                use #p::ViaNothing as _;
                (&#p::DefaultProbe::<#self_ty>::new()).build()
            }

            #[doc(hidden)]
            fn __fw_type_id() -> ::core::any::TypeId {
                ::core::any::TypeId::of::<#self_ty>()
            }

            #p::inventory::submit! {
                #p::Registration {
                    definition: <#self_ty as #p::StreamHandler>::definition,
                    build_default: __fw_build_default,
                    type_id: __fw_type_id,
                }
            }
        };
    }
}

/// A placeholder `StreamHandler` impl emitted beside the errors of an invalid stream, so code
/// that uses the type as a stream does not fail a second time.
pub(crate) fn dummy(krate: &Path, self_ty: &Type, document: Option<&TypePath>) -> TokenStream {
    let p = private(krate);
    let doc = document_type(krate, document);
    quote! {
        const _: () = {
            #[automatically_derived]
            impl #p::StreamHandler for #self_ty {
                type Document = #doc;
                fn definition() -> &'static #p::StreamDefinition {
                    ::core::unreachable!("invalid #[change_stream]")
                }
                fn handle(
                    self: #p::std::sync::Arc<Self>,
                    _: #p::std::sync::Arc<#p::ChangeContext<Self::Document>>,
                ) -> ::core::option::Option<#p::HandlerFuture> {
                    ::core::unreachable!("invalid #[change_stream]")
                }
            }
        };
    }
}

fn opt_str(s: Option<&String>) -> TokenStream {
    match s {
        Some(v) => quote!(::core::option::Option::Some(#v)),
        None => quote!(::core::option::Option::None),
    }
}

/// `Struct { written fields, ..Struct::DEFAULT }` (no `..DEFAULT` when every field is written).
fn config(ty: TokenStream, fields: Vec<(&str, Option<TokenStream>)>) -> TokenStream {
    let total = fields.len();
    let written: Vec<TokenStream> = fields
        .into_iter()
        .filter_map(|(name, v)| {
            let name = format_ident!("{}", name);
            v.map(|v| quote!(#name: #v))
        })
        .collect();
    if written.len() == total {
        quote!(#ty { #(#written,)* })
    } else {
        quote!(#ty { #(#written,)* ..#ty::DEFAULT })
    }
}

fn definition(s: &Stream) -> TokenStream {
    let p = private(&s.krate);
    let self_ty = &s.self_ty;
    let name = &s.name;
    let type_name = &s.type_name;
    let database = opt_str(s.database.as_ref());
    let collection = match &s.collection {
        Collection::Named(c) => quote!(#c),
        Collection::FromDocument(t) => {
            let span = t.span();
            quote_spanned!(span=> <#t as #p::CollectionName>::COLLECTION)
        }
    };
    let full_document = match s.full_document {
        FullDocument::Default => quote!(Default),
        FullDocument::UpdateLookup => quote!(UpdateLookup),
        FullDocument::WhenAvailable => quote!(WhenAvailable),
        FullDocument::Required => quote!(Required),
    };
    let before_change = match s.full_document_before_change {
        FullDocumentBeforeChange::Off => quote!(Off),
        FullDocumentBeforeChange::WhenAvailable => quote!(WhenAvailable),
        FullDocumentBeforeChange::Required => quote!(Required),
    };
    let enabled = s.enabled;
    let auto_start = s.auto_start;

    let c = &s.checkpoint;
    let checkpoint = config(
        quote!(#p::CheckpointConfig),
        vec![
            ("save_every_n", c.save_every_n.map(lit_u32)),
            ("save_interval_secs", c.save_interval_secs.map(lit_u64)),
            (
                "start_position",
                c.start_position.map(|v| match v {
                    StartPosition::Resume => quote!(#p::StartPosition::Resume),
                    StartPosition::Latest => quote!(#p::StartPosition::Latest),
                    StartPosition::Snapshot => quote!(#p::StartPosition::Snapshot),
                }),
            ),
            (
                "on_history_lost",
                c.on_history_lost.map(|v| match v {
                    OnHistoryLost::Fail => quote!(#p::OnHistoryLost::Fail),
                    OnHistoryLost::ResumeFromOplogStart => {
                        quote!(#p::OnHistoryLost::ResumeFromOplogStart)
                    }
                    OnHistoryLost::ResumeFromNow => quote!(#p::OnHistoryLost::ResumeFromNow),
                }),
            ),
            (
                "resume_strategy",
                c.resume_strategy.map(|v| match v {
                    ResumeStrategy::ProcessedFirst => quote!(#p::ResumeStrategy::ProcessedFirst),
                    ResumeStrategy::SeenFirst => quote!(#p::ResumeStrategy::SeenFirst),
                }),
            ),
        ],
    );
    let r = &s.retry;
    let retry = config(
        quote!(#p::RetryConfig),
        vec![
            ("max_attempts", r.max_attempts.map(lit_u32)),
            ("initial_delay_ms", r.initial_delay_ms.map(lit_u64)),
            (
                "multiplier",
                r.multiplier.map(|m| {
                    let l = Literal::f64_suffixed(m);
                    quote!(#l)
                }),
            ),
            ("max_delay_ms", r.max_delay_ms.map(lit_u64)),
            ("jitter", r.jitter.map(|j| quote!(#j))),
        ],
    );
    let r = &s.restart;
    let restart = config(
        quote!(#p::RestartConfig),
        vec![
            ("max_attempts", r.max_attempts.map(lit_u32)),
            ("initial_delay_ms", r.initial_delay_ms.map(lit_u64)),
            ("max_delay_ms", r.max_delay_ms.map(lit_u64)),
        ],
    );
    let deployment = match &s.deployment {
        Deployment::AllInstances => quote!(#p::Deployment::AllInstances),
        Deployment::SingleLeader {
            lease_secs,
            renew_secs,
            standby_poll_secs,
        } => {
            let lease = config(
                quote!(#p::LeaseConfig),
                vec![
                    ("lease_secs", lease_secs.map(lit_u64)),
                    ("renew_secs", renew_secs.map(lit_u64)),
                    ("standby_poll_secs", standby_poll_secs.map(lit_u64)),
                ],
            );
            quote!(#p::Deployment::SingleLeader(#lease))
        }
    };
    let c = &s.concurrency;
    let concurrency = config(
        quote!(#p::ConcurrencyConfig),
        vec![
            ("concurrency", c.concurrency.map(lit_u32)),
            ("max_in_flight", c.max_in_flight.map(lit_u32)),
        ],
    );
    let _ = self_ty;
    let transactional = s.transactional.is_some();
    quote! {
        fn definition() -> &'static #p::StreamDefinition {
            static __FW_DEFINITION: #p::StreamDefinition = #p::StreamDefinition {
                name: #name,
                type_name: #type_name,
                database: #database,
                collection: #collection,
                full_document: #p::FullDocument::#full_document,
                full_document_before_change: #p::FullDocumentBeforeChange::#before_change,
                enabled: #enabled,
                auto_start: #auto_start,
                checkpoint: #checkpoint,
                retry: #retry,
                restart: #restart,
                deployment: #deployment,
                concurrency: #concurrency,
                transactional: #transactional,
                source: #p::SourceLocation {
                    file: ::core::file!(),
                    line: ::core::line!(),
                },
            };
            &__FW_DEFINITION
        }
    }
}

fn lit_u32(v: u32) -> TokenStream {
    let l = Literal::u32_suffixed(v);
    quote!(#l)
}

fn lit_u64(v: u64) -> TokenStream {
    let l = Literal::u64_suffixed(v);
    quote!(#l)
}

fn pipeline(s: &Stream) -> TokenStream {
    let Some(h) = &s.pipeline else {
        return TokenStream::new();
    };
    let p = private(&s.krate);
    let self_ty = &s.self_ty;
    let ident = &h.ident;
    let ret = &h.sig.ret;
    let span = ret.span();
    // The bound `#ret: PipelineStages` is checked on the user's return type.
    let convert = quote_spanned! {span=>
        <#ret as #p::PipelineStages>::into_stages(__fw_stages)
    };
    quote! {
        fn pipeline() -> #p::std::vec::Vec<#p::bson::Document> {
            let __fw_stages: #ret = <#self_ty>::#ident();
            #convert
        }
    }
}

fn filter(s: &Stream) -> TokenStream {
    let Some(h) = &s.filter else {
        return TokenStream::new();
    };
    let p = private(&s.krate);
    let self_ty = &s.self_ty;
    let ident = &h.ident;
    let span = h.sig.ret.span();
    let check = quote_spanned! {span=>
        let __fw_keep: ::core::primitive::bool = <#self_ty>::#ident(self, __fw_ctx);
    };
    quote! {
        fn filter(&self, __fw_ctx: &#p::ChangeContext<Self::Document>) -> ::core::primitive::bool {
            #check
            __fw_keep
        }
    }
}

fn on_error(s: &Stream) -> TokenStream {
    let Some(h) = &s.on_error else {
        return TokenStream::new();
    };
    let p = private(&s.krate);
    let self_ty = &s.self_ty;
    let ident = &h.ident;
    let span = h.sig.ret.span();
    let check = quote_spanned! {span=>
        let __fw_action: #p::ErrorAction = <#self_ty>::#ident(self, __fw_error, __fw_ctx);
    };
    quote! {
        fn on_error(
            &self,
            __fw_error: &#p::HandlerError,
            __fw_ctx: &#p::ChangeContext<Self::Document>,
        ) -> ::core::option::Option<#p::ErrorAction> {
            #check
            ::core::option::Option::Some(__fw_action)
        }
    }
}

fn key(s: &Stream) -> TokenStream {
    let Some(h) = &s.key else {
        return TokenStream::new();
    };
    let p = private(&s.krate);
    let self_ty = &s.self_ty;
    let ident = &h.ident;
    // The bound `#ret: Hash` is checked on the user's return type (through `EventKeyHash` and
    // its `on_unimplemented` hint). No type is written on `__fw_key`, so `impl Hash` and
    // borrowed keys work.
    let span = h.sig.ret.span();
    let hash = quote_spanned! {span=>
        #p::EventKeyHash::event_key_hash(&__fw_key)
    };
    quote! {
        fn key(
            &self,
            __fw_ctx: &#p::ChangeContext<Self::Document>,
        ) -> ::core::option::Option<::core::primitive::u64> {
            let __fw_key = <#self_ty>::#ident(self, __fw_ctx);
            ::core::option::Option::Some(#hash)
        }
    }
}

/// `transaction_types()`: the handle type of every `&Transaction` parameter, for the startup
/// check against the backend's.
fn transaction_types(s: &Stream) -> TokenStream {
    let p = private(&s.krate);
    let types: Vec<&Type> = s
        .handlers
        .iter()
        .flat_map(|h| h.sig.params.iter())
        .filter(|x| x.kind == ParamKind::Transaction)
        .map(|x| &x.ty)
        .collect();
    if types.is_empty() {
        return TokenStream::new();
    }
    quote! {
        fn transaction_types() -> #p::std::vec::Vec<#p::HandleType> {
            #p::std::vec![#(#p::HandleType::of::<#types>()),*]
        }
    }
}

/// The future (or blocking job) that runs handler `h` for the event in `__fw_ctx`.
fn invoke(s: &Stream, h: &Handler) -> TokenStream {
    let p = private(&s.krate);
    let self_ty = &s.self_ty;
    let ident = &h.ident;
    let fetch = h
        .sig
        .params
        .iter()
        .find(|x| matches!(x.kind, ParamKind::Document | ParamKind::OptionalDocument))
        .map(|x| {
            let getter = if x.kind == ParamKind::Document {
                quote!(document_owned)
            } else {
                quote!(document_owned_opt)
            };
            quote! {
                let __fw_doc = match #p::ChangeContext::#getter(&*__fw_ctx) {
                    ::core::result::Result::Ok(__fw_doc) => __fw_doc,
                    ::core::result::Result::Err(__fw_err) => {
                        return ::core::result::Result::Err(__fw_err);
                    }
                };
            }
        });
    // The bound `#ty: TransactionHandleType` is checked on the user's type.
    let fetch_tx = h
        .sig
        .params
        .iter()
        .find(|x| x.kind == ParamKind::Transaction)
        .map(|x| {
            let ty = &x.ty;
            let span = ty.span();
            quote_spanned! {span=>
                let __fw_tx: #ty = match #p::transaction_handle::<#ty, _>(&*__fw_ctx) {
                    ::core::result::Result::Ok(__fw_tx) => __fw_tx,
                    ::core::result::Result::Err(__fw_err) => {
                        return ::core::result::Result::Err(__fw_err);
                    }
                };
            }
        });
    let fetch = quote!(#fetch #fetch_tx);
    let args = h.sig.params.iter().map(|x| match x.kind {
        ParamKind::Context => quote!(&*__fw_ctx),
        ParamKind::Transaction => quote!(&__fw_tx),
        ParamKind::Document | ParamKind::OptionalDocument => quote!(__fw_doc),
    });
    let call = quote!(<#self_ty>::#ident(&*self, #(#args),*));
    let call = if h.sig.is_async {
        quote!(#call.await)
    } else {
        call
    };
    // The bound `#ret: IntoHandlerResult` is checked on the user's return type, so rustc's
    // error (with the trait's `on_unimplemented` hint) underlines it.
    let body = match &h.sig.ret {
        Some(ret) if !matches!(ret, Type::ImplTrait(_)) => {
            let span = ret.span();
            let convert = quote_spanned! {span=>
                <#ret as #p::IntoHandlerResult>::into_handler_result(__fw_ret)
            };
            quote! {
                let __fw_ret: #ret = #call;
                #convert
            }
        }
        other => {
            let span = other.as_ref().map_or_else(|| h.ident.span(), |t| t.span());
            let convert = quote_spanned! {span=>
                #p::IntoHandlerResult::into_handler_result(__fw_ret)
            };
            quote! {
                let __fw_ret = #call;
                #convert
            }
        }
    };
    if h.sig.is_async {
        quote! {
            #p::run_async(async move {
                #fetch
                #body
            })
        }
    } else {
        quote! {
            #p::run_blocking(move || {
                #fetch
                #body
            })
        }
    }
}

fn handle(s: &Stream) -> TokenStream {
    let p = private(&s.krate);
    let arms = Op::ALL.iter().filter_map(|op| {
        let h = s.handler_for(*op)?;
        let variant = match op {
            Op::Insert => quote!(Insert),
            Op::Update => quote!(Update),
            Op::Replace => quote!(Replace),
            Op::Delete => quote!(Delete),
        };
        let run = invoke(s, h);
        Some(quote! {
            #p::OperationType::#variant => ::core::option::Option::Some(#run),
        })
    });
    let rest = match s.catch_all() {
        Some(h) => {
            let run = invoke(s, h);
            quote!(_ => ::core::option::Option::Some(#run),)
        }
        None => quote!(_ => ::core::option::Option::None,),
    };
    quote! {
        fn handle(
            self: #p::std::sync::Arc<Self>,
            __fw_ctx: #p::std::sync::Arc<#p::ChangeContext<Self::Document>>,
        ) -> ::core::option::Option<#p::HandlerFuture> {
            match #p::ChangeContext::operation_type(&*__fw_ctx) {
                #(#arms)*
                #rest
            }
        }
    }
}
