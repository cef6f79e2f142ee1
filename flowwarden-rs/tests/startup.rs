//! Startup validation: every problem is reported at once, before anything starts.

use flowwarden::{change_stream, ChangeContext, MemoryBackend};

#[derive(Default)]
struct First;

#[change_stream(name = "shared-name", collection = "a")]
impl First {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

#[derive(Default)]
struct Second;

#[change_stream(name = "shared-name", collection = "b")]
impl Second {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

/// Has no `Default`: needs an instance from the builder.
struct NeedsPool {
    _pool: u8,
}

#[change_stream(collection = "c")]
impl NeedsPool {
    #[on_delete]
    async fn deleted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

#[tokio::test]
async fn duplicate_names_and_missing_instances_are_reported_together() {
    let err = flowwarden::builder()
        .backend(MemoryBackend::new())
        .start()
        .await
        .err()
        .expect("startup must fail");
    let text = err.to_string();
    assert_eq!(err.problems.len(), 2, "{text}");
    assert!(
        text.contains("two streams are named 'shared-name'"),
        "{text}"
    );
    assert!(text.contains("First") && text.contains("Second"), "{text}");
    assert!(
        text.contains("stream 'needs-pool'"),
        "kebab-case default name: {text}"
    );
    assert!(
        text.contains("builder().stream("),
        "says what to do: {text}"
    );
}

#[tokio::test]
async fn an_instance_from_the_builder_satisfies_a_stream_without_default() {
    let rt = flowwarden::builder()
        .backend(MemoryBackend::new())
        .only(["needs-pool"])
        .stream(NeedsPool { _pool: 1 })
        .start()
        .await
        .expect("starts");
    assert_eq!(rt.handle().streams().len(), 1);
    rt.shutdown().await;
}

#[tokio::test]
async fn no_registered_stream_is_an_error_not_an_idle_process() {
    let err = flowwarden::builder()
        .discover(false)
        .backend(MemoryBackend::new())
        .start()
        .await
        .err()
        .expect("startup must fail");
    assert!(
        err.to_string().contains("no change stream is registered"),
        "{err}"
    );
}

#[tokio::test]
async fn only_with_an_unknown_name_is_reported() {
    let err = flowwarden::builder()
        .backend(MemoryBackend::new())
        .only(["nope"])
        .start()
        .await
        .err()
        .expect("startup must fail");
    assert!(err.to_string().contains("'nope'"), "{err}");
}

#[tokio::test]
async fn a_mongodb_uri_without_the_mongodb_backend_is_refused() {
    // This test binary does not link flowwarden-rs-mongo.
    std::env::set_var(
        flowwarden::port::MONGODB_URI_VAR,
        "mongodb://127.0.0.1:1/?replicaSet=rs0",
    );
    let err = flowwarden::builder()
        .only(["needs-pool"])
        .stream(NeedsPool { _pool: 1 })
        .start()
        .await
        .err();
    std::env::remove_var(flowwarden::port::MONGODB_URI_VAR);
    let err = err.expect("startup must fail");
    assert!(
        err.to_string().contains(flowwarden::port::MONGODB_URI_VAR),
        "{err}"
    );
}

#[tokio::test]
async fn a_checkpoint_guard_renewed_too_rarely_is_refused() {
    let err = flowwarden::builder()
        .backend(MemoryBackend::new())
        .only(["needs-pool"])
        .stream(NeedsPool { _pool: 1 })
        .checkpoint_guard(flowwarden::LeaseConfig {
            lease_secs: 10,
            renew_secs: 6,
            standby_poll_secs: 1,
        })
        .start()
        .await
        .err()
        .expect("startup must fail");
    assert!(err.to_string().contains("checkpoint_guard"), "{err}");
}
