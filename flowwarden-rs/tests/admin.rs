//! The HTTP admin API (feature `admin`) against a real runtime on the in-memory backend, over
//! real HTTP on 127.0.0.1 (port 0).
#![cfg(feature = "admin")]

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bson::doc;
use flowwarden::{AnyStream, HandlerError, MemoryBackend, Runtime, StreamState};
use futures::FutureExt;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use support::*;

const TOKEN: &str = "s3cret-token";

/// A small HTTP client for one admin server.
struct Api {
    addr: SocketAddr,
    client: Client<HttpConnector, Empty<Bytes>>,
}

/// One answer: status, content type, body.
struct Answer {
    status: StatusCode,
    content_type: String,
    www_authenticate: Option<String>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("JSON body ({e}): {}", self.body))
    }
}

impl Api {
    fn of(rt: &Runtime) -> Self {
        Self {
            addr: rt.handle().admin_addr().expect("admin API served"),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn call(&self, method: Method, path: &str, token: Option<&str>) -> Answer {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{}", self.addr, path));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = self
            .client
            .request(request.body(Empty::new()).unwrap())
            .await
            .expect("request answered");
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header("content-type").unwrap_or_default();
        let www_authenticate = header("www-authenticate");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            content_type,
            www_authenticate,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.call(Method::GET, path, None).await
    }

    async fn post(&self, path: &str, token: Option<&str>) -> Answer {
        self.call(Method::POST, path, token).await
    }
}

fn local0() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Starts `probe` as stream `name` with the admin API on a free port and `token`.
async fn serve(
    backend: &MemoryBackend,
    probe: &Probe,
    name: &'static str,
    f: impl FnOnce(&mut flowwarden::StreamDefinition),
    token: Option<&str>,
) -> Runtime {
    let token = token.map(str::to_owned);
    start_with(backend, probe, def(name, f), move |b| {
        let b = b.admin(local0());
        match token {
            Some(t) => b.admin_token(t),
            None => b,
        }
    })
    .await
}

#[tokio::test]
async fn live_and_ready_name_the_halted_stream_and_ignore_disabled_ones() {
    let backend = MemoryBackend::new();
    backend.put_checkpoint_document(
        "scarred",
        doc! {"_id": "scarred", "lastSeenToken": 42, "updatedAt": bson::DateTime::now()},
    );
    let healthy = Probe::default();
    let scarred = def("scarred", |_| {});
    let rt = start_with(&backend, &healthy, def("healthy", |_| {}), |b| {
        b.admin(local0())
            .any_stream(AnyStream::with_definition(Probe::default(), scarred))
    })
    .await;
    wait_status(&rt, "scarred", |s| s.halt.is_some()).await;
    let api = Api::of(&rt);

    let live = api.get("/health/live").await;
    assert_eq!(live.status, StatusCode::OK);
    assert_eq!(live.json()["status"], "live");

    let ready = api.get("/health/ready").await;
    assert_eq!(
        ready.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        ready.body
    );
    let body = ready.json();
    let streams = body["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 1, "only the halted stream is named: {body}");
    assert_eq!(streams[0]["name"], "scarred");
    assert_eq!(streams[0]["state"], "stopped");
    assert_eq!(streams[0]["halt_reason"], "CorruptCheckpoint");
    assert_eq!(streams[0]["runbook"], "docs/runbooks/corrupt-checkpoint.md");
    assert!(streams[0]["message"]
        .as_str()
        .is_some_and(|m| m.contains("scarred")));
    rt.shutdown().await;

    // A running stream beside a disabled one: ready.
    let disabled = def("disabled", |d| d.enabled = false);
    let rt = start_with(&backend, &healthy, def("healthy2", |_| {}), |b| {
        b.admin(local0())
            .any_stream(AnyStream::with_definition(Probe::default(), disabled))
    })
    .await;
    let api = Api::of(&rt);
    let ready = api.get("/health/ready").await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.body);
    assert_eq!(ready.json()["status"], "ready");
    rt.shutdown().await;
}

#[tokio::test]
async fn streams_are_listed_shown_stopped_and_started_with_the_token() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = serve(&backend, &probe, "orders", |_| {}, Some(TOKEN)).await;
    insert_ids(&backend, [1, 2]);
    wait_until("both handled", || probe.successes().len() == 2).await;
    let api = Api::of(&rt);

    let list = api.get("/streams").await;
    assert_eq!(list.status, StatusCode::OK);
    let list = list.json();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["name"], "orders");

