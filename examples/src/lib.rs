//! Examples of flowwarden-rs.
