//! Typed readers for argument values. Each reports a value of the wrong kind at the value's
//! span, saying what was expected and how to write it, and returns `None`.

use proc_macro2::Span;
use syn::{Lit, Path, TypePath};

use super::Arg;
use crate::ctxt::Ctxt;
use crate::symbol;

/// A value with the span it was written at.
#[derive(Clone, Debug)]
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

impl<T> Spanned<T> {
    pub(crate) fn new(value: T, span: Span) -> Self {
        Self { value, span }
    }
}

/// What kind of value these tokens are, for "found ..." in messages.
fn describe(arg: &Arg) -> &'static str {
    let Some(tokens) = &arg.value else {
        return "no value";
    };
    match syn::parse2::<Lit>(tokens.clone()) {
        Ok(Lit::Str(_)) => "a string",
        Ok(Lit::Int(_)) => "an integer",
        Ok(Lit::Float(_)) => "a floating-point number",
        Ok(Lit::Bool(_)) => "a boolean",
        Ok(_) => "a literal",
        Err(_) => match syn::parse2::<syn::Ident>(tokens.clone()) {
            Ok(_) => "an identifier",
            Err(_) => match syn::parse2::<syn::Expr>(tokens.clone()) {
                Ok(syn::Expr::Unary(_)) => "a negative number",
                Ok(_) => "an expression",
                Err(_) => "something else",
            },
        },
    }
}

/// The literal a value is, when it is one.
fn literal(arg: &Arg) -> Option<Lit> {
    syn::parse2::<Lit>(arg.value.clone()?).ok()
}

fn wrong_kind(cx: &Ctxt, arg: &Arg, expected: &str, example: &str) {
    let key = arg.name();
    let found = describe(arg);
    let mut msg = format!("`{key}` expects {expected}, found {found}: write `{key} = {example}`");
    // A quoted number or boolean: show it unquoted.
    if let Some(Lit::Str(s)) = literal(arg) {
        let inner = s.value();
        let unquoted_fits = match expected {
            "an integer" => inner.trim().replace('_', "").parse::<u64>().is_ok(),
            "a number" => inner.trim().parse::<f64>().is_ok(),
            "`true` or `false`" => inner == "true" || inner == "false",
            _ => false,
        };
        if unquoted_fits {
            msg = format!(
                "`{key}` expects {expected}, found a string: remove the quotes, `{key} = {}`",
                inner.trim()
            );
        }
    }
    cx.error_at(arg.value_span(), msg);
}

fn needs_value(cx: &Ctxt, arg: &Arg, example: &str) {
    let key = arg.name();
    cx.error_at(
        arg.key.span(),
        format!("`{key}` needs a value: `{key} = {example}`"),
    );
}

/// A string literal.
pub(crate) fn string(cx: &Ctxt, arg: &Arg, example: &str) -> Option<Spanned<String>> {
    if arg.value.is_none() {
        needs_value(cx, arg, example);
        return None;
    }
    match literal(arg) {
        Some(Lit::Str(s)) => Some(Spanned::new(s.value(), s.span())),
        _ => {
            wrong_kind(cx, arg, "a string", example);
            None
        }
    }
}

/// A non-empty string literal.
pub(crate) fn non_empty_string(cx: &Ctxt, arg: &Arg, example: &str) -> Option<Spanned<String>> {
    let s = string(cx, arg, example)?;
    if s.value.trim().is_empty() {
        let key = arg.name();
        cx.error_at(
            s.span,
            format!("`{key}` must not be empty: `{key} = {example}`"),
        );
        return None;
    }
    Some(s)
}

/// A non-negative integer literal that fits `T`.
pub(crate) fn integer<T>(cx: &Ctxt, arg: &Arg, example: &str) -> Option<Spanned<T>>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    if arg.value.is_none() {
        needs_value(cx, arg, example);
        return None;
    }
    match literal(arg) {
        Some(Lit::Int(i)) => match i.base10_parse::<T>() {
            Ok(v) => Some(Spanned::new(v, i.span())),
            Err(e) => {
                cx.error_at(i.span(), format!("`{}` is out of range: {e}", arg.name()));
                None
            }
        },
        _ => {
            wrong_kind(cx, arg, "an integer", example);
            None
        }
    }
}

