//! flowwarden: declared, supervised MongoDB change-stream handlers.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

extern crate self as flowwarden;

pub mod matcher;
