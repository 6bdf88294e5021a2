//! The HTTP layer's behaviour, written once and run against every store.

use std::sync::Arc;
use std::time::Duration;

use idem_core::http::Problem;
use idem_core::{Idempotency, OnLocked, Store};
use reqwest::Method;

use crate::server::{quoted, record_key, spawn_many, within, Reply, Server};

pub async fn retry_replays_identical_response(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let first = server
        .post("/payments", Some("k-1"), r#"{"amount":5}"#)
        .await;
    let again = server
        .post("/payments", Some("k-1"), r#"{"amount":5}"#)
        .await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert!(again.replayed());
    assert_eq!(again.status, first.status);
    assert_eq!(again.headers_unmarked(), first.headers);
    assert_eq!(again.body, first.body);
    assert_eq!(
        first
            .headers
            .iter()
            .filter(|(n, _)| n == "set-cookie")
            .count(),
        2
    );
    assert_eq!(server.runs(), 1);
}

pub async fn concurrent_duplicates_fail_fast(store: Arc<dyn Store>) {
    let mut server = Server::start(store, |b| b.on_locked(OnLocked::FailFast)).await;
    let mut replies = spawn_many(50, || Box::pin(server.post("/hold", Some("k-storm"), "{}")));
    within("the first request to run", server.entered.recv()).await;
    // The first request is held in its handler, so every other one must be refused now.
    for _ in 0..49 {
        let reply = within("a refused duplicate", replies.join_next())
            .await
            .unwrap()
            .unwrap();
        let problem = reply.problem(409);
        assert_eq!(problem["type"], Problem::KeyInFlight.type_uri());
        let retry_after: u64 = reply.header("retry-after").unwrap().parse().unwrap();
        assert!(retry_after >= 1);
    }
    server.release(1);
    let winner = within("the first request", replies.join_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(winner.status, 201);
    assert!(!winner.replayed());
    assert_eq!(server.runs(), 1);
}

pub async fn concurrent_duplicates_wait(store: Arc<dyn Store>) {
    let mut server = Server::start(store, |b| {
        b.on_locked(OnLocked::Wait {
            timeout: Duration::from_secs(60),
        })
    })
    .await;
    let mut replies = spawn_many(50, || Box::pin(server.post("/hold", Some("k-wait"), "{}")));
    within("the first request to run", server.entered.recv()).await;
    for _ in 0..50 {
        within("every request to arrive", server.arrivals.recv()).await;
    }
    server.release(1);
    let mut all = Vec::new();
    while let Some(reply) = within("a response", replies.join_next()).await {
        all.push(reply.unwrap());
    }
    assert_eq!(all.len(), 50);
    assert_eq!(all.iter().filter(|r| !r.replayed()).count(), 1);
    for reply in &all {
        assert_eq!(reply.status, 201);
        assert_eq!(reply.body, all[0].body);
    }
    assert_eq!(server.runs(), 1);
}

pub async fn changed_request_is_422(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let first = server
        .post("/payments", Some("k-2"), r#"{"amount":5}"#)
        .await;
    assert_eq!(first.status, 201);
    let changed = server
        .post("/payments", Some("k-2"), r#"{"amount":6}"#)
        .await;
    let problem = changed.problem(422);
    assert_eq!(problem["type"], Problem::KeyReused.type_uri());
    assert_eq!(problem["title"], Problem::KeyReused.title());
    let other_path = server.post("/flaky", Some("k-2"), r#"{"amount":5}"#).await;
    other_path.problem(422);
    assert_eq!(server.runs(), 1);
    // The original request still replays.
    let again = server
        .post("/payments", Some("k-2"), r#"{"amount":5}"#)
        .await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
}

pub async fn callers_are_independent(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let send = |caller: &'static str| {
        server.request(
            Method::POST,
            "/payments",
            &[&quoted("shared")],
            Some(caller),
            "{}",
        )
    };
    let alice = send("alice").await;
    let bob = send("bob").await;
    assert_eq!((alice.status, bob.status), (201, 201));
    assert!(!alice.replayed() && !bob.replayed());
    assert_eq!(alice.json()["caller"], "alice");
    assert_eq!(bob.json()["caller"], "bob");
    assert_ne!(alice.json()["id"], bob.json()["id"]);
    assert_eq!(server.runs(), 2);
    let alice_again = send("alice").await;
    let bob_again = send("bob").await;
    assert!(alice_again.replayed() && bob_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(bob_again.body, bob.body);
    assert_eq!(server.runs(), 2);
}

pub async fn bad_keys_are_400(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b.require_key(true)).await;
    let send = |keys: &[&str]| server.request(Method::POST, "/payments", keys, None, "{}");
    let missing = send(&[]).await.problem(400);
    assert_eq!(missing["type"], Problem::KeyMissing.type_uri());
    let long = quoted(&"k".repeat(256));
    let malformed: [&[&str]; 6] = [
        &["k-bare"],
        &["\"unterminated"],
        &["\"\""],
        &[&long],
        &["\"a\"", "\"a\""],
        &["\"tab\\x\""],
    ];
    for keys in malformed {
        let problem = send(keys).await.problem(400);
        assert_eq!(
            problem["type"],
            Problem::KeyMalformed.type_uri(),
            "{keys:?}"
        );
    }
    assert_eq!(server.runs(), 0);
    // The longest valid key, with parameters (ignored), runs.
    let longest = format!("{};v=1", quoted(&"k".repeat(255)));
    assert_eq!(send(&[&longest]).await.status, 201);
    // Unguarded methods ignore the header.
    let get = server
        .request(Method::GET, "/payments", &["k-bare"], None, "")
        .await;
    assert_eq!(get.status, 200);
    assert!(!get.replayed());
}

pub async fn bare_keys_when_accepted(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b.accept_bare_keys(true)).await;
    let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    let bare = server
        .request(Method::POST, "/payments", &[uuid], None, "{}")
        .await;
    let quoted_again = server
        .request(Method::POST, "/payments", &[&quoted(uuid)], None, "{}")
        .await;
    assert_eq!(bare.status, 201);
    assert!(quoted_again.replayed());
    assert_eq!(quoted_again.body, bare.body);
    assert_eq!(server.runs(), 1);
}

pub async fn optional_key_runs_unguarded(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let a = server.post("/payments", None, "{}").await;
    let b = server.post("/payments", None, "{}").await;
    assert_eq!((a.status, b.status), (201, 201));
    assert!(!b.replayed());
    assert_ne!(a.body, b.body);
    assert_eq!(server.runs(), 2);
}

pub async fn server_error_frees_key(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let failed = server.post("/flaky", Some("k-flaky"), "{}").await;
    assert_eq!(failed.status, 500);
    assert_eq!(failed.body, b"run 1");
    let retried = server.post("/flaky", Some("k-flaky"), "{}").await;
    assert_eq!(retried.status, 201);
    assert!(!retried.replayed());
    assert_eq!(retried.body, b"run 2");
    let replayed = server.post("/flaky", Some("k-flaky"), "{}").await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body, b"run 2");
    assert_eq!(server.runs(), 2);
}

/// A client that goes away after the handler began its side effect cannot cause a second run:
/// the handler runs on, detached from the connection, and the retry waits for it and replays.
pub async fn disconnect_runs_once_then_replays(store: Arc<dyn Store>) {
    let mut server = Server::start(store, |b| {
        b.on_locked(OnLocked::Wait {
            timeout: Duration::from_secs(10),
        })
    })
    .await;
    let client = tokio::spawn(server.post("/hold", Some("k-gone"), "{}"));
    within("the handler to start", server.entered.recv()).await;
    // The client goes away mid-request: its connection closes.
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    let retry = tokio::spawn(server.post("/hold", Some("k-gone"), "{}"));
    server.release(1);
    let retry = within("the retry", retry).await.unwrap();
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(retry.replayed());
    assert_eq!(retry.body, b"held payment 1");
    assert_eq!(server.runs(), 1, "the side effect happened once");
    assert!(
        server.dropped.try_recv().is_err(),
        "the handler was cancelled with its connection"
    );
}

/// The same in fail-fast mode: the retry while the handler still runs gets 409 with a short
/// `Retry-After`, and once it finished, the replay.
pub async fn disconnect_then_fail_fast_gets_409_then_replay(store: Arc<dyn Store>) {
    let mut server = Server::start(store.clone(), |b| b).await;
    let client = tokio::spawn(server.post("/hold", Some("k-gone"), "{}"));
    within("the handler to start", server.entered.recv()).await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    let busy = server.post("/hold", Some("k-gone"), "{}").await;
    busy.problem(409);
    assert_eq!(
        busy.header("retry-after"),
        Some("1"),
        "an estimate, not the lease"
    );
    server.release(1);
    // The detached handler stores its response; poll the record, bounded.
    let key = record_key("", "k-gone");
    within("the response to be stored", async {
        while !matches!(
            store.get(&key).await.unwrap().map(|r| r.state),
            Some(idem_core::RecordState::Completed(_))
        ) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let retry = server.post("/hold", Some("k-gone"), "{}").await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.body, b"held payment 1");
    assert_eq!(server.runs(), 1, "the side effect happened once");
    assert!(server.dropped.try_recv().is_err());
}

pub async fn oversized_body_is_413(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b.max_request_body(1024)).await;
    let big = "x".repeat(2048);
    let refused = server.post("/payments", Some("k-big"), &big).await;
    let problem = refused.problem(413);
    assert_eq!(problem["type"], Problem::BodyTooLarge.type_uri());
    assert_eq!(server.runs(), 0);
    assert!(server
        .store
        .get(&record_key("", "k-big"))
        .await
        .unwrap()
        .is_none());
    let small = server.post("/payments", Some("k-big"), "{}").await;
    assert_eq!(small.status, 201);
    assert!(!small.replayed());
    assert_eq!(server.runs(), 1);
}

/// A response too large to keep goes to the first client, and its retry gets a problem
/// response instead of a second run.
pub async fn oversized_response_is_not_run_again(store: Arc<dyn Store>) {
    let engine = Idempotency::builder(store.clone())
        .max_response_bytes(1024)
        .build()
        .unwrap();
    let server = Server::start_with(engine, store, |b| b).await;
    let first = server.post("/big", Some("k-large"), "{}").await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body.len(), 4096);
    let again = server.post("/big", Some("k-large"), "{}").await;
    let problem = again.problem(422);
    assert_eq!(problem["type"], Problem::ResponseNotRetained.type_uri());
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("max_response_bytes"),
        "{problem}"
    );
    assert_eq!(server.runs(), 1);
}

/// A response with trailers (every gRPC call) cannot be captured: the first client gets it, the
/// retry a problem response, and the handler runs once.
pub async fn response_with_trailers_is_not_run_again(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let first = server.post("/trailers", Some("k-grpc"), "{}").await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, b"run 1");
    let again = server.post("/trailers", Some("k-grpc"), "{}").await;
    let problem = again.problem(422);
    assert!(
        problem["detail"].as_str().unwrap().contains("trailers"),
        "{problem}"
    );
    assert_eq!(server.runs(), 1);
}

pub async fn completed_response_is_stored(store: Arc<dyn Store>) {
    let server = Server::start(store.clone(), |b| b).await;
    let first: Reply = server.post("/payments", Some("k-rec"), "{}").await;
    assert_eq!(first.status, 201);
    let record = store.get(&record_key("", "k-rec")).await.unwrap().unwrap();
    assert!(matches!(record.state, idem_core::RecordState::Completed(_)));
}
