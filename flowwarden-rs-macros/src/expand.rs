//! The `#[change_stream]` pipeline: parse → validated model → code, with every error
//! collected and the user's impl always emitted.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Attribute, Item, ItemImpl, Meta};

use crate::attr::change_stream::ChangeStreamArgs;
use crate::attr::checkpoint::CheckpointArgs;
use crate::attr::method::attr_name;
use crate::attr::restart::RestartArgs;
use crate::attr::retry::RetryArgs;
use crate::codegen;
use crate::ctxt::Ctxt;
use crate::model::{Companions, Stream};
use crate::placement;
use crate::symbol;

/// Expands `#[change_stream(args)] item`.
pub(crate) fn change_stream(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut imp = match syn::parse2::<Item>(item)? {
        Item::Impl(imp) => imp,
        other => return Err(placement::not_an_impl(&other)),
    };

    let cx = Ctxt::new();
    let args = ChangeStreamArgs::parse(&cx, args);
    let krate = args
        .krate
        .as_ref()
        .map_or_else(|| syn::parse_quote!(::flowwarden), |k| k.value.clone());
    let document = args.document.clone();
    let companions = take_companions(&cx, &mut imp.attrs);
    let header_ok = imp.trait_.is_none() && imp.generics.params.is_empty();
    let model = Stream::from_ast(&cx, args, companions, &mut imp);

    Ok(match (cx.check(), model) {
        (Ok(()), Some(stream)) => {
            let generated = codegen::expand(&stream);
            quote!(#imp #generated)
        }
        (Err(errors), _) => {
            let dummy = if header_ok {
                codegen::dummy(&krate, &imp.self_ty, document.as_ref())
            } else {
                TokenStream::new()
            };
            let errors = errors.to_compile_error();
            quote!(#imp #dummy #errors)
        }
        (Ok(()), None) => unreachable!("a model is built whenever no error was reported"),
    })
}

/// Takes `#[checkpoint]`, `#[retry]`, `#[restart]` (and a repeated `#[change_stream]`) off the
/// impl's attributes and parses them.
fn take_companions(cx: &Ctxt, attrs: &mut Vec<Attribute>) -> Companions {
    let mut out = Companions::default();
    let mut taken = Vec::new();
    attrs.retain(|a| {
        let name = attr_name(a);
        match name.as_deref() {
            Some(n) if symbol::COMPANIONS.contains(&n) || n == symbol::CHANGE_STREAM => {
                taken.push(a.clone());
                false
            }
            _ => true,
        }
    });
    for attr in taken {
        let name = attr_name(&attr).unwrap_or_default();
        let moved = attr
            .path()
            .segments
            .first()
            .is_some_and(|s| s.ident == symbol::MOVED);
        if !moved && name != symbol::CHANGE_STREAM {
            // Leave the companion on the impl in its read form, so that rustc resolves its
            // path (the user's import of it counts as used) and it expands to nothing.
            let path = attr.path();
            let consumed = format_ident!("{}", symbol::CONSUMED);
            attrs.push(syn::parse_quote!(#[#path(#consumed)]));
        }
        let args = match &attr.meta {
            Meta::List(l) => l.tokens.clone(),
            Meta::Path(_) => TokenStream::new(),
            Meta::NameValue(nv) => {
                cx.error_spanned_by(
                    nv,
                    format!("write #[{name}(key = value, ..)], not #[{name} = ..]"),
                );
                continue;
            }
        };
        let twice = |cx: &Ctxt| {
            cx.error_spanned_by(
                attr.path(),
                format!("#[{name}] is written twice on this impl: merge the keys into one #[{name}(..)]"),
            );
        };
        match name.as_str() {
            symbol::CHECKPOINT => {
                let parsed = CheckpointArgs::parse(cx, args);
                if out.checkpoint.is_some() {
                    twice(cx);
                } else {
                    out.checkpoint = Some(parsed);
                }
            }
            symbol::RETRY => {
                let parsed = RetryArgs::parse(cx, args);
                if out.retry.is_some() {
                    twice(cx);
                } else {
                    out.retry = Some(parsed);
                }
            }
            symbol::RESTART => {
                let parsed = RestartArgs::parse(cx, args);
                if out.restart.is_some() {
                    twice(cx);
                } else {
                    out.restart = Some(parsed);
                }
            }
            _ => twice(cx),
        }
    }
    out
}

/// Whether `FLOWWARDEN_MACRO_DEBUG` asks for the expansions (set, and neither empty nor `0`).
pub(crate) fn debug_enabled() -> bool {
    std::env::var("FLOWWARDEN_MACRO_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Prints an expansion to stderr (see [`debug_enabled`]).
pub(crate) fn debug_print(imp_name: &str, tokens: &TokenStream) {
    eprintln!("// ----- flowwarden #[change_stream] expansion of `{imp_name}` -----");
    eprintln!("{tokens}");
}

/// The self type of an impl, for the debug header.
pub(crate) fn impl_name(item: &TokenStream) -> String {
    syn::parse2::<ItemImpl>(item.clone())
        .map(|i| {
            let ty = &i.self_ty;
            quote!(#ty).to_string()
        })
        .unwrap_or_else(|_| "item".to_owned())
}