/// A number (integer or floating-point literal).
pub(crate) fn number(cx: &Ctxt, arg: &Arg, example: &str) -> Option<Spanned<f64>> {
    if arg.value.is_none() {
        needs_value(cx, arg, example);
        return None;
    }
    let parsed = match literal(arg) {
        Some(Lit::Float(f)) => f.base10_parse::<f64>().map(|v| (v, f.span())),
        Some(Lit::Int(i)) => i.base10_parse::<f64>().map(|v| (v, i.span())),
        _ => {
            wrong_kind(cx, arg, "a number", example);
            return None;
        }
    };
    match parsed {
        Ok((v, span)) if v.is_finite() => Some(Spanned::new(v, span)),
        Ok((_, span)) => {
            cx.error_at(span, format!("`{}` must be a finite number", arg.name()));
            None
        }
        Err(e) => {
            cx.syn_error(e);
            None
        }
    }
}

/// `true` or `false`; a bare key means `true`.
pub(crate) fn boolean(cx: &Ctxt, arg: &Arg) -> Option<Spanned<bool>> {
    if arg.value.is_none() {
        return Some(Spanned::new(true, arg.key.span()));
    }
    match literal(arg) {
        Some(Lit::Bool(b)) => Some(Spanned::new(b.value, b.span)),
        _ => {
            wrong_kind(cx, arg, "`true` or `false`", "true");
            None
        }
    }
}

/// A type path (`Order`, `crate::model::Order`).
pub(crate) fn type_path(cx: &Ctxt, arg: &Arg, example: &str) -> Option<TypePath> {
    let Some(tokens) = &arg.value else {
        needs_value(cx, arg, example);
        return None;
    };
    match syn::parse2::<TypePath>(tokens.clone()) {
        Ok(ty) if ty.qself.is_none() => Some(ty),
        _ => {
            let key = arg.name();
            let found = describe(arg);
            cx.error_at(
                arg.value_span(),
                format!(
                    "`{key}` expects a type path, found {found}: write `{key} = {example}` (no quotes)"
                ),
            );
            None
        }
    }
}

/// A path written as a string (`crate = "my_flowwarden"`).
pub(crate) fn path_in_string(cx: &Ctxt, arg: &Arg, example: &str) -> Option<Spanned<Path>> {
    let s = string(cx, arg, example)?;
    match syn::parse_str::<Path>(&s.value) {
        Ok(mut path) => {
            for seg in &mut path.segments {
                seg.ident.set_span(s.span);
            }
            if let Some(colon) = &mut path.leading_colon {
                colon.spans = [s.span, s.span];
            }
            Some(Spanned::new(path, s.span))
        }
        Err(_) => {
            cx.error_at(
                s.span,
                format!(
                    "`{}` expects a path such as {example}, found \"{}\"",
                    arg.name(),
                    s.value
                ),
            );
            None
        }
    }
}

/// One of a fixed set of values, written as an identifier (`Latest`) or a string
/// (`"latest"`); case and `_`/`-` are ignored when comparing.
pub(crate) fn choice<T: Copy>(
    cx: &Ctxt,
    arg: &Arg,
    choices: &[(&'static str, T)],
) -> Option<Spanned<T>> {
    let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
    let key = arg.name();
    let Some(tokens) = &arg.value else {
        needs_value(cx, arg, names[0]);
        return None;
    };
    let written = match literal(arg) {
        Some(Lit::Str(s)) => Some(s.value()),
        Some(_) => None,
        None => syn::parse2::<syn::Ident>(tokens.clone())
            .ok()
            .map(|i| i.to_string()),
    };
    let span = arg.value_span();
    match written {
        Some(w) => {
            let norm = symbol::normalize(&w);
            match choices.iter().find(|(n, _)| symbol::normalize(n) == norm) {
                Some((_, v)) => Some(Spanned::new(*v, span)),
                None => {
                    cx.error_at(
                        span,
                        format!(
                            "invalid value `{w}` for `{key}`: expected one of {}",
                            symbol::list(&names)
                        ),
                    );
                    None
                }
            }
        }
        None => {
            let found = describe(arg);
            cx.error_at(
                span,
                format!(
                    "`{key}` expects one of {}, found {found}",
                    symbol::list(&names)
                ),
            );
            None
        }
    }
}
