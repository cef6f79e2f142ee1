//! Expansions of the attributes `#[change_stream]` normally consumes, when rustc expands them
//! on their own: a companion written above `#[change_stream]` moves itself below it, and any
//! attribute in the wrong place becomes an error that says where it belongs.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, ToTokens};
use syn::spanned::Spanned;
use syn::{Attribute, Item};

use crate::attr::method::attr_name;
use crate::symbol;

/// The position of the `#[change_stream]` attribute among `attrs`.
fn change_stream_position(attrs: &[Attribute]) -> Option<usize> {
    attrs
        .iter()
        .position(|a| attr_name(a).as_deref() == Some(symbol::CHANGE_STREAM))
}

/// The span of an item's keyword (`struct`, `fn`, ..), for errors about the whole item.
pub(crate) fn item_span(item: &Item) -> Span {
    match item {
        Item::Struct(i) => i.struct_token.span,
        Item::Enum(i) => i.enum_token.span,
        Item::Fn(i) => i.sig.fn_token.span,
        Item::Trait(i) => i.trait_token.span,
        Item::Mod(i) => i.mod_token.span,
        Item::Impl(i) => i.impl_token.span,
        Item::Union(i) => i.union_token.span,
        Item::Type(i) => i.type_token.span,
        Item::Const(i) => i.const_token.span,
        Item::Static(i) => i.static_token.span,
        other => other.span(),
    }
}

/// `#[checkpoint]`, `#[retry]` or `#[restart]` expanded by rustc: it was written above
/// `#[change_stream]` (re-emit the impl with the companion moved below it, where
/// `#[change_stream]` reads it) or somewhere it does not belong (an error).
pub(crate) fn companion(
    name: &str,
    args: TokenStream,
    item: TokenStream,
) -> syn::Result<TokenStream> {
    if is_consumed_marker(&args) {
        return Ok(item);
    }
    let parsed: Item = syn::parse2(item)?;
    if let Item::Impl(mut imp) = parsed {
        if let Some(pos) = change_stream_position(&imp.attrs) {
            let moved = format_ident!("{}", symbol::MOVED);
            let ident = format_ident!("{}", name);
            let attr: Attribute = syn::parse_quote!(#[#moved::#ident(#args)]);
            imp.attrs.insert(pos + 1, attr);
            return Ok(imp.into_token_stream());
        }
    }
    Err(syn::Error::new(
        Span::call_site(),
        format!(
            "#[{name}(..)] belongs on an `impl` block marked #[change_stream(..)]: `#[change_stream(collection = \"...\")] #[{name}(..)] impl MyStream {{ .. }}`"
        ),
    ))
}

/// Whether `args` is the single marker `#[change_stream]` leaves on a companion it read.
fn is_consumed_marker(args: &TokenStream) -> bool {
    let mut iter = args.clone().into_iter();
    matches!(
        (iter.next(), iter.next()),
        (Some(proc_macro2::TokenTree::Ident(i)), None) if i == symbol::CONSUMED
    )
}

/// A method attribute expanded by rustc: no `#[change_stream]` consumed it, so it is outside
/// a `#[change_stream]` impl.
pub(crate) fn method_attr(name: &str, item: TokenStream) -> syn::Result<TokenStream> {
    let _ = item;
    Err(syn::Error::new(
        Span::call_site(),
        format!(
            "#[{name}] only works on a method of an `impl` block marked #[change_stream(..)], which reads and removes it: add `#[change_stream(collection = \"...\")]` above the `impl`"
        ),
    ))
}

/// `#[change_stream]` on something other than an impl block.
pub(crate) fn not_an_impl(item: &Item) -> syn::Error {
    syn::Error::new(
        item_span(item),
        "#[change_stream] goes on an `impl` block holding the handlers: `#[change_stream(collection = \"orders\")] impl MyStream { #[on_insert] async fn created(&self, ctx: &ChangeContext<Document>) { .. } }`",
    )
}

/// Emits `item` followed by `err` as `compile_error!`s.
pub(crate) fn with_error(item: TokenStream, err: syn::Error) -> TokenStream {
    let err = err.to_compile_error();
    quote!(#item #err)
}
