//! The MongoDB backend of flowwarden-rs.
//!
//! Not implemented yet: this crate builds so the workspace layout is complete. Until it lands,
//! `flowwarden::run()` uses the embedded in-memory backend. See the README for the status.
