//! The status page (`GET /` of the admin API) in a real headless Chromium, driven over WebDriver
//! (chromedriver, spoken to with hyper): a runtime on the in-memory backend with a running stream,
//! a failing one that produced a dead letter and a halted one; the page shows them (with the halt
//! and its runbook) and the dead letter, refuses a button without the token (showing the API's
//! message), stops the running stream and discards the dead letter with it. A screenshot is saved under `target/test-artifacts/status-page.png`.
//!
//! Needs `chromium` and `chromedriver` (Debian: `apt-get install chromium chromium-driver`;
//! `.ci/run` installs them); without them the test fails, it never skips.
#![cfg(feature = "admin")]

mod support;

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::doc;
use flowwarden::port::{DeadLetterQuery, DeadLetterStatus};
use flowwarden::{AnyStream, HandlerError, MemoryBackend, Runtime, StreamState};
use futures::FutureExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use support::*;

const TOKEN: &str = "t0k";
const CHROMIUM: &str = "/usr/bin/chromium";
const WAIT: Duration = Duration::from_secs(15);
/// The W3C WebDriver key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where a program is on `PATH`, if anywhere.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A chromedriver child process and, once created, its browser session; on drop the session is
/// deleted (which closes Chromium), chromedriver is killed and the profile directory removed.
struct Driver {
    child: Child,
    addr: SocketAddr,
    session: Option<String>,
    profile: PathBuf,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            // Blocking and minimal: drop may run during a panic, outside any async context.
            if let Ok(mut s) = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = write!(
                    s,
                    "DELETE /session/{session} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
                     Content-Length: 0\r\n\r\n",
                    self.addr
                );
                let _ = s.read_to_end(&mut Vec::new());
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Driver {
    /// Starts chromedriver on a free port and waits until it is ready.
    async fn start(chromedriver: &Path) -> Self {
        let port = free_port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", chromedriver.display()));
        let profile = std::env::temp_dir().join(format!(
            "flowwarden-status-page-{}-{port}",
            std::process::id()
        ));
        let driver = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            session: None,
            profile,
            client: Client::builder(TokioExecutor::new()).build_http(),
        };
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(status) = driver.try_call(Method::GET, "/status", None).await {
                if status["value"]["ready"] == true {
                    return driver;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver not ready in {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn try_call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&bytes)))?;
        if status.is_success() {
            Ok(value)
        } else {
            Err(format!("{status}: {value}"))
        }
    }

    /// A WebDriver command; panics on an error answer.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let what = format!("{method} {path}");
        match self.try_call(method, path, body).await {
            Ok(v) => v["value"].clone(),
            Err(e) => panic!("WebDriver {what}: {e}"),
        }
    }

    fn session_path(&self, rest: &str) -> String {
        format!(
            "/session/{}{rest}",
            self.session.as_deref().expect("a session")
        )
    }

    /// Opens headless Chromium.
    async fn open_browser(&mut self) {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,900",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("--user-data-dir={}", self.profile.display())])
        .collect::<Vec<_>>();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args}
        }}});
        let value = self.call(Method::POST, "/session", Some(caps)).await;
        let id = value["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("a session id in {value}"));
        self.session = Some(id.to_owned());
    }

    async fn navigate(&self, url: &str) {
        let path = self.session_path("/url");
        self.call(Method::POST, &path, Some(json!({"url": url})))
            .await;
    }

    /// Runs `script` in the page with `args`; its return value.
    async fn script(&self, script: &str, args: Value) -> Value {
        let path = self.session_path("/execute/sync");
        self.call(
            Method::POST,
            &path,
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// The text of the element `selector` matches, `None` when nothing matches.
    async fn text_of(&self, selector: &str) -> Option<String> {
        let v = self
            .script(
                "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
                json!([selector]),
            )
            .await;
        v.as_str().map(str::to_owned)
    }

    async fn attribute_of(&self, selector: &str, name: &str) -> Option<String> {
        let v = self
            .script(
                "const e = document.querySelector(arguments[0]); \
                 return e ? e.getAttribute(arguments[1]) : null;",
                json!([selector, name]),
            )
            .await;
        v.as_str().map(str::to_owned)
    }

    async fn element(&self, selector: &str) -> String {
        let path = self.session_path("/element");
        let v = self
            .call(
                Method::POST,
                &path,
                Some(json!({"using": "css selector", "value": selector})),
            )
            .await;
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("an element for {selector}: {v}"))
            .to_owned()
    }

    /// Clicks the element `selector` matches, as a user would.
    async fn click(&self, selector: &str) {
        let element = self.element(selector).await;
        let path = self.session_path(&format!("/element/{element}/click"));
        self.call(Method::POST, &path, Some(json!({}))).await;
    }

    /// Types `text` into the element `selector` matches.
    async fn type_into(&self, selector: &str, text: &str) {
        let element = self.element(selector).await;
        let path = self.session_path(&format!("/element/{element}/value"));
        self.call(Method::POST, &path, Some(json!({"text": text})))
            .await;
    }

    /// A PNG of the viewport.
    async fn screenshot(&self) -> Vec<u8> {
        let path = self.session_path("/screenshot");
        let v = self.call(Method::GET, &path, None).await;
        base64_decode(v.as_str().expect("base64 screenshot"))
    }
}

