//! Shared support for the cross-crate tests.
