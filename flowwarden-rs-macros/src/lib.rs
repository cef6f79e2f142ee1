//! Attribute macros of flowwarden-rs. Use them through the `flowwarden` crate.
//!
//! Placeholder: the real parse → validate → generate pipeline replaces this.

use proc_macro::TokenStream;

macro_rules! passthrough {
    ($($name:ident),*) => {$(
        /// See the `flowwarden` crate's documentation.
        #[proc_macro_attribute]
        pub fn $name(_args: TokenStream, item: TokenStream) -> TokenStream {
            item
        }
    )*};
}

passthrough!(
    change_stream,
    checkpoint,
    retry,
    restart,
    on_insert,
    on_update,
    on_delete,
    on_replace,
    on_change,
    on_error,
    pipeline,
    filter
);
