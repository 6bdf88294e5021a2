//! The fenced extension on a real SQLite store: the claim token from start, fenced complete,
//! abort and renew, the typed stale-holder and fingerprint-mismatch answers, and namespaces or a
//! whole server that require tokens. Through the router in process.

mod common;

use std::time::Duration;

use common::{call, json, serve, ADMIN, ALICE, BOB};
use idem_server::Config;
use serde_json::{json as j, Value};

async fn post(server: &common::Server, route: &str, token: &str, body: Value) -> (u16, Value) {
    let (status, _, bytes) = call(
        &server.app,
        json(&format!("/api/v1.idempotency.{route}"), Some(token), body),
    )
    .await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Fenced complete, abort and renew of `key` with `token`, as `caller`: each a stale holder.
async fn all_refused_as_stale(server: &common::Server, caller: &str, key: &str, token: &str) {
    for (route, body) in [
        (
            "complete",
            j!({"key": key, "token": token, "response": [1], "ttl_ms": 60000}),
        ),
        ("abort", j!({"key": key, "token": token})),
        (
            "renew",
            j!({"key": key, "token": token, "lock_period_ms": 60000}),
        ),
    ] {
        let (status, answer) = post(server, route, caller, body).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (409, Some("stale_holder")),
            "{route}: {answer}"
        );
        assert_eq!(answer["type"], "operation-error");
    }
}

/// An unfenced start of `key` with a 15 s lock, as `caller`: the answer's body.
async fn start(server: &common::Server, caller: &str, key: &str) -> Value {
    let body = j!({"key": key, "lock_period_ms": 15000});
    post(server, "start", caller, body).await.1
}

