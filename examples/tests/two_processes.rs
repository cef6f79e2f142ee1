//! Two separate processes of the `fulfilment` example (a `SingleLeader` stream) against the
//! MongoDB emulator started as a third process: one ships, one stands by; killing the leader
//! with SIGKILL hands the stream to the other, and no order is lost. About 10 s of real time.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::future::IntoFuture;

use bson::{doc, Document};

/// Kills the child when the test ends, whatever the path.
struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the process starts");
        let out = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().expect("lock").push(line);
            }
        });
        Proc { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lock").clone()
    }

    /// The orders this process shipped, in the order it shipped them.
    fn shipped(&self) -> Vec<i32> {
        self.lines()
            .iter()
            .filter_map(|l| l.strip_prefix("shipped order "))
            .filter_map(|l| l.split_whitespace().next())
            .filter_map(|n| n.parse().ok())
            .collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The emulator's binary, next to this test's (`cargo test --workspace` builds it); built on
/// demand when only this package's tests were built.
fn emulator_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target directory");
    let bin = dir.join(format!("mongo-emulator{}", std::env::consts::EXE_SUFFIX));
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "mongo-emulator", "--bin", "mongo-emulator"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the emulator failed");
    }
    bin
}

fn fulfilment(uri: &str, db: &str, id: &str) -> Proc {
    Proc::spawn(
        Command::new(env!("CARGO_BIN_EXE_fulfilment"))
            .env(flowwarden_rs_mongo::ENV_URI, uri)
            .env("FLOWWARDEN_DATABASE", db)
            .env("FLOWWARDEN_INSTANCE_ID", id)
            .env("RUST_LOG", "warn"),
    )
}

#[test]
fn two_processes_one_leader_and_a_takeover_after_sigkill() {
    let emulator = Proc::spawn(Command::new(emulator_binary()).args(["--port", "0"]));
    wait_until("the emulator's URI", 30, || !emulator.lines().is_empty());
    let uri = emulator.lines()[0].clone();
    assert!(uri.starts_with("mongodb://"), "{uri}");
    let db = "fulfilment_two_processes";

    let p1 = fulfilment(&uri, db, "p1");
    wait_until("p1 started", 30, || {
        p1.lines().iter().any(|l| l.contains("started"))
    });
    // Let p1 take the lease and open its stream before p2 exists, so the leader is known.
    std::thread::sleep(Duration::from_millis(1500));
    let p2 = fulfilment(&uri, db, "p2");
    wait_until("p2 started", 30, || {
        p2.lines().iter().any(|l| l.contains("started"))
    });

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let client = rt
        .block_on(mongodb::Client::with_uri_str(&uri))
        .expect("client");
    let orders = client.database(db).collection::<Document>("orders");
    let insert = |ids: std::ops::RangeInclusive<i32>| {
        rt.block_on(async {
            for i in ids {
                orders
                    .insert_one(doc! {"_id": i, "status": "PAID"})
                    .await
                    .expect("insert");
            }
        })
    };

    insert(1..=5);
    wait_until("p1 shipped 1..5", 30, || p1.shipped().len() >= 5);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(p1.shipped(), vec![1, 2, 3, 4, 5]);
    assert!(p2.shipped().is_empty(), "the standby ships nothing");

    let mut p1 = p1;
    p1.child.kill().expect("SIGKILL p1");
    let _ = p1.child.wait();
    let killed_at = Instant::now();
    insert(6..=10);
    wait_until("p2 took over and shipped 6..10", 30, || {
        let s = p2.shipped();
        (6..=10).all(|i| s.contains(&i))
    });
    let failover = killed_at.elapsed();
    let shipped = p2.shipped();
    assert!(
        shipped.windows(2).all(|w| w[0] < w[1]),
        "p2 ships in source order: {shipped:?}"
    );
    assert_eq!(
        shipped.first(),
        Some(&6),
        "p2 resumed after p1's checkpoint of 5: {shipped:?}"
    );
    println!("failover after SIGKILL: {failover:?} (lease 2 s + poll 1 s)");

    // A graceful stop (SIGTERM) flushes, then releases the lease at once.
    let mut p2 = p2;
    let status = Command::new("kill")
        .args(["-TERM", &p2.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let exit = p2.child.wait().expect("p2 exits");
    assert!(exit.success(), "p2 stops cleanly on SIGTERM: {exit:?}");
    let lease = rt
        .block_on(
            client
                .database(db)
                .collection::<Document>("_fw_locks")
                .find_one(doc! {"_id": "fulfilment"})
                .into_future(),
        )
        .expect("read lease")
        .expect("a lease document");
    assert_eq!(lease.get_str("owner"), Ok("p2"));
    assert_eq!(lease.get_i64("epoch"), Ok(2), "p1 took it first, p2 second");
    let expires = *lease.get_datetime("expiresAt").expect("expiresAt");
    assert!(expires <= bson::DateTime::now(), "released: {lease:?}");
}
