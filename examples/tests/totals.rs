//! The totals example (a transactional stream) runs end to end — on the in-memory backend, and
//! through the real MongoDB driver against the project's wire-level emulator (not MongoDB).

use flowwarden::MemoryBackend;
use flowwarden_examples::orders::Target;
use flowwarden_examples::totals::{expected, run};
use flowwarden_rs_mongo::MongoBackend;
use mongo_emulator::Emulator;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_totals_example_runs_on_the_in_memory_backend() {
    let totals = run(Target::Memory(MemoryBackend::new()))
        .await
        .expect("example succeeds");
    assert_eq!(totals, expected());
    assert_eq!(totals.get("ada"), Some(&(3, 1_750)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_totals_example_runs_through_the_mongodb_driver_against_the_emulator() {
    let emulator = Emulator::start().await.expect("emulator starts");
    let backend = MongoBackend::connect(&emulator.uri(), "example")
        .await
        .expect("connects");
    let totals = run(Target::Mongo(backend)).await.expect("example succeeds");
    assert_eq!(totals, expected());
    assert!(emulator.transactions_committed() >= 8);
}
