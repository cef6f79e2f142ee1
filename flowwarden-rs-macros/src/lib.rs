//! Attribute macros of flowwarden-rs. Use them through the `flowwarden` crate.