/// Standard base64 (with padding, as WebDriver sends it).
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c:#x}"),
        }
    };
    let clean: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// Polls `check` until it returns `true`, for at most [`WAIT`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {WAIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where the screenshot goes: `target/test-artifacts/` of the workspace.
fn artifact_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            manifest.parent().unwrap_or(manifest).join("target")
        });
    target.join("test-artifacts")
}

/// A runtime with a running stream (`healthy`), a failing one (`failing`) that dead-lettered one
/// event, both on the `orders` collection, and a halted one (`scarred`), with the admin API on a
/// free port and the token.
async fn runtime(backend: &MemoryBackend, healthy: &Probe) -> Runtime {
    let failing = Probe::new(|_| async { Err(HandlerError::msg("payment service down")) }.boxed());
    let failing_def = def("failing", |d| d.retry.max_attempts = 1);
    // A checkpoint that is not a token: `scarred` halts at startup (CorruptCheckpoint).
    backend.put_checkpoint_document(
        "scarred",
        doc! {"_id": "scarred", "lastSeenToken": 42, "updatedAt": bson::DateTime::now()},
    );
    let scarred_def = def("scarred", |_| {});
    // `stuck` never finishes its first event: behind, no progress, stalled after 1 s.
    let stuck = stalling_on(1, Arc::new(tokio::sync::Notify::new()));
    let stuck_def = def("stuck", |_| {});
    let rt = start_with(backend, healthy, def("healthy", |_| {}), |b| {
        b.admin("127.0.0.1:0".parse().unwrap())
            .admin_token(TOKEN)
            .any_stream(AnyStream::with_definition(failing, failing_def))
            .any_stream(AnyStream::with_definition(Probe::default(), scarred_def))
            .any_stream(AnyStream::with_definition(stuck, stuck_def))
            .lag_sampling(flowwarden::LagConfig {
                interval: Duration::from_millis(200),
                stall_after: Duration::from_secs(1),
                headroom_warn_fraction: 0.2,
            })
    })
    .await;
    wait_status(&rt, "scarred", |s| s.halt.is_some()).await;
    wait_status(&rt, "failing", |s| s.state == StreamState::Running).await;
    insert_ids(backend, [1]);
    wait_status(&rt, "failing", |s| s.counters.dead_lettered == 1).await;
    wait_status(&rt, "healthy", |s| s.counters.handled == 1).await;
    rt
}