    let one = api.get("/streams/orders").await.json();
    assert_eq!(one["state"], "running");
    assert_eq!(one["collection"], "orders");
    assert_eq!(one["database"], Value::Null);
    assert_eq!(one["deployment"]["mode"], "all_instances");
    assert_eq!(one["counters"]["received"], 2);
    assert_eq!(one["counters"]["handled"], 2);
    assert_eq!(one["halt"], Value::Null);
    assert!(one["last_event_at"].as_str().is_some(), "{one}");

    let stopped = api.post("/streams/orders/stop", Some(TOKEN)).await;
    assert_eq!(stopped.status, StatusCode::OK, "{}", stopped.body);
    assert_eq!(stopped.json()["state"], "stopped");
    assert_eq!(
        rt.handle().status("orders").unwrap().state,
        StreamState::Stopped
    );
    assert_eq!(api.get("/streams/orders").await.json()["state"], "stopped");
    let ready = api.get("/health/ready").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);

    let started = api.post("/streams/orders/start", Some(TOKEN)).await;
    assert_eq!(started.status, StatusCode::OK, "{}", started.body);
    wait_status(&rt, "orders", |s| s.state == StreamState::Running).await;
    assert_eq!(api.get("/streams/orders").await.json()["state"], "running");

    let restarted = api.post("/streams/orders/restart", Some(TOKEN)).await;
    assert_eq!(restarted.status, StatusCode::OK, "{}", restarted.body);
    wait_status(&rt, "orders", |s| s.state == StreamState::Running).await;
    insert_ids(&backend, [3]);
    wait_until("handled after the restart", || probe.successes().len() == 3).await;

    let unknown = api.get("/streams/nope").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json()["code"], "unknown_stream");
    assert_eq!(unknown.json()["stream"], "nope");
    let unknown = api.post("/streams/nope/stop", Some(TOKEN)).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json()["code"], "unknown_stream");
    rt.shutdown().await;
}

