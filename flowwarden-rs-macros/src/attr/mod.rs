//! Parsing of attribute arguments into typed values, one module per attribute.
//!
//! Every attribute takes a comma separated list of `key = value` (a bare `key` is accepted
//! for boolean keys and means `true`). Arguments are first split generically ([`Arg`]); each
//! attribute module then reads its keys through [`Keys`], which reports unknown and duplicate
//! keys, and the typed readers of [`value`], which report values of the wrong kind.

pub(crate) mod change_stream;
pub(crate) mod checkpoint;
pub(crate) mod method;
pub(crate) mod restart;
pub(crate) mod retry;
pub(crate) mod value;

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Ident, Token};

use crate::ctxt::Ctxt;
use crate::symbol;

/// One `key = value` (or bare `key`) argument.
pub(crate) struct Arg {
    /// The key, as written (keywords such as `crate` allowed).
    pub(crate) key: Ident,
    /// The value's tokens, `None` for a bare key.
    pub(crate) value: Option<TokenStream>,
}

impl Arg {
    /// The key as a string.
    pub(crate) fn name(&self) -> String {
        self.key.unraw().to_string()
    }

    /// The span of the value, or of the key when there is none.
    pub(crate) fn value_span(&self) -> Span {
        let Some(value) = &self.value else {
            return self.key.span();
        };
        let mut tokens = value.clone().into_iter();
        let first = tokens.next().map(|t| t.span());
        let last = tokens.last().map(|t| t.span());
        match (first, last) {
            (Some(a), Some(b)) => a.join(b).unwrap_or(a),
            (Some(a), None) => a,
            _ => self.key.span(),
        }
    }
}

/// Splits `args` into `key = value` pairs. A value runs to the next comma outside angle
/// brackets (so `document = Wrapper<A, B>` stays whole).
pub(crate) fn parse_args(args: TokenStream) -> syn::Result<Vec<Arg>> {
    let parser = |input: ParseStream<'_>| {
        let mut out = Vec::new();
        while !input.is_empty() {
            let key = Ident::parse_any(input)
                .map_err(|e| syn::Error::new(e.span(), "expected `key = value`"))?;
            let value = if input.peek(Token![=]) {
                let eq: Token![=] = input.parse()?;
                let value = value_tokens(input)?;
                if value.is_empty() {
                    return Err(syn::Error::new(
                        eq.span,
                        format!("`{key}` needs a value after `=`"),
                    ));
                }
                Some(value)
            } else {
                None
            };
            out.push(Arg { key, value });
            if input.is_empty() {
                break;
            }
            input
                .parse::<Token![,]>()
                .map_err(|e| syn::Error::new(e.span(), "expected `,` between arguments"))?;
        }
        Ok(out)
    };
    parser.parse2(args)
}

fn value_tokens(input: ParseStream<'_>) -> syn::Result<TokenStream> {
    input.step(|cursor| {
        let mut rest = *cursor;
        let mut out = TokenStream::new();
        let mut depth = 0usize;
        while let Some((tt, next)) = rest.token_tree() {
            if let TokenTree::Punct(p) = &tt {
                match p.as_char() {
                    ',' if depth == 0 => break,
                    '<' => depth += 1,
                    '>' => depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
            out.extend([tt]);
            rest = next;
        }
        Ok((out, rest))
    })
}

/// Reads the keys of one attribute: reports unknown keys (listing the valid ones, with a
/// migration hint when the spelling is known) and duplicate keys (on the second occurrence).
pub(crate) struct Keys<'a> {
    cx: &'a Ctxt,
    attr: &'static str,
    valid: &'static [&'static str],
    seen: Vec<String>,
}

impl<'a> Keys<'a> {
    /// A reader for `#[attr(..)]` whose keys are `valid`.
    pub(crate) fn new(cx: &'a Ctxt, attr: &'static str, valid: &'static [&'static str]) -> Self {
        Self {
            cx,
            attr,
            valid,
            seen: Vec::new(),
        }
    }

    /// The valid key `arg` names, or `None` (reported) when it is unknown or repeated.
    pub(crate) fn accept(&mut self, arg: &Arg) -> Option<&'static str> {
        let name = arg.name();
        let Some(key) = self.valid.iter().copied().find(|k| *k == name) else {
            let attr = self.attr;
            let valid = symbol::list(self.valid);
            let msg = match symbol::unknown_key_hint(attr, &name, self.valid) {
                Some(hint) => format!(
                    "unknown key `{name}` in #[{attr}(..)]: {hint}\nvalid keys are: {valid}"
                ),
                None => format!("unknown key `{name}` in #[{attr}(..)]; valid keys are: {valid}"),
            };
            self.cx.error_at(arg.key.span(), msg);
            return None;
        };
        if self.seen.iter().any(|s| s == key) {
            self.cx.error_at(
                arg.key.span(),
                format!(
                    "duplicate key `{key}` in #[{}(..)]: it is already set; keep one",
                    self.attr
                ),
            );
            return None;
        }
        self.seen.push(key.to_owned());
        Some(key)
    }
}

/// Parses `args` of `#[attr(..)]`, reporting a malformed list; an empty list on failure.
pub(crate) fn args_or_report(cx: &Ctxt, args: TokenStream) -> Vec<Arg> {
    match parse_args(args) {
        Ok(args) => args,
        Err(e) => {
            cx.syn_error(e);
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn splits_pairs_and_keeps_generic_values_whole() {
        let args = parse_args(quote!(crate = "fw", document = Wrapper<A, B>, jitter, n = 5))
            .expect("parses");
        let keys: Vec<String> = args.iter().map(Arg::name).collect();
        assert_eq!(keys, ["crate", "document", "jitter", "n"]);
        assert_eq!(
            args[1].value.as_ref().unwrap().to_string(),
            "Wrapper < A , B >"
        );
        assert!(args[2].value.is_none());
    }

    #[test]
    fn a_missing_value_is_an_error_and_a_missing_comma_joins_values() {
        assert!(parse_args(quote!(n =)).is_err());
        assert!(parse_args(quote!(= 5)).is_err());
        // Without the comma the value runs on; the typed reader then rejects it.
        let args = parse_args(quote!(a = 1 b = 2)).expect("parses");
        assert_eq!(args.len(), 1);
        assert_eq!(args[0].value.as_ref().unwrap().to_string(), "1 b = 2");
    }

    #[test]
    fn keys_report_unknown_and_duplicate() {
        let cx = Ctxt::new();
        let mut keys = Keys::new(&cx, "retry", crate::symbol::RETRY_KEYS);
        let args = parse_args(quote!(max_attempts = 1, max_attempts = 2, backoff_ms = 3)).unwrap();
        let accepted: Vec<Option<&str>> = args.iter().map(|a| keys.accept(a)).collect();
        assert_eq!(accepted, [Some("max_attempts"), None, None]);
        let err = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>();
        assert!(
            err[0].starts_with("duplicate key `max_attempts`"),
            "{err:?}"
        );
        assert!(err[1].contains("renamed to `initial_delay_ms`"), "{err:?}");
    }
}