#[tokio::test]
async fn the_status_page_shows_the_streams_and_dead_letters_and_its_buttons_work() {
    let chromedriver = on_path("chromedriver");
    assert!(
        Path::new(CHROMIUM).is_file() && chromedriver.is_some(),
        "the status page test needs {CHROMIUM} and chromedriver on PATH: \
         apt-get install chromium chromium-driver"
    );
    let backend = MemoryBackend::new();
    let healthy = Probe::default();
    let rt = runtime(&backend, &healthy).await;
    let handle = rt.handle();
    let dead = handle
        .dead_letters()
        .list(&DeadLetterQuery::default())
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    let id = dead[0].id.clone();
    let addr = handle.admin_addr().expect("admin API served");

    let mut driver = Driver::start(&chromedriver.unwrap()).await;
    driver.open_browser().await;
    driver.navigate(&format!("http://{addr}/")).await;

    // Both streams, their states and counters, and the pending dead letter.
    let row = format!("[data-testid=\"dl-{id}\"]");
    eventually(
        "the page shows both streams and the dead letter",
        || async {
            driver
                .attribute_of("[data-testid=\"state-healthy\"]", "data-state")
                .await
                .as_deref()
                == Some("running")
                && driver.text_of(&row).await.is_some()
        },
    )
    .await;
    assert_eq!(
        driver
            .attribute_of("[data-testid=\"state-failing\"]", "data-state")
            .await
            .as_deref(),
        Some("running")
    );
    assert_eq!(
        driver
            .attribute_of("[data-testid=\"state-scarred\"]", "data-state")
            .await
            .as_deref(),
        Some("stopped")
    );
    let halt = driver
        .text_of("[data-testid=\"halt-scarred\"]")
        .await
        .unwrap_or_default();
    assert!(
        halt.starts_with("CorruptCheckpoint: ") && halt.contains("scarred"),
        "{halt}"
    );
    assert_eq!(
        driver
            .text_of("[data-testid=\"runbook-scarred\"]")
            .await
            .as_deref(),
        Some("docs/runbooks/corrupt-checkpoint.md")
    );
    // Lag: the healthy stream is caught up with its headroom shown; the stuck one is shown
    // stalled, with its runbook.
    eventually("the lag columns and the stall are shown", || async {
        driver
            .text_of("[data-testid=\"lag-healthy\"]")
            .await
            .as_deref()
            == Some("caught up")
            && driver
                .attribute_of("[data-testid=\"state-stuck\"]", "data-stalled")
                .await
                .as_deref()
                == Some("true")
    })
    .await;
    let headroom = driver
        .text_of("[data-testid=\"headroom-healthy\"]")
        .await
        .unwrap_or_default();
    assert!(headroom.contains(" of "), "{headroom}");
    assert_eq!(
        driver
            .text_of("[data-testid=\"state-stuck\"]")
            .await
            .as_deref(),
        Some("stalled")
    );
    assert_eq!(
        driver
            .text_of("[data-testid=\"runbook-stuck\"]")
            .await
            .as_deref(),
        Some("docs/runbooks/stalled.md")
    );
    let healthy_row = driver
        .text_of("[data-testid=\"stream-healthy\"]")
        .await
        .unwrap();
    assert!(
        !healthy_row.contains("never"),
        "a last event: {healthy_row}"
    );
    let dl = driver.text_of(&row).await.unwrap();
    assert!(
        dl.contains("failing") && dl.contains("insert") && dl.contains("payment service down"),
        "{dl}"
    );
    assert_eq!(
        driver
            .text_of("[data-testid=\"dl-count-failing\"]")
            .await
            .as_deref(),
        Some("failing: 1")
    );

    // Without the token the API refuses, and the page says why.
    driver.click("[data-testid=\"stop-healthy\"]").await;
    eventually("the page shows the 401", || async {
        driver
            .text_of("[data-testid=\"message\"]")
            .await
            .is_some_and(|m| m.contains("401") && m.contains("unauthorized"))
    })
    .await;
    assert_eq!(
        handle.status("healthy").unwrap().state,
        StreamState::Running
    );

    // With it, stop.
    driver.type_into("[data-testid=\"token\"]", TOKEN).await;
    driver.click("[data-testid=\"stop-healthy\"]").await;
    eventually("healthy stopped on the page and in the runtime", || async {
        driver
            .attribute_of("[data-testid=\"state-healthy\"]", "data-state")
            .await
            .as_deref()
            == Some("stopped")
            && handle.status("healthy").unwrap().state == StreamState::Stopped
    })
    .await;
    let stored = driver
        .script(
            "return sessionStorage.getItem('flowwarden.adminToken');",
            json!([]),
        )
        .await;
    assert_eq!(stored, TOKEN, "the token is kept in sessionStorage");

    // The page with a stopped stream, a running one and a pending dead letter.
    let png = driver.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    let dir = artifact_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("status-page.png");
    std::fs::write(&path, &png).unwrap();
    println!("status page screenshot: {}", path.display());

    // Discard the dead letter.
    driver
        .click(&format!("[data-testid=\"discard-{id}\"]"))
        .await;
    eventually(
        "the dead letter gone from the page and discarded in the store",
        || async {
            let on_page = driver.text_of(&row).await.is_some();
            let record = handle.dead_letters().get(&id).await.unwrap();
            !on_page && record.is_some_and(|r| r.status == DeadLetterStatus::Discarded)
        },
    )
    .await;

    drop(driver);
    rt.shutdown().await;
}
