//! MongoDB query-document matching, projection and update operators, written once and shared
//! by the in-memory backend and the wire-level emulator.
