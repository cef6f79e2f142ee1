//! Method attributes (`#[on_insert]`, `#[filter]`, ..): recognised by the last segment of
//! their path, taken off the method, and turned into [`Role`]s.

use proc_macro2::Span;
use syn::{Attribute, Meta};

use crate::ctxt::Ctxt;
use crate::symbol::*;

/// What a method attribute makes of its method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    OnInsert,
    OnUpdate,
    OnDelete,
    OnReplace,
    OnChange,
    Pipeline,
    Filter,
    OnError,
    Key,
}

impl Role {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            ON_INSERT => Role::OnInsert,
            ON_UPDATE => Role::OnUpdate,
            ON_DELETE => Role::OnDelete,
            ON_REPLACE => Role::OnReplace,
            ON_CHANGE => Role::OnChange,
            PIPELINE => Role::Pipeline,
            FILTER => Role::Filter,
            ON_ERROR => Role::OnError,
            KEY => Role::Key,
            _ => return None,
        })
    }

    /// The attribute's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::OnInsert => ON_INSERT,
            Role::OnUpdate => ON_UPDATE,
            Role::OnDelete => ON_DELETE,
            Role::OnReplace => ON_REPLACE,
            Role::OnChange => ON_CHANGE,
            Role::Pipeline => PIPELINE,
            Role::Filter => FILTER,
            Role::OnError => ON_ERROR,
            Role::Key => KEY,
        }
    }

    /// Whether the method handles events (as opposed to a pipeline, filter, error hook or key).
    pub(crate) fn is_handler(self) -> bool {
        matches!(
            self,
            Role::OnInsert | Role::OnUpdate | Role::OnDelete | Role::OnReplace | Role::OnChange
        )
    }
}

/// One method attribute as written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RoleAttr {
    pub(crate) role: Role,
    /// The attribute's path, for errors about this attribute.
    pub(crate) span: Span,
}

/// The last segment of an attribute's path.
pub(crate) fn attr_name(attr: &Attribute) -> Option<String> {
    attr.path().segments.last().map(|s| s.ident.to_string())
}

/// Takes the method attributes off `attrs`, in the order written. Arguments are reported:
/// method attributes take none.
pub(crate) fn take_roles(cx: &Ctxt, attrs: &mut Vec<Attribute>) -> Vec<RoleAttr> {
    let mut roles = Vec::new();
    attrs.retain(|attr| {
        let Some(role) = attr_name(attr).as_deref().and_then(Role::from_name) else {
            return true;
        };
        if !matches!(attr.meta, Meta::Path(_)) {
            cx.error_spanned_by(
                &attr.meta,
                format!(
                    "#[{}] takes no arguments: write `#[{}]`",
                    role.name(),
                    role.name()
                ),
            );
        }
        let span = attr
            .path()
            .segments
            .last()
            .map_or_else(Span::call_site, |s| s.ident.span());
        roles.push(RoleAttr { role, span });
        false
    });
    roles
}