#[tokio::test]
async fn mutations_are_refused_without_a_configured_token_and_with_a_wrong_one() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = serve(&backend, &probe, "guarded", |_| {}, None).await;
    let api = Api::of(&rt);
    let refused = api.post("/streams/guarded/stop", Some("anything")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(refused.content_type.starts_with("application/json"));
    let body = refused.json();
    assert_eq!(body["code"], "token_not_configured");
    assert!(body["error"]
        .as_str()
        .is_some_and(|m| m.contains("FLOWWARDEN_ADMIN_TOKEN")));
    assert_eq!(
        rt.handle().status("guarded").unwrap().state,
        StreamState::Running
    );
    // Reads need no token.
    assert_eq!(api.get("/streams/guarded").await.status, StatusCode::OK);
    rt.shutdown().await;

    let rt = serve(&backend, &probe, "guarded2", |_| {}, Some(TOKEN)).await;
    let api = Api::of(&rt);
    for token in [None, Some("wrong"), Some("s3cret-toke")] {
        let refused = api.post("/streams/guarded2/stop", token).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(refused.json()["code"], "unauthorized");
        assert_eq!(refused.www_authenticate.as_deref(), Some("Bearer"));
    }
    // Refused before the stream is looked up: an unknown one is 401 too.
    let refused = api.post("/dead-letters/x/discard", None).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        rt.handle().status("guarded2").unwrap().state,
        StreamState::Running
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn dead_letters_are_listed_shown_replayed_and_discarded() {
    let backend = MemoryBackend::new();
    let failing = Arc::new(AtomicBool::new(true));
    let f = failing.clone();
    let probe = Probe::new(move |_| {
        let fail = f.load(Ordering::SeqCst);
        async move {
            if fail {
                Err(HandlerError::msg("payment service down"))
            } else {
                Ok(())
            }
        }
        .boxed()
    });
    let rt = serve(
        &backend,
        &probe,
        "payments",
        |d| d.retry.max_attempts = 1,
        Some(TOKEN),
    )
    .await;
    insert_ids(&backend, [1, 2]);
    wait_status(&rt, "payments", |s| s.counters.dead_lettered == 2).await;
    let api = Api::of(&rt);

    let list = api.get("/dead-letters").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    let list = list.json();
    let records = list.as_array().unwrap();
    assert_eq!(records.len(), 2, "{list}");
    let first = &records[0];
    assert_eq!(first["stream"], "payments");
    assert_eq!(first["status"], "pending");
    assert_eq!(first["operation_type"], "insert");
    assert_eq!(first["attempts"], 1);
    assert_eq!(first["document_key"], serde_json::json!({"_id": 1}));
    assert_eq!(
        first["event"]["fullDocument"],
        serde_json::json!({"_id": 1, "n": 1})
    );
    assert!(first["error_chain"][0]
        .as_str()
        .is_some_and(|e| e.contains("payment service down")));
    let id1 = first["id"].as_str().unwrap().to_owned();
    let id2 = records[1]["id"].as_str().unwrap().to_owned();

    let limited = api
        .get("/dead-letters?stream=payments&status=pending&limit=1")
        .await;
    assert_eq!(limited.json().as_array().map(Vec::len), Some(1));
    let other = api.get("/dead-letters?stream=elsewhere").await;
    assert_eq!(other.json().as_array().map(Vec::len), Some(0));

    let one = api.get(&format!("/dead-letters/{id1}")).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.body);
    assert_eq!(one.json()["id"], id1.as_str());
    let missing = api.get("/dead-letters/payments:FFFF").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json()["code"], "unknown_dead_letter");

    // The handler still fails: the replay is refused and the record stays pending.
    let replay = api
        .post(&format!("/dead-letters/{id1}/replay"), Some(TOKEN))
        .await;
    assert_eq!(replay.status, StatusCode::CONFLICT, "{}", replay.body);
    assert_eq!(replay.json()["code"], "replay_failed");
    assert_eq!(
        api.get(&format!("/dead-letters/{id1}")).await.json()["status"],
        "pending"
    );

    failing.store(false, Ordering::SeqCst);
    let replay = api
        .post(&format!("/dead-letters/{id1}/replay"), Some(TOKEN))
        .await;
    assert_eq!(replay.status, StatusCode::OK, "{}", replay.body);
    assert_eq!(replay.json()["status"], "replayed");
    assert_eq!(
        api.get(&format!("/dead-letters/{id1}")).await.json()["status"],
        "replayed"
    );
    assert!(probe.handled_keys().contains(&bson::Bson::Int32(1)));

    let discard = api
        .post(&format!("/dead-letters/{id2}/discard"), Some(TOKEN))
        .await;
    assert_eq!(discard.status, StatusCode::OK, "{}", discard.body);
    assert_eq!(
        api.get(&format!("/dead-letters/{id2}")).await.json()["status"],
        "discarded"
    );
    let pending = api.get("/dead-letters?status=pending").await.json();
    assert_eq!(pending.as_array().map(Vec::len), Some(0), "{pending}");
    let discarded = api.get("/dead-letters?status=discarded").await.json();
    assert_eq!(discarded[0]["id"], id2.as_str());

    let missing = api
        .post("/dead-letters/payments:FFFF/discard", Some(TOKEN))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    rt.shutdown().await;
}

