//! `flowwarden::run()` / `builder().start()` pick the MongoDB backend from the environment
//! through the provider this crate registers. One test function: the environment is global
//! to the process.

mod support;

use std::time::Duration;

use bson::{doc, Document};
use flowwarden::AnyStream;
use mongo_emulator::Emulator;
use support::*;

// Linking caveat: a program must reference the crate for its provider to be linked.
use flowwarden_rs_mongo as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_selects_and_validates_the_mongodb_backend() {
    init_logs();
    let emu = Emulator::start().await.expect("emulator");

    // Unset: no MongoDB backend.
    std::env::remove_var(flowwarden_rs_mongo::ENV_URI);
    assert!(flowwarden_rs_mongo::backend_from_env().await.is_none());

    // Set: the runtime resolves the backend from the environment.
    std::env::set_var(flowwarden_rs_mongo::ENV_URI, emu.uri());
    std::env::set_var(flowwarden_rs_mongo::ENV_DATABASE, "envdb");
    let backend = flowwarden_rs_mongo::backend_from_env()
        .await
        .expect("configured")
        .expect("connects");
    assert_eq!(backend.database(), "envdb");
    let probe = Probe::default();
    let rt = flowwarden::builder()
        .discover(false)
        .any_stream(AnyStream::with_definition(
            probe.clone(),
            def("from-env", |_| {}),
        ))
        .max_await(Duration::from_millis(150))
        .start()
        .await
        .expect("starts on MongoDB from the environment");
    wait_status(&rt, "from-env", |s| {
        s.state == flowwarden::StreamState::Running
    })
    .await;
    let orders = backend
        .client()
        .database("envdb")
        .collection::<Document>("orders");
    orders.insert_one(doc! {"_id": 1}).await.expect("insert");
    wait_until("1 handled", || probe.successes().len() == 1).await;
    rt.shutdown().await;
    let stored = backend
        .client()
        .database("envdb")
        .collection::<Document>("_fw_checkpoints")
        .find_one(doc! {"_id": "from-env"})
        .await
        .expect("read");
    assert!(
        stored.is_some(),
        "the checkpoint went to envdb._fw_checkpoints on the emulator"
    );

    // A bad configuration is reported, every problem at once, before any stream starts.
    std::env::set_var(
        flowwarden_rs_mongo::ENV_URI,
        "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200&connectTimeoutMS=200",
    );
    std::env::set_var(flowwarden_rs_mongo::ENV_DATABASE, "bad.db");
    let err = flowwarden::builder()
        .discover(false)
        .any_stream(AnyStream::with_definition(
            Probe::default(),
            def("never", |_| {}),
        ))
        .start()
        .await
        .err()
        .expect("refused");
    assert_eq!(err.problems.len(), 2, "{err}");
    assert!(flowwarden_rs_mongo::builder_from_env().await.is_err());
    std::env::remove_var(flowwarden_rs_mongo::ENV_URI);
    std::env::remove_var(flowwarden_rs_mongo::ENV_DATABASE);
}
