//! Operating the server: a graceful shutdown on SIGTERM that answers the request in flight, the
//! request timeout, the body limit, the OpenAPI document, and Diom's error body for a wrong
//! method (`/metrics` has a test binary of its own: metrics.rs).

mod common;

use std::convert::Infallible;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::Request;
use common::{call, json, tokens, ALICE};
use futures_util::stream;
use idem_core::MemoryStore;
use idem_server::{App, Config, OPENAPI_PATH};
use idem_test_support::free_port;
use serde_json::{json as j, Value};

fn memory_app(config: Config) -> App {
    App::new(Arc::new(MemoryStore::new()), tokens(), config, None).unwrap()
}

fn error_body(bytes: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(bytes).unwrap();
    assert!(
        v["type"].is_string() && v["code"].is_string() && v["detail"].is_string(),
        "{v}"
    );
    assert!(v.as_object().unwrap().contains_key("location"));
    v
}

#[tokio::test(start_paused = true)]
async fn a_stalled_request_is_answered_503_at_the_timeout() {
    let app = memory_app(Config {
        request_timeout: Duration::from_secs(2),
        ..Config::default()
    });
    let stalled = Request::post("/api/v1.idempotency.start")
        .header("authorization", format!("Bearer {ALICE}"))
        .header("content-type", "application/json")
        // A body whose bytes never come: a client that stalls.
        .body(Body::from_stream(stream::pending::<
            Result<Bytes, Infallible>,
        >()))
        .unwrap();
    let (status, _, body) = call(&app, stalled).await;
    assert_eq!(status, 503);
    assert_eq!(error_body(&body)["code"], "timeout");
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_declared_or_not() {
    let app = memory_app(Config {
        max_body_bytes: 64,
        ..Config::default()
    });
    let big = serde_json::to_vec(
        &j!({"key": "k", "lock_period_ms": 1000, "fingerprint": "f".repeat(100)}),
    )
    .unwrap();
    // Declared in Content-Length: refused before the body is read.
    let declared = Request::post("/api/v1.idempotency.start")
        .header("authorization", format!("Bearer {ALICE}"))
        .header("content-type", "application/json")
        .header("content-length", big.len())
        .body(Body::from(big.clone()))
        .unwrap();
    let (status, _, body) = call(&app, declared).await;
    assert_eq!(status, 413);
    assert_eq!(error_body(&body)["type"], "invalid-input");
    // Not declared (chunked): the read stops at the limit.
    let streamed = Request::post("/api/v1.idempotency.start")
        .header("authorization", format!("Bearer {ALICE}"))
        .header("content-type", "application/json")
        .body(Body::from(big))
        .unwrap();
    let (status, _, body) = call(&app, streamed).await;
    assert_eq!(status, 413);
    assert_eq!(error_body(&body)["code"], "payload_too_large");
    // Nothing was claimed.
    let (_, _, body) = call(
        &app,
        json(
            "/api/v1.idempotency.start",
            Some(ALICE),
            j!({"key": "k", "lock_period_ms": 1000}),
        ),
    )
    .await;
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["status"],
        "started"
    );
}

#[tokio::test]
async fn a_wrong_method_and_an_unknown_route_get_diom_error_bodies() {
    let app = memory_app(Config::default());
    let get = Request::get("/api/v1.idempotency.start")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = call(&app, get).await;
    assert_eq!(
        (status, error_body(&body)["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
    let (status, _, body) = call(&app, json("/api/v1.idempotency.nope", Some(ALICE), j!({}))).await;
    assert_eq!(
        (status, error_body(&body)["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[tokio::test]
async fn the_openapi_document_names_every_route() {
    let app = memory_app(Config::default());
    let (status, content_type, body) = call(
        &app,
        Request::get(OPENAPI_PATH).body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!((status, content_type.as_str()), (200, "application/json"));
    let doc: Value = serde_json::from_slice(&body).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for route in [
        "/api/v1.idempotency.start",
        "/api/v1.idempotency.complete",
        "/api/v1.idempotency.abort",
        "/api/v1.idempotency.renew",
        "/api/v1.idempotency.get",
        "/api/v1.idempotency.evict",
        "/api/v1.idempotency.prune",
        "/api/v1.idempotency.steps.begin",
        "/api/v1.idempotency.steps.write",
        "/api/v1.idempotency.namespace.configure",
        "/api/v1.idempotency.namespace.get",
        "/api/v1.health.ping",
    ] {
        assert!(
            doc["paths"][route]["post"].is_object(),
            "{route} is missing"
        );
    }
}

/// SIGTERM stops the listener, answers the request in flight, closes the store and exits 0:
/// the SQLite file (created from a plain `sqlite://` URL, as the README's command gives it)
/// keeps the claim made in flight, and no `-wal` or `-shm` file stays beside it.
#[test]
fn sigterm_finishes_the_request_in_flight_closes_the_store_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", &addr, "--admin-token", common::ADMIN])
        .args(["--caller-token", &format!("alice={ALICE}")])
        .arg("--store")
        .arg(format!("sqlite://{}", db.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut server = idem_test_support::Process::new(child);
    // Bounded: up to 30 s for the server to listen.
    let mut conn = None;
    for _ in 0..300 {
        if let Ok(c) = std::net::TcpStream::connect(&addr) {
            conn = Some(c);
            break;
        }
        assert!(server.exited().is_none(), "the server exited at start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut conn = conn.expect("the server never listened");
    let body = br#"{"key":"in-flight","lock_period_ms":15000}"#;
    // `Expect: 100-continue`: the server says `100 Continue` when the handler starts reading the
    // body, so the test knows the request is in flight (accepted and handled) before SIGTERM.
    let head = format!(
        "POST /api/v1.idempotency.start HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ALICE}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nexpect: 100-continue\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut interim = Vec::new();
    let mut byte = [0u8; 1];
    // Bounded: the interim response is one short head.
    while !interim.ends_with(b"\r\n\r\n") && interim.len() < 1024 {
        conn.read_exact(&mut byte).unwrap();
        interim.push(byte[0]);
    }
    assert!(
        interim.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&interim)
    );
    conn.write_all(&body[..10]).unwrap();
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // Bounded: the listener closes within 10 s of the signal.
    let mut closed = false;
    for _ in 0..100 {
        if std::net::TcpStream::connect(&addr).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(closed, "the server still accepts connections after SIGTERM");
    conn.write_all(&body[10..]).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#"{"status":"started"}"#), "{answer}");
    let mut exited = None;
    for _ in 0..100 {
        exited = server.exited();
        if exited.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(exited
        .expect("the server did not exit after SIGTERM")
        .success());
    for leftover in ["idem.db-wal", "idem.db-shm"] {
        assert!(
            !dir.path().join(leftover).exists(),
            "{leftover} stayed behind after a clean stop"
        );
    }
    let in_progress = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = idem_sql::SqliteStore::builder()
            .pruner(None)
            .migrate_on_connect(false)
            .open(&db)
            .await
            .unwrap();
        let n: i64 = idem_sql::sqlx::query_scalar("SELECT count(*) FROM idem_records")
            .fetch_one(store.pool())
            .await
            .unwrap();
        store.close().await.unwrap();
        n
    });
    assert_eq!(in_progress, 1, "the claim made in flight is in the file");
}
