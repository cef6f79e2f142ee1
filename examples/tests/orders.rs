//! The orders example runs end to end — on the in-memory backend, and through the real
//! MongoDB driver against the project's wire-level emulator (not MongoDB).

use flowwarden::MemoryBackend;
use flowwarden_examples::orders::{run, Summary, Target};
use flowwarden_rs_mongo::MongoBackend;
use mongo_emulator::Emulator;

fn expected() -> Summary {
    Summary {
        run1_handled: 3,
        run1_dead_lettered: 1,
        run2_received: 2,
        revenue_cents: 4_200 + 1_000 + 700 + 300,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_runs_on_the_in_memory_backend() {
    let summary = run(Target::Memory(MemoryBackend::new()))
        .await
        .expect("example succeeds");
    assert_eq!(summary, expected());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_runs_through_the_mongodb_driver_against_the_emulator() {
    let emulator = Emulator::start().await.expect("emulator starts");
    let backend = MongoBackend::connect(&emulator.uri(), "example")
        .await
        .expect("connects");
    let summary = run(Target::Mongo(backend)).await.expect("example succeeds");
    assert_eq!(summary, expected());
}
