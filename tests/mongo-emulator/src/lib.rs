//! A wire-level emulator of a MongoDB replica-set primary (test infrastructure, not MongoDB).