async fn fenced_start(server: &common::Server, key: &str, lock_ms: u64) -> String {
    let (status, body) = post(
        server,
        "start",
        ALICE,
        j!({"key": key, "lock_period_ms": lock_ms, "fenced": true}),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("started")),
        "{body}"
    );
    body["token"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_is_refused_and_changes_nothing() {
    let server = serve(Config::default()).await;
    let stale = fenced_start(&server, "k", 100).await;
    // Its lock runs out; another worker claims the key (bounded poll on the store's clock).
    let mut fresh = None;
    for _ in 0..250 {
        let (_, body) = post(
            &server,
            "start",
            ALICE,
            j!({"key": "k", "lock_period_ms": 15000, "fenced": true}),
        )
        .await;
        if body["status"] == "started" {
            fresh = body["token"].as_str().map(str::to_owned);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fresh = fresh.expect("the first lock never ran out");
    all_refused_as_stale(&server, ALICE, "k", &stale).await;
    // The new holder's claim is intact: still locked, and its own complete lands.
    let body = start(&server, ALICE, "k").await;
    assert_eq!(body["status"], "locked");
    let (status, _) = post(
        &server,
        "renew",
        ALICE,
        j!({"key": "k", "token": fresh, "lock_period_ms": 60000}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &server,
        "complete",
        ALICE,
        j!({"key": "k", "token": fresh, "response": [2], "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(status, 200);
    let body = start(&server, ALICE, "k").await;
    assert_eq!(body, j!({"status": "completed", "data": {"response": [2]}}));
    // A fenced abort of a completed key is a stale holder too: the response stays.
    let (status, _) = post(&server, "abort", ALICE, j!({"key": "k", "token": fresh})).await;
    assert_eq!(status, 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_mismatch_has_its_own_answer() {
    let server = serve(Config::default()).await;
    let start = |fp: &str| j!({"key": "pay-1", "lock_period_ms": 15000, "fingerprint": fp});
    let (status, first) = post(&server, "start", ALICE, start("POST /pay 42")).await;
    assert_eq!((status, first["status"].as_str()), (200, Some("started")));
    assert!(
        first["token"].is_string(),
        "a fingerprint asks for the fenced answer"
    );
    let (status, body) = post(&server, "start", ALICE, start("POST /pay 99")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("fingerprint_mismatch")),
        "{body}"
    );
    let (_, body) = post(&server, "start", ALICE, start("POST /pay 42")).await;
    assert_eq!(body["status"], "locked");
    let (status, _) = post(
        &server,
        "complete",
        ALICE,
        j!({"key": "pay-1", "token": first["token"], "response": [7], "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, body) = post(&server, "start", ALICE, start("POST /pay 42")).await;
    assert_eq!(body["status"], "completed");
    let (status, body) = post(&server, "start", ALICE, start("POST /pay 99")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("fingerprint_mismatch"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_callers_token_is_a_stale_holder_on_my_key() {
    let server = serve(Config::default()).await;
    let alices = fenced_start(&server, "mine", 15_000).await;
    // Bob holds Alice's token: on "mine" it names no claim of his (his key space is his own).
    all_refused_as_stale(&server, BOB, "mine", &alices).await;
    let body = start(&server, BOB, "mine").await;
    assert_eq!(
        body["status"], "started",
        "Bob's refused requests claimed his key"
    );
    let body = start(&server, ALICE, "mine").await;
    assert_eq!(body["status"], "locked", "Alice's claim was touched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_can_require_tokens() {
    let server = serve(Config::default()).await;
    let (status, ns) = post(
        &server,
        "namespace.configure",
        ADMIN,
        j!({"name": "strict", "require_token": true}),
    )
    .await;
    assert_eq!((status, ns["require_token"].as_bool()), (200, Some(true)));
    // Configured again by a Diom client (no require_token): the requirement stays.
    let (_, ns) = post(
        &server,
        "namespace.configure",
        ADMIN,
        j!({"name": "strict"}),
    )
    .await;
    assert_eq!(ns["require_token"], true);
    let (_, body) = post(
        &server,
        "start",
        ALICE,
        j!({"namespace": "strict", "key": "k", "lock_period_ms": 15000, "fenced": true}),
    )
    .await;
    let token = body["token"].as_str().unwrap().to_owned();
    for (route, body) in [
        (
            "complete",
            j!({"namespace": "strict", "key": "k", "response": [1], "ttl_ms": 60000}),
        ),
        ("abort", j!({"namespace": "strict", "key": "k"})),
    ] {
        let (status, answer) = post(&server, route, ALICE, body).await;
        assert_eq!(
            (status, answer["location"].as_str()),
            (422, Some("token")),
            "{route}: {answer}"
        );
    }
    let (status, _) = post(
        &server,
        "complete",
        ALICE,
        j!({"namespace": "strict", "key": "k", "token": token, "response": [1], "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(status, 200);
    // The default namespace does not require them.
    let (status, _) = post(&server, "abort", ALICE, j!({"key": "k"})).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_can_require_tokens_everywhere() {
    let server = serve(Config {
        require_token: true,
        ..Config::default()
    })
    .await;
    let token = fenced_start(&server, "k", 15_000).await;
    let (status, answer) = post(
        &server,
        "complete",
        ALICE,
        j!({"key": "k", "response": [1], "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (422, Some("invalid_data"))
    );
    let (status, _) = post(&server, "abort", ALICE, j!({"key": "k"})).await;
    assert_eq!(status, 422);
    let (status, _) = post(&server, "abort", ALICE, j!({"key": "k", "token": token})).await;
    assert_eq!(status, 200);
    let body = start(&server, ALICE, "k").await;
    assert_eq!(
        body["status"], "started",
        "the fenced abort released the key"
    );
}

/// The store routes (`get`, `evict`, `prune`, `steps.begin`, `steps.write`): a caller reads and
/// evicts only its own key space; pruning takes the admin token; steps are fenced by the
/// claim's token; bad input is `422` with its location and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_routes_keep_key_spaces_fencing_and_typed_errors() {
    let server = serve(Config::default()).await;
    let digest = "ab".repeat(32);
    let (status, body) = post(
        &server,
        "start",
        ALICE,
        j!({"key": "s", "lock_period_ms": 60000, "fingerprint_sha256": digest}),
    )
    .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("started")));
    let token = body["token"].as_str().unwrap().to_owned();

    let (status, record) = post(&server, "get", ALICE, j!({"key": "s"})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "in_progress");
    assert_eq!(record["token"].as_str(), Some(token.as_str()));
    assert_eq!(record["fingerprint_sha256"].as_str(), Some(digest.as_str()));
    assert!(record["lease_until_ms"].as_u64().is_some());
    // Bob's "s" is another key: absent to him, and his evict leaves Alice's claim.
    let (_, theirs) = post(&server, "get", BOB, j!({"key": "s"})).await;
    assert_eq!(theirs["status"], "absent");
    let (_, evicted) = post(&server, "evict", BOB, j!({"key": "s"})).await;
    assert_eq!(evicted["evicted"], false);

    // A fenced locked answer says what is left of the lease, not only the estimate.
    let (_, locked) = post(
        &server,
        "start",
        ALICE,
        j!({"key": "s", "lock_period_ms": 60000, "fenced": true}),
    )
    .await;
    assert_eq!(locked["status"], "locked");
    assert!(
        locked["lease_left_ms"].as_u64().unwrap() > 30000,
        "{locked}"
    );

    let (status, log) = post(
        &server,
        "steps.begin",
        ALICE,
        j!({"key": "s", "token": token, "ttl_ms": 60000}),
    )
    .await;
    assert_eq!((status, log["attempt"].as_u64()), (200, Some(1)), "{log}");
    let step = j!({"key": "s", "token": token, "name": "charge", "position": 0, "result": [55], "ttl_ms": 60000});
    assert_eq!(
        post(&server, "steps.write", ALICE, step.clone()).await.0,
        200
    );
    for (route, body, location) in [
        (
            "steps.write",
            j!({"key": "s", "token": token, "name": "", "position": 1, "ttl_ms": 60000}),
            "name",
        ),
        (
            "steps.write",
            j!({"key": "s", "token": token, "name": "x", "position": 1, "ttl_ms": 0}),
            "ttl_ms",
        ),
        (
            "start",
            j!({"key": "t", "lock_period_ms": 1000, "fingerprint_sha256": "xyz"}),
            "fingerprint_sha256",
        ),
        (
            "complete",
            j!({"key": "t", "response": [1], "absent": true, "ttl_ms": 1000}),
            "response",
        ),
    ] {
        let (status, answer) = post(&server, route, ALICE, body).await;
        assert_eq!(
            (status, answer["location"].as_str()),
            (422, Some(location)),
            "{route}: {answer}"
        );
    }
    let (_, log) = post(
        &server,
        "steps.begin",
        ALICE,
        j!({"key": "s", "token": token, "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(
        log["steps"],
        j!([{"name": "charge", "position": 0, "result": [55]}])
    );
    let (_, untouched) = post(&server, "get", ALICE, j!({"key": "t"})).await;
    assert_eq!(
        untouched["status"], "absent",
        "refused input claimed nothing"
    );

    let (status, answer) = post(&server, "prune", ALICE, j!({"limit": 10})).await;
    assert_eq!((status, answer["code"].as_str()), (403, Some("forbidden")));
    let (status, answer) = post(&server, "prune", ADMIN, j!({"limit": 10})).await;
    assert_eq!((status, answer["pruned"].as_u64()), (200, Some(0)));

    // Evicted, the claim is stale: its steps and its completion are refused.
    let (_, evicted) = post(&server, "evict", ALICE, j!({"key": "s"})).await;
    assert_eq!(evicted["evicted"], true);
    let (status, answer) = post(&server, "steps.write", ALICE, step).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (409, Some("stale_holder"))
    );
    all_refused_as_stale(&server, ALICE, "s", &token).await;
}

/// The store fails the completion behind a Diom client's `complete` (it went away right after
/// the work ran): the server answers it, its engine storing the result in the background. A
/// `start` of the key meanwhile is `locked` at once, with the completion's next try as its
/// hint, never `started` (the work would run twice); once the store is back, it is `completed`
/// with the response.
#[tokio::test]
async fn a_start_meeting_a_pending_completion_is_locked_then_completed() {
    use idem_test_support::faults::CompletionsFail;
    let dir = tempfile::tempdir().unwrap();
    let failing = CompletionsFail::new(common::sqlite(&dir).await);
    let store: std::sync::Arc<dyn idem_core::Store> = failing.clone();
    let app = idem_server::App::new(store, common::tokens(), Config::default(), None).unwrap();
    let post = |route: &str, body: Value| {
        let request = json(&format!("/api/v1.idempotency.{route}"), Some(ALICE), body);
        let app = app.clone();
        async move {
            let (status, _, bytes) = call(&app, request).await;
            (status, serde_json::from_slice::<Value>(&bytes).unwrap())
        }
    };
    let (status, started) = post("start", j!({"key": "k-pending", "lock_period_ms": 30000})).await;
    assert_eq!(
        (status, started["status"].as_str()),
        (200, Some("started")),
        "{started}"
    );
    let (status, done) = post(
        "complete",
        j!({"key": "k-pending", "response": [1, 2], "ttl_ms": 60000}),
    )
    .await;
    assert_eq!(status, 200, "{done}");

    let (status, locked) = post("start", j!({"key": "k-pending", "lock_period_ms": 30000})).await;
    assert_eq!(
        (status, locked["status"].as_str()),
        (200, Some("locked")),
        "{locked}"
    );

    failing.switch(false);
    // Bounded: the completion's next try is at most 2 s away.
    let mut completed = None;
    for _ in 0..100 {
        let (_, again) = post("start", j!({"key": "k-pending", "lock_period_ms": 30000})).await;
        match again["status"].as_str() {
            Some("completed") => {
                completed = Some(again);
                break;
            }
            Some("locked") => tokio::time::sleep(Duration::from_millis(100)).await,
            _ => panic!("{again}"),
        }
    }
    let completed = completed.expect("the completion never landed");
    assert_eq!(completed["data"]["response"], j!([1, 2]), "{completed}");
}
