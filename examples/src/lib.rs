//! Runnable examples of flowwarden-rs. The `orders` example lives here as a library so the
//! test suite runs exactly what `cargo run -p flowwarden-examples --bin orders` runs, on the
//! in-memory backend and through the real MongoDB driver. The benchmark suite of
//! docs/performance.md lives in [`mod@bench`], shared by the `bench_*` binaries. The `totals`
//! example ([`totals`]) shows a transactional stream (exactly-once effects).

pub mod bench;
pub mod orders;
pub mod totals;
