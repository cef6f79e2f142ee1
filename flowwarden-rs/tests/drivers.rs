//! Backend drivers: how a runtime without an explicit backend finds one. The builder's drivers
//! come first, then the installed ones, then the registered ones, then the in-memory backend.
//! One test function: installing a driver is global to the process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use bson::doc;
use flowwarden::port::{BackendDriver, ProvidedBackend};
use flowwarden::{AnyStream, Backend, MemoryBackend, StreamState};
use flowwarden_testkit::{probe_def, wait_status_within, wait_until_within, Probe};

/// Answers with every problem it "found".
struct Refusing;

impl BackendDriver for Refusing {
    fn name(&self) -> &'static str {
        "refusing"
    }
    fn configure(&self) -> ProvidedBackend {
        Box::pin(async { Some(Err(vec!["refusing: the store URL is malformed".into()])) })
    }
}

/// Never asked for by the environment.
struct Silent;

impl BackendDriver for Silent {
    fn name(&self) -> &'static str {
        "silent"
    }
    fn configure(&self) -> ProvidedBackend {
        Box::pin(async { None })
    }
}

/// Provides one shared in-memory backend, so the test can write to what the runtime reads.
struct Providing;

fn provided() -> &'static MemoryBackend {
    static BACKEND: OnceLock<MemoryBackend> = OnceLock::new();
    BACKEND.get_or_init(MemoryBackend::new)
}

impl BackendDriver for Providing {
    fn name(&self) -> &'static str {
        "providing"
    }
    fn configure(&self) -> ProvidedBackend {
        Box::pin(async { Some(Ok(Backend::from(provided().clone()))) })
    }
}

/// Registered through the macro; answers only once the test switches it on.
struct Registered;

static REGISTERED_ANSWERS: AtomicBool = AtomicBool::new(false);

impl BackendDriver for Registered {
    fn name(&self) -> &'static str {
        "registered"
    }
    fn configure(&self) -> ProvidedBackend {
        Box::pin(async {
            REGISTERED_ANSWERS
                .load(Ordering::SeqCst)
                .then(|| Err(vec!["registered driver answered".into()]))
        })
    }
}

static REFUSING: Refusing = Refusing;
static SILENT: Silent = Silent;
static PROVIDING: Providing = Providing;
static REGISTERED: Registered = Registered;

flowwarden::register_backend_driver!(REGISTERED);

fn builder(probe: &Probe, name: &'static str) -> flowwarden::Builder {
    flowwarden::builder()
        .discover(false)
        .any_stream(AnyStream::with_definition(
            probe.clone(),
            probe_def(name, 10, |_| {}),
        ))
        .max_await(Duration::from_millis(100))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_are_consulted_in_order_and_their_problems_stop_the_start() {
    let bound = Duration::from_secs(10);

    // A builder's driver that answers with problems stops the start, listing them.
    let err = builder(&Probe::default(), "refused")
        .driver(&REFUSING)
        .start()
        .await
        .err()
        .expect("a driver's problems stop the start");
    assert!(
        err.problems.iter().any(|p| p.contains("malformed")),
        "{err}"
    );

    // A driver the environment does not ask for is passed over: the in-memory fallback runs.
    let rt = builder(&Probe::default(), "fallback")
        .driver(&SILENT)
        .start()
        .await
        .expect("falls back to the in-memory backend");
    wait_status_within(&rt, "fallback", bound, |s| s.state == StreamState::Running).await;
    rt.shutdown().await;

    // A registered driver is consulted when nothing else answers.
    REGISTERED_ANSWERS.store(true, Ordering::SeqCst);
    let err = builder(&Probe::default(), "registered")
        .start()
        .await
        .err()
        .expect("the registered driver answered with a problem");
    assert!(
        err.problems.iter().any(|p| p.contains("registered driver")),
        "{err}"
    );

    // An installed driver comes before the registered one, and its backend is the one used.
    flowwarden::port::install_driver(&PROVIDING);
    let probe = Probe::default();
    let rt = builder(&probe, "installed")
        .start()
        .await
        .expect("the installed driver's backend");
    wait_status_within(&rt, "installed", bound, |s| s.state == StreamState::Running).await;
    provided()
        .collection("orders")
        .insert_one(doc! {"_id": 1})
        .expect("insert");
    wait_until_within(
        "the event on the driver's backend is handled",
        bound,
        || probe.successes().len() == 1,
    )
    .await;
    rt.shutdown().await;

    // The builder's own driver comes before the installed one.
    let err = builder(&Probe::default(), "builder-first")
        .driver(&REFUSING)
        .start()
        .await
        .err()
        .expect("the builder's driver answered first");
    assert!(
        err.problems.iter().any(|p| p.contains("malformed")),
        "{err}"
    );

    // An explicit backend bypasses every driver.
    let rt = builder(&Probe::default(), "explicit")
        .driver(&REFUSING)
        .backend(MemoryBackend::new())
        .start()
        .await
        .expect("an explicit backend needs no driver");
    rt.shutdown().await;
}
