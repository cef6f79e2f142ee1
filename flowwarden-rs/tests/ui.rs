//! Compile-time behaviour of the attribute macros: every error kind has a case in
//! `tests/ui/fail` with its expected `.stderr`; `tests/ui/pass` must compile.
//!
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite cargo test -p flowwarden-rs --test ui`
//! (see docs/errors.md for the toolchain they were made with).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