#[tokio::test]
async fn malformed_requests_get_json_4xx_answers() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = serve(&backend, &probe, "strict", |_| {}, Some(TOKEN)).await;
    let api = Api::of(&rt);
    for query in [
        "limit=abc",
        "limit=0",
        "limit=-3",
        "status=bogus",
        "colour=blue",
    ] {
        let answer = api.get(&format!("/dead-letters?{query}")).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{query}: {}",
            answer.body
        );
        let body = answer.json();
        assert_eq!(body["code"], "bad_request", "{query}");
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    let no_route = api.get("/nowhere").await;
    assert_eq!(no_route.status, StatusCode::NOT_FOUND);
    assert_eq!(no_route.json()["code"], "no_route");
    let wrong_method = api.get("/streams/strict/stop").await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong_method.json()["code"], "method_not_allowed");
    let wrong_method = api.post("/streams", Some(TOKEN)).await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    rt.shutdown().await;
}

#[tokio::test]
async fn metrics_expose_the_runtime_counters_in_prometheus_text() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = serve(&backend, &probe, "metered", |_| {}, None).await;
    insert_ids(&backend, [1, 2, 3]);
    wait_until("handled", || probe.successes().len() == 3).await;
    let api = Api::of(&rt);
    let metrics = api.get("/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK, "{}", metrics.body);
    assert!(metrics.content_type.starts_with("text/plain"));
    let line = |name: &str| {
        metrics
            .body
            .lines()
            .find(|l| l.starts_with(name) && l.contains("stream=\"metered\""))
            .map(str::to_owned)
    };
    assert_eq!(
        line("flowwarden_events_received{").as_deref(),
        Some("flowwarden_events_received{stream=\"metered\"} 3"),
        "{}",
        metrics.body
    );
    assert!(
        line("flowwarden_events_handled{").is_some(),
        "{}",
        metrics.body
    );
    assert!(
        metrics
            .body
            .contains("# TYPE flowwarden_events_received counter"),
        "{}",
        metrics.body
    );
    rt.shutdown().await;
}

/// The path of a documented route with its parameters filled in.
fn concrete(path: &str) -> String {
    path.replace("{name}", "no-such-stream")
        .replace("{id}", "no-such-record")
}

#[tokio::test]
async fn openapi_documents_exactly_the_routes_the_router_serves() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = serve(&backend, &probe, "documented", |_| {}, Some(TOKEN)).await;
    let api = Api::of(&rt);
    let answer = api.get("/openapi.json").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.content_type.starts_with("application/json"));
    let doc = answer.json();
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    let listed: BTreeSet<(String, String)> = flowwarden::admin::routes()
        .iter()
        .map(|r| (r.method().to_owned(), r.path().to_owned()))
        .collect();
    assert_eq!(documented, listed);
    // Every documented operation is routed by the server (the fallback answers `no_route`, a
    // wrong method 405), and every mutating one documents its token.
    for (method, path) in &documented {
        let method: Method = method.parse().unwrap();
        let answer = api.call(method.clone(), &concrete(path), Some(TOKEN)).await;
        assert_ne!(
            answer.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        if answer.content_type.starts_with("application/json") {
            assert_ne!(answer.json()["code"], "no_route", "{method} {path}");
        }
        let op = &doc["paths"][path.as_str()][method.as_str().to_lowercase()];
        assert_eq!(
            op["security"].is_array(),
            method == Method::POST,
            "{method} {path}"
        );
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn the_admin_api_is_off_unless_asked_for_and_stops_with_the_runtime() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = start(&backend, &probe, def("quiet", |_| {})).await;
    if std::env::var_os("FLOWWARDEN_ADMIN_ADDR").is_none() {
        assert_eq!(rt.handle().admin_addr(), None);
    }
    rt.shutdown().await;

    let rt = serve(&backend, &probe, "served", |_| {}, None).await;
    let addr = rt.handle().admin_addr().unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 0);
    assert_eq!(
        Api::of(&rt).get("/health/live").await.status,
        StatusCode::OK
    );
    rt.shutdown().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed after shutdown"
    );
}

fn lag_sampling_fast() -> flowwarden::LagConfig {
    flowwarden::LagConfig {
        interval: std::time::Duration::from_millis(100),
        stall_after: std::time::Duration::from_secs(1),
        headroom_warn_fraction: 0.2,
    }
}

