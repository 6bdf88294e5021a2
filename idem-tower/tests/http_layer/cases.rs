//! The HTTP layer's behaviour, written once and run against every store.

use std::sync::Arc;
use std::time::Duration;

use idem::http::Problem;
use idem::{Idempotency, OnLocked, Store};
use reqwest::Method;

use idem::http::IdempotencyLayer;

use crate::server::{
    quoted, record_key, spawn_many, within, Headers, LayerServer, Reply, Server, CALLER,
};

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
    // Every header of the first response, in order and byte for byte, but its cookies: the
    // default `replay_headers` neither stores nor replays `Set-Cookie` (headers.rs has the rest).
    assert_eq!(cookies(&first), ["a=1", "session=client-1.1"]);
    let without_cookies: Vec<_> = first
        .headers
        .iter()
        .filter(|(n, _)| n != "set-cookie")
        .cloned()
        .collect();
    assert_eq!(again.headers_unmarked(), without_cookies);
    assert!(again.header("location").is_some() && again.header("x-run") == Some("1"));
    assert_eq!(again.body, first.body);
    assert_eq!(server.runs(), 1);
}

pub async fn concurrent_duplicates_fail_fast(store: Arc<dyn Store>) {
    let mut server = Server::start(store, |b| b.on_locked(OnLocked::FailFast)).await;
    let mut replies = spawn_many(50, || Box::pin(server.post("/hold", Some("k-storm"), "{}")));
    within("the first request to run", server.holds.entered.recv()).await;
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
    server.holds.release(1);
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
    within("the first request to run", server.holds.entered.recv()).await;
    for _ in 0..50 {
        within("every request to arrive", server.arrivals.recv()).await;
    }
    server.holds.release(1);
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
    // Without a problem_base there is no documentation of the API's own to link to.
    assert_eq!(changed.header("link"), None);
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

/// The `Set-Cookie` values of a reply.
fn cookies(reply: &Reply) -> Vec<&str> {
    reply
        .headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .map(|(_, v)| std::str::from_utf8(v).unwrap())
        .collect()
}

pub async fn callers_are_independent(store: Arc<dyn Store>) {
    let mut server = Server::start(store, |b| b.on_locked(OnLocked::FailFast)).await;
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
    // A cookie set for one caller reaches that caller only, and only fresh: the default
    // `replay_headers` does not replay `Set-Cookie`.
    assert_eq!(cookies(&alice), ["a=1", "session=alice.1"]);
    assert_eq!(cookies(&bob), ["a=1", "session=bob.2"]);
    for reply in [&alice_again, &bob_again] {
        assert!(cookies(reply).is_empty());
    }
    // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    let ab = server
        .request(Method::POST, "/payments", &[&quoted("c")], Some("ab"), "{}")
        .await;
    let a = server
        .request(Method::POST, "/payments", &[&quoted("bc")], Some("a"), "{}")
        .await;
    assert!(!ab.replayed() && !a.replayed());
    assert_eq!(server.runs(), 4);

    // Two callers in flight with one key at once: each runs, neither is refused as a duplicate.
    let first = tokio::spawn(server.request(
        Method::POST,
        "/hold",
        &[&quoted("both")],
        Some("alice"),
        "{}",
    ));
    within("alice's handler to start", server.holds.entered.recv()).await;
    let second =
        tokio::spawn(server.request(Method::POST, "/hold", &[&quoted("both")], Some("bob"), "{}"));
    within("bob's handler to start", server.holds.entered.recv()).await;
    server.holds.release(2);
    let first = within("alice's reply", first).await.unwrap();
    let second = within("bob's reply", second).await.unwrap();
    assert_eq!((first.status, second.status), (201, 201));
    assert_ne!(first.body, second.body);
    assert_eq!(server.runs(), 6);
}

pub async fn missing_caller_is_refused(store: Arc<dyn Store>) {
    let server = Server::start(store.clone(), |b| b).await;
    let anonymous = || server.request(Method::POST, "/payments", &[&quoted("k-anon")], None, "{}");
    // Two clients without an identity: neither runs, neither gets the other's response.
    for reply in [anonymous().await, anonymous().await] {
        let problem = reply.problem(401);
        assert_eq!(problem["type"], Problem::CallerMissing.type_uri());
        assert_eq!(problem["title"], Problem::CallerMissing.title());
        assert!(cookies(&reply).is_empty());
    }
    assert_eq!(server.runs(), 0);
    assert!(store
        .get(&record_key("", "k-anon"))
        .await
        .unwrap()
        .is_none());
    // Without a key nothing is stored, so there is nothing to keep apart: it runs unguarded.
    let unguarded = server
        .request(Method::POST, "/payments", &[], None, "{}")
        .await;
    assert_eq!(unguarded.status, 201);
    assert_eq!(server.runs(), 1);

    let server = Server::start(store, |b| {
        b.caller_missing_status(axum::http::StatusCode::BAD_REQUEST)
    })
    .await;
    let reply = server
        .request(Method::POST, "/payments", &[&quoted("k-anon")], None, "{}")
        .await;
    let problem = reply.problem(400);
    assert_eq!(problem["type"], Problem::CallerMissing.type_uri());
    assert_eq!(server.runs(), 0);
}

pub async fn invalid_caller_is_400(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let send = |caller: &str| {
        server.request(
            Method::POST,
            "/payments",
            &[&quoted("k-who")],
            Some(caller),
            "{}",
        )
    };
    let too_long = "c".repeat(256);
    for caller in [too_long.as_str(), "tab\there", ""] {
        let problem = send(caller).await.problem(400);
        assert_eq!(
            problem["type"],
            Problem::CallerInvalid.type_uri(),
            "{caller:?}"
        );
        assert_eq!(problem["title"], Problem::CallerInvalid.title());
        // The detail says what is wrong without echoing the identity, which may be a secret.
        if !caller.is_empty() {
            assert!(!problem["detail"].as_str().unwrap().contains(caller));
        }
    }
    assert_eq!(server.runs(), 0);
    // The longest valid identity runs.
    assert_eq!(send(&"c".repeat(255)).await.status, 201);
    assert_eq!(server.runs(), 1);
}

pub async fn shared_key_space_shares_responses(store: Arc<dyn Store>) {
    let layer = IdempotencyLayer::builder(Idempotency::from_arc(store.clone()))
        .shared_key_space()
        .build()
        .unwrap();
    let server = Server::serve(store.clone(), layer).await;
    let send = |caller: Option<&str>, body: &'static str| {
        server.request(
            Method::POST,
            "/payments",
            &[&quoted("k-shared")],
            caller,
            body,
        )
    };
    let alice = send(Some("alice"), r#"{"amount":5}"#).await;
    assert_eq!(alice.status, 201);
    // As documented: whoever sends the same key and body gets the first response, though not
    // its cookies (the default `replay_headers`).
    let bob = send(Some("bob"), r#"{"amount":5}"#).await;
    let nobody = send(None, r#"{"amount":5}"#).await;
    for reply in [&bob, &nobody] {
        assert!(reply.replayed());
        assert_eq!(reply.body, alice.body);
        assert_eq!(reply.header("location"), alice.header("location"));
        assert!(cookies(reply).is_empty());
    }
    // The same key with another body is another request: 422, whoever sends it.
    send(Some("bob"), r#"{"amount":6}"#).await.problem(422);
    assert_eq!(server.runs(), 1);
    assert!(store
        .get(&record_key("", "k-shared"))
        .await
        .unwrap()
        .is_some());
}

pub async fn problem_base_sets_type_and_link(store: Arc<dyn Store>) {
    let base = "https://api.example.com/docs/idempotency";
    let server = Server::start(store, |b| b.problem_base(base)).await;
    let first = server
        .post("/payments", Some("k-doc"), r#"{"amount":5}"#)
        .await;
    assert_eq!(first.status, 201);
    // The handler's own responses are left as they are.
    assert_eq!(first.header("link"), None);
    let link = format!("<{base}>; rel=\"describedby\"");
    let reused = server
        .post("/payments", Some("k-doc"), r#"{"amount":6}"#)
        .await;
    let problem = reused.problem(422);
    assert_eq!(problem["type"], format!("{base}#key-reused"));
    assert_eq!(reused.header("link"), Some(link.as_str()));
    let anonymous = server
        .request(Method::POST, "/payments", &[&quoted("k-doc")], None, "{}")
        .await;
    let problem = anonymous.problem(401);
    assert_eq!(
        problem["type"],
        format!("{base}#{}", Problem::CallerMissing.slug())
    );
    assert_eq!(anonymous.header("link"), Some(link.as_str()));
    assert_eq!(server.runs(), 1);
}

pub async fn bad_keys_are_400(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b.require_key(true)).await;
    let send = |keys: &[&str]| server.request(Method::POST, "/payments", keys, Some(CALLER), "{}");
    let missing = send(&[]).await.problem(400);
    assert_eq!(missing["type"], Problem::KeyMissing.type_uri());
    let long = quoted(&"k".repeat(256));
    let bare_long = "k".repeat(256);
    let malformed: [&[&str]; 8] = [
        &["k bare"],
        &["\"unterminated"],
        &["\"\""],
        &[&long],
        &[&bare_long],
        &["\"a\"", "\"a\""],
        &["a", "a"],
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
        .request(Method::GET, "/payments", &["k bare"], None, "")
        .await;
    assert_eq!(get.status, 200);
    assert!(!get.replayed());
}

/// A UUID key, as most clients send one.
const UUID: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

/// `POST /payments` with this raw `Idempotency-Key` value.
fn post_raw_key(server: &Server, key: &str) -> impl std::future::Future<Output = Reply> + use<> {
    server.request(Method::POST, "/payments", &[key], Some(CALLER), "{}")
}

/// Most clients send a bare UUID: by default it is accepted, and is the same key as its quoted
/// form.
pub async fn bare_keys_by_default(store: Arc<dyn Store>) {
    let server = Server::start(store.clone(), |b| b).await;
    let bare = post_raw_key(&server, UUID).await;
    let quoted_again = post_raw_key(&server, &quoted(UUID)).await;
    assert_eq!(bare.status, 201);
    assert!(!bare.replayed());
    assert!(quoted_again.replayed());
    assert_eq!(quoted_again.body, bare.body);
    assert_eq!(server.runs(), 1);
    // One record, under the key without quotes.
    let record = store.get(&record_key(CALLER, UUID)).await.unwrap();
    assert!(record.is_some());
}

/// A key may hold a space (the engine's alphabet is printable ASCII): quoted, it runs and
/// replays under the key without its quotes; bare, it is refused, since HTTP strips the spaces
/// around an unquoted value, and the detail says to quote it.
pub async fn a_key_with_a_space_is_sent_quoted(store: Arc<dyn Store>) {
    let server = Server::start(store.clone(), |b| b).await;
    let first = post_raw_key(&server, "\" order 42 \"").await;
    assert_eq!(first.status, 201);
    let again = post_raw_key(&server, "\" order 42 \"").await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    let record = store.get(&record_key(CALLER, " order 42 ")).await.unwrap();
    assert!(record.is_some());
    let bare = post_raw_key(&server, "order 42").await.problem(400);
    assert_eq!(bare["type"], Problem::KeyMalformed.type_uri());
    let detail = bare["detail"].as_str().unwrap();
    assert!(
        detail.contains("a key with a space is sent quoted"),
        "{detail}"
    );
    assert_eq!(server.runs(), 1);
}

/// `accept_bare_keys(false)` is the draft's strict form: a bare key gets 400, a quoted one runs.
pub async fn strict_mode_refuses_bare_keys(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b.accept_bare_keys(false)).await;
    let problem = post_raw_key(&server, UUID).await.problem(400);
    assert_eq!(problem["type"], Problem::KeyMalformed.type_uri());
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("double quotes"), "{detail}");
    assert_eq!(server.runs(), 0);
    let quoted_key = post_raw_key(&server, &quoted(UUID)).await;
    assert_eq!(quoted_key.status, 201);
    assert!(!quoted_key.replayed());
    assert_eq!(server.runs(), 1);
}

/// Bodies axum's `Json` refuses before the handler runs, with their status and a key for each:
/// the wrong shape (422) and not JSON at all (400).
const REFUSED_BODIES: [(&str, &str, u16); 2] = [
    ("k-422", r#"{"amount":"five"}"#, 422),
    ("k-400", r#"{"amount":"#, 400),
];

/// axum's `Json` refuses a body of the wrong shape with 422 and one that is not JSON with 400
/// before the handler runs. Neither is stored: the corrected retry under the same key runs the
/// handler and gets its answer, not `KeyReused`.
pub async fn extractor_rejections_are_not_stored(store: Arc<dyn Store>) {
    let server = Server::start(store.clone(), |b| b).await;
    for (key, broken, status) in REFUSED_BODIES {
        let refused = server.post_json("/json", &quoted(key), broken).await;
        assert_eq!(refused.status, status, "{key}");
        assert!(!refused.replayed());
        assert!(
            store.get(&record_key(CALLER, key)).await.unwrap().is_none(),
            "{key}: the refusal was stored"
        );
        // The same broken body again is refused afresh, not replayed.
        let again = server.post_json("/json", &quoted(key), broken).await;
        assert_eq!(again.status, status);
        assert!(!again.replayed());
        let corrected = server
            .post_json("/json", &quoted(key), r#"{"amount":5}"#)
            .await;
        assert_eq!(
            corrected.status,
            201,
            "{key}: {}",
            String::from_utf8_lossy(&corrected.body)
        );
        assert!(!corrected.replayed());
        let replay = server
            .post_json("/json", &quoted(key), r#"{"amount":5}"#)
            .await;
        assert!(replay.replayed());
        assert_eq!(replay.body, corrected.body);
    }
    assert_eq!(server.runs(), 2);
}

/// `store_if` still decides: told to store every answer but 5xx, a 422 or 400 refusal is kept,
/// replayed to the same request and `KeyReused` for a corrected one.
pub async fn store_if_can_store_rejections(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b.store_if(|status, _| !status.is_server_error())).await;
    for (key, broken, status) in REFUSED_BODIES {
        let refused = server.post_json("/json", &quoted(key), broken).await;
        assert_eq!(refused.status, status);
        let again = server.post_json("/json", &quoted(key), broken).await;
        assert_eq!(again.status, status);
        assert!(again.replayed(), "{key}");
        assert_eq!(again.body, refused.body);
        let corrected = server
            .post_json("/json", &quoted(key), r#"{"amount":5}"#)
            .await;
        let problem = corrected.problem(422);
        assert_eq!(problem["type"], Problem::KeyReused.type_uri());
    }
    assert_eq!(server.runs(), 0);
}

/// A handler reads the key the layer checked through the `IdempotencyKey` extractor, without
/// quotes whether it came quoted or bare.
pub async fn handler_reads_the_checked_key(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let send = |method: Method, path: &str, keys: &[&str]| {
        server.request(method, path, keys, Some(CALLER), "{}")
    };
    let first = send(Method::POST, "/keyed", &["\"k-x\""]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, b"run 1 under k-x");
    let bare = send(Method::POST, "/keyed", &["k-y"]).await;
    assert_eq!(bare.body, b"run 2 under k-y");
    // A retry is replayed: the handler does not run to read the key again.
    let replay = send(Method::POST, "/keyed", &["k-x"]).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(server.runs(), 2);

    // Optional form: the key, or None without one.
    let some = send(Method::POST, "/maybe-keyed", &["\"k-z\""]).await;
    assert_eq!((some.status, some.body.as_slice()), (200, &b"key k-z"[..]));
    let none = send(Method::POST, "/maybe-keyed", &[]).await;
    assert_eq!((none.status, none.body.as_slice()), (200, &b"no key"[..]));
    assert_eq!(server.runs(), 4);
}

/// The required form refuses a request without a key with a problem response; both forms
/// refuse a key that no layer checked (a method the layer does not guard) with 500 rather than
/// hand the handler a key that deduplicated nothing.
pub async fn key_extractor_refusals(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let send = |method: Method, path: &str, keys: &[&str]| {
        server.request(method, path, keys, Some(CALLER), "{}")
    };
    let missing = send(Method::POST, "/keyed", &[]).await.problem(400);
    assert_eq!(missing["type"], Problem::KeyMissing.type_uri());
    assert!(
        missing["detail"]
            .as_str()
            .unwrap()
            .contains("needs an Idempotency-Key"),
        "{missing}"
    );
    let missing_get = send(Method::GET, "/keyed", &[]).await.problem(400);
    assert_eq!(missing_get["type"], Problem::KeyMissing.type_uri());
    for path in ["/keyed", "/maybe-keyed"] {
        let unguarded = send(Method::GET, path, &["\"k-get\""]).await.problem(500);
        assert_eq!(
            unguarded["type"],
            Problem::KeyUnguarded.type_uri(),
            "{path}"
        );
        assert_eq!(unguarded["title"], Problem::KeyUnguarded.title());
    }
    let none_get = send(Method::GET, "/maybe-keyed", &[]).await;
    assert_eq!(none_get.body, b"no key");
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

/// A handler that panics stores nothing and frees its key at once, not after its lease: the
/// panic ends the connection (as it does without the layer), and the retry runs the handler
/// again and is answered.
pub async fn handler_panic_frees_key(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| {
        b.on_locked(OnLocked::Wait {
            timeout: Duration::from_secs(10),
        })
    })
    .await;
    let first = server
        .client
        .post(format!("{}/panics", server.base))
        .header("idempotency-key", quoted("k-panic"))
        .header("x-caller", CALLER)
        .body("{}")
        .send();
    let first = within("the panicking request", first).await;
    assert!(first.is_err(), "the panic ends the connection: {first:?}");
    // The release may still be under way; the retry waits for it instead of failing fast.
    let retry = within("the retry", server.post("/panics", Some("k-panic"), "{}")).await;
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(!retry.replayed(), "nothing was stored for the panic");
    assert_eq!(retry.body, b"run 2");
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
    within("the handler to start", server.holds.entered.recv()).await;
    // The client goes away mid-request: its connection closes.
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    let retry = tokio::spawn(server.post("/hold", Some("k-gone"), "{}"));
    server.holds.release(1);
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
        server.holds.dropped.try_recv().is_err(),
        "the handler was cancelled with its connection"
    );
}

/// The same in fail-fast mode: the retry while the handler still runs gets 409 with a short
/// `Retry-After`, and once it finished, the replay.
pub async fn disconnect_then_fail_fast_gets_409_then_replay(store: Arc<dyn Store>) {
    let mut server = Server::start(store.clone(), |b| b).await;
    let client = tokio::spawn(server.post("/hold", Some("k-gone"), "{}"));
    within("the handler to start", server.holds.entered.recv()).await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    let busy = server.post("/hold", Some("k-gone"), "{}").await;
    busy.problem(409);
    assert_eq!(
        busy.header("retry-after"),
        Some("1"),
        "an estimate, not the lease"
    );
    server.holds.release(1);
    // The detached handler stores its response; poll the record, bounded.
    let key = record_key(CALLER, "k-gone");
    within("the response to be stored", async {
        while !matches!(
            store.get(&key).await.unwrap().map(|r| r.state),
            Some(idem::RecordState::Completed(_))
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
    assert!(server.holds.dropped.try_recv().is_err());
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
        .get(&record_key(CALLER, "k-big"))
        .await
        .unwrap()
        .is_none());
    let small = server.post("/payments", Some("k-big"), "{}").await;
    assert_eq!(small.status, 201);
    assert!(!small.replayed());
    assert_eq!(server.runs(), 1);
}

/// A client that goes away while its body is still arriving leaves neither a claim nor a stored
/// error behind (the layer reads the whole body before it claims), so its retry runs the handler
/// at once instead of meeting a claim held for a lease.
pub async fn upload_cut_short_claims_nothing(store: Arc<dyn Store>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(store, |b| b).await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let cut = format!(
        "POST /payments HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: \"k-cut\"\r\n\
         x-caller: {CALLER}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n\
         {{\"amount\":"
    );
    tcp.write_all(cut.as_bytes()).await.unwrap();
    // 90 bytes short of its length, the client stops sending: its half of the connection closes.
    tcp.shutdown().await.unwrap();
    let mut answer = Vec::new();
    within(
        "the server to answer the cut request and close",
        tcp.read_to_end(&mut answer),
    )
    .await
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(
        answer.contains(Problem::BodyUnreadable.type_uri()),
        "{answer}"
    );
    assert_eq!(server.runs(), 0);
    assert!(
        server
            .store
            .get(&record_key(CALLER, "k-cut"))
            .await
            .unwrap()
            .is_none(),
        "the cut request left a record behind"
    );
    let retry = server
        .post("/payments", Some("k-cut"), r#"{"amount":5}"#)
        .await;
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(!retry.replayed());
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

/// A 5 MB response with the default limits (1 MiB): the first client gets all of it, the retry
/// a problem response, and the handler runs once.
pub async fn five_megabyte_response_is_not_run_again(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let first = server.post("/huge", Some("k-huge"), "{}").await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body.len(), 5 << 20);
    let again = server.post("/huge", Some("k-huge"), "{}").await;
    again.problem(422);
    assert_eq!(server.runs(), 1);
}

/// A response with trailers is stored with them: the retry gets the same status, headers, body
/// and trailers (sent again, as the first time, because the response names them in `Trailer`
/// and the client asked with `TE: trailers`), and the handler runs once.
pub async fn response_with_trailers_is_replayed_with_them(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let (first, first_trailers) = server
        .post_reading_trailers("/trailers", "k-trailers")
        .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, b"run,1\nok,1\n");
    assert!(!first.replayed());
    let first_trailers = first_trailers.expect("the first response has trailers");
    assert_eq!(first_trailers["x-checksum"], "sum-1");
    let (again, again_trailers) = server
        .post_reading_trailers("/trailers", "k-trailers")
        .await;
    assert!(again.replayed());
    assert_eq!(again.status, first.status);
    assert_eq!(again.headers_unmarked(), first.headers);
    assert_eq!(again.body, first.body);
    assert_eq!(again_trailers, Some(first_trailers));
    assert_eq!(server.runs(), 1);
}

/// A streamed response is stored whole, in several frames or in one whose end shows only at
/// the next read: the retry gets the same bytes, the handler runs once. (A body known to be
/// whole in one frame, as most handlers' are, is stored without a copy; these are the other
/// ways.)
pub async fn response_in_frames_is_replayed_whole(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    for (path, key, body) in [
        ("/frames", "k-frames", &b"run 1 in three frames"[..]),
        ("/one-frame", "k-one-frame", &b"run 2 streamed"[..]),
    ] {
        let first = server.post(path, Some(key), "{}").await;
        assert_eq!(first.status, 200);
        assert_eq!(first.body, body);
        assert!(!first.replayed());
        let again = server.post(path, Some(key), "{}").await;
        assert_eq!(again.status, 200);
        assert_eq!(again.body, body);
        assert!(again.replayed());
    }
    assert_eq!(server.runs(), 2);
}

pub async fn completed_response_is_stored(store: Arc<dyn Store>) {
    let server = Server::start(store.clone(), |b| b).await;
    let first: Reply = server.post("/payments", Some("k-rec"), "{}").await;
    assert_eq!(first.status, 201);
    let record = store
        .get(&record_key(CALLER, "k-rec"))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(record.state, idem::RecordState::Completed(_)));
}

/// The store fails the first request's completion (it went away right after the handler ran):
/// the client gets its `201` and the engine goes on completing in the background. Retries
/// through the layer meanwhile follow its `on_locked` and never run the handler: failing fast,
/// `409` at once with a `Retry-After` of the completion's next try (2 s: at most 2 s, and a third
/// of the 30 s lease), not a silent wait of a lease; waiting 300 ms, `409` after 300 ms; waiting
/// 20 s once the store is back, the replay as soon as the completion lands.
pub async fn pending_completion_follows_on_locked(store: Arc<dyn Store>) {
    use idem_test_support::faults::CompletionsFail;
    let failing = CompletionsFail::new(store);
    let engine = Idempotency::from_arc(failing.clone());
    let layer = |wait: Option<Duration>| {
        let builder = Server::builder(engine.clone());
        let builder = match wait {
            Some(timeout) => builder.on_locked(OnLocked::Wait { timeout }),
            None => builder,
        };
        builder.build().unwrap()
    };
    let fast = Server::serve(failing.clone(), layer(None)).await;
    let waits = Server::serve(failing.clone(), layer(Some(Duration::from_millis(300)))).await;
    let patient = Server::serve(failing.clone(), layer(Some(Duration::from_secs(20)))).await;

    let first = fast.post("/payments", Some("k-pending"), "{}").await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());

    let asked = std::time::Instant::now();
    let busy = fast.post("/payments", Some("k-pending"), "{}").await;
    busy.problem(409);
    assert_eq!(busy.header("retry-after"), Some("2"));
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "a fail-fast retry waited"
    );

    let asked = std::time::Instant::now();
    let waited = waits.post("/payments", Some("k-pending"), "{}").await;
    waited.problem(409);
    assert_eq!(waited.header("retry-after"), Some("2"));
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "waited {took:?}"
    );

    failing.switch(false);
    let replay = patient.post("/payments", Some("k-pending"), "{}").await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(
        fast.runs() + waits.runs() + patient.runs(),
        1,
        "the handler ran twice"
    );
}

/// A lease short enough to wait out in a case, and the wait past it.
fn short_lease() -> (Duration, Duration) {
    let lease = idem::conformance::scaled(Duration::from_millis(300));
    (lease, lease + Duration::from_millis(150))
}

/// A key whose handler's claim lapsed with no response (its process died mid-charge), on a layer
/// that declares its effect not repeatable: every retry is `409 operation-uncertain` naming the
/// operation, and the handler never runs; resolved as failed by an operator, the next retry runs
/// once.
pub async fn uncertain_key_is_409_naming_the_operation(store: Arc<dyn Store>) {
    let (lease, past) = short_lease();
    let engine = Idempotency::builder(store.clone())
        .lease(lease)
        .build()
        .unwrap();
    let server = Server::start_with(engine.clone(), store, |b| {
        b.on_lapse(idem::OnLapse::Uncertain)
    })
    .await;
    let key = record_key(CALLER, "k-dead");
    // The holder: claimed as the layer claims, then gone without a word.
    let idem::CallClaim::Claimed(_dead) = engine
        .call(key)
        .on_lapse(idem::OnLapse::Uncertain)
        .claim()
        .await
        .unwrap()
    else {
        panic!("a new key is claimed")
    };
    tokio::time::sleep(past).await;
    for _ in 0..2 {
        let again = server
            .post("/payments", Some("k-dead"), r#"{"amount":5}"#)
            .await;
        let problem = again.problem(409);
        assert_eq!(problem["type"], Problem::OperationUncertain.type_uri());
        assert_eq!(problem["operation"], key.to_string());
        assert_eq!(again.header("retry-after"), None, "it says not to retry");
    }
    assert_eq!(server.runs(), 0);
    engine
        .resolve(&key, idem::Resolution::Failed)
        .await
        .unwrap();
    let retry = server
        .post("/payments", Some("k-dead"), r#"{"amount":5}"#)
        .await;
    assert_eq!(retry.status, 201);
    assert_eq!(server.runs(), 1);
}

/// After a response's retention, a retry gets `409 result-expired` from the key's tombstone,
/// never a second run; once the tombstone ends, the key runs again.
pub async fn expired_result_is_409_then_runs_after_key_retention(store: Arc<dyn Store>) {
    let (retention, past) = short_lease();
    let kept = idem::conformance::scaled(Duration::from_secs(1));
    let engine = Idempotency::builder(store.clone())
        .retention(retention)
        .key_retention(kept)
        .build()
        .unwrap();
    let server = Server::start_with(engine, store, |b| b).await;
    let first = server
        .post("/payments", Some("k-old"), r#"{"amount":5}"#)
        .await;
    assert_eq!(first.status, 201);
    tokio::time::sleep(past).await;
    let late = server
        .post("/payments", Some("k-old"), r#"{"amount":5}"#)
        .await;
    let problem = late.problem(409);
    assert_eq!(problem["type"], Problem::ResultExpired.type_uri());
    assert_eq!(server.runs(), 1);
    tokio::time::sleep(kept + Duration::from_millis(1100)).await;
    let later = server
        .post("/payments", Some("k-old"), r#"{"amount":5}"#)
        .await;
    assert_eq!(later.status, 201);
    assert!(!later.replayed());
    assert_eq!(server.runs(), 2);
}

/// A deploy that changes what the layer fingerprints (the body's bytes, then its JSON): a retry
/// of a key stored before it, whose request now fingerprints differently, gets `409
/// policy-changed`, not `422`; the same change under the same version is still `422`.
pub async fn changed_fingerprint_policy_is_409(store: Arc<dyn Store>) {
    let before = Server::start(store.clone(), |b| b).await;
    let first = before
        .post_json("/payments", "\"k-deploy\"", r#"{"amount": 5}"#)
        .await;
    assert_eq!(first.status, 201);
    let after = Server::start(store.clone(), |b| {
        b.fingerprint(idem::http::BodyFingerprint::Json)
    })
    .await;
    let across = after
        .post_json("/payments", "\"k-deploy\"", r#"{"amount":5,"note":"x"}"#)
        .await;
    let problem = across.problem(409);
    assert_eq!(problem["type"], Problem::PolicyChanged.type_uri());
    assert_eq!(after.runs(), 0);
    // Pinned to the old version, the same change reads as a reused key.
    let pinned = Server::start(store, |b| {
        b.fingerprint(idem::http::BodyFingerprint::Json)
            .policy_version(idem::http::BodyFingerprint::Bytes.version())
    })
    .await;
    pinned
        .post_json("/payments", "\"k-deploy\"", r#"{"amount":5,"note":"x"}"#)
        .await
        .problem(422);
    assert_eq!(pinned.runs(), 0);
}