#[tokio::test]
async fn a_stalled_stream_is_not_ready_and_names_its_runbook_until_it_moves() {
    let backend = MemoryBackend::new();
    let gate = Arc::new(tokio::sync::Notify::new());
    let probe = stalling_on(2, gate.clone());
    let rt = start_with(&backend, &probe, def("stuck", |_| {}), |b| {
        b.admin(local0()).lag_sampling(lag_sampling_fast())
    })
    .await;
    insert_ids(&backend, [1]);
    wait_until("1 handled", || probe.successes().len() == 1).await;
    wait_status(&rt, "stuck", |s| {
        s.lag.as_ref().is_some_and(|l| l.caught_up)
    })
    .await;
    let api = Api::of(&rt);
    let ready = api.get("/health/ready").await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.body);
    let lag = &api.get("/streams/stuck").await.json()["lag"];
    assert_eq!(lag["known"], true, "{lag}");
    assert_eq!(lag["caught_up"], true, "{lag}");
    assert_eq!(lag["lag_seconds"], 0.0, "{lag}");

    // 2 blocks the handler; 3 is written 1.2 s later: behind, and no progress.
    insert_ids(&backend, [2]);
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    insert_ids(&backend, [3]);
    wait_status(&rt, "stuck", |s| s.lag.as_ref().is_some_and(|l| l.stalled)).await;
    let ready = api.get("/health/ready").await;
    assert_eq!(
        ready.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        ready.body
    );
    let body = ready.json();
    let entry = &body["streams"][0];
    assert_eq!(entry["name"], "stuck", "{body}");
    assert_eq!(entry["state"], "running", "{body}");
    assert_eq!(entry["stalled"], true, "{body}");
    assert_eq!(entry["runbook"], "docs/runbooks/stalled.md", "{body}");
    assert!(
        entry["message"]
            .as_str()
            .is_some_and(|m| m.contains("'stuck'") && m.contains("stalled")),
        "{body}"
    );
    let lag = &api.get("/streams/stuck").await.json()["lag"];
    assert_eq!(lag["stalled"], true, "{lag}");
    assert!(
        lag["lag_seconds"].as_f64().is_some_and(|l| l > 0.0),
        "{lag}"
    );
    assert_eq!(lag["caught_up"], false, "{lag}");
    assert!(lag["behind_since"].is_string(), "{lag}");

    gate.notify_one();
    wait_until("3 handled", || probe.successes().len() == 3).await;
    wait_status(&rt, "stuck", |s| s.lag.as_ref().is_some_and(|l| !l.stalled)).await;
    let ready = api.get("/health/ready").await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.body);
    rt.shutdown().await;
}

#[tokio::test]
async fn the_stream_schema_documents_every_field_the_api_serves() {
    let backend = MemoryBackend::new();
    let probe = Probe::default();
    let rt = start_with(&backend, &probe, def("described", |_| {}), |b| {
        b.admin(local0()).lag_sampling(lag_sampling_fast())
    })
    .await;
    insert_ids(&backend, [1]);
    wait_status(&rt, "described", |s| {
        s.lag.as_ref().is_some_and(|l| l.known)
    })
    .await;
    let api = Api::of(&rt);
    let doc = api.get("/openapi.json").await.json();
    let served = api.get("/streams/described").await.json();
    let documented = |schema: &str| -> BTreeSet<String> {
        doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("schema {schema}"))
            .keys()
            .cloned()
            .collect()
    };
    let keys = |v: &Value| -> BTreeSet<String> {
        v.as_object().expect("an object").keys().cloned().collect()
    };
    assert_eq!(keys(&served), documented("Stream"));
    assert_eq!(keys(&served["lag"]), documented("Lag"));
    assert_eq!(keys(&served["counters"]), documented("Counters"));
    wait_status(&rt, "described", |s| s.checkpoint.is_some()).await;
    let served = api.get("/streams/described").await.json();
    assert_eq!(keys(&served["checkpoint"]), documented("Checkpoint"));
    assert_eq!(
        keys(&served["checkpoint"]["last_seen"]),
        documented("Position")
    );
    assert!(
        served["checkpoint"]["last_seen"]["token"]["_data"].is_string(),
        "{served}"
    );
    rt.shutdown().await;
}
