//! Past the lease through the server (docs/server.md, "Past the lease"): what a fenced client
//! and Diom's clients are answered for an uncertain key, a tombstone and a changed policy, the
//! typed refusals, and the admin's listing and resolution. On a memory store with a manual
//! clock, through the router in process: a lease ends when the test moves the clock, never by
//! waiting.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{call, json, serve_on, Server, ADMIN, ALICE, BOB};
use idem_core::{Fingerprint, ManualClock, MemoryStore};
use idem_server::Config;
use serde_json::{json as j, Value};

/// A server over a memory store on `clock`.
async fn served(clock: &ManualClock) -> Server {
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let dir = tempfile::tempdir().unwrap();
    serve_on(store, Config::default(), dir).await
}

async fn post(server: &Server, route: &str, token: &str, body: Value) -> (u16, Value) {
    let (status, _, bytes) = call(
        &server.app,
        json(&format!("/api/v1.idempotency.{route}"), Some(token), body),
    )
    .await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// A fenced start of `key` by `caller` that claims it, uncertain on lapse, for one second: the
/// claim's token.
async fn uncertain_claim(server: &Server, caller: &str, key: &str) -> String {
    let body = j!({"key": key, "lock_period_ms": 1000, "fenced": true, "on_lapse": "uncertain"});
    let (status, answer) = post(server, "start", caller, body).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("started")),
        "{answer}"
    );
    answer["token"].as_str().unwrap().to_owned()
}

/// What a start of `key` by `caller` answers, fenced or not.
async fn start(server: &Server, caller: &str, key: &str, fenced: bool) -> (u16, Value) {
    let body = j!({"key": key, "lock_period_ms": 30000, "fenced": fenced});
    post(server, "start", caller, body).await
}

/// `(status, code)` of an answer.
fn refusal(answer: &(u16, Value)) -> (u16, &str) {
    (answer.0, answer.1["code"].as_str().unwrap_or(""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_client_sees_an_uncertain_key_and_resolves_it_fenced() {
    let clock = ManualClock::new();
    let server = served(&clock).await;
    let holder = uncertain_claim(&server, ALICE, "charge-1").await;
    // While its lock runs, it is only locked, and nobody's to take.
    assert_eq!(
        start(&server, ALICE, "charge-1", true).await.1["status"],
        "locked"
    );
    let early = j!({"key": "charge-1", "token": holder, "lock_period_ms": 30000});
    let taken = post(&server, "uncertain.take", ALICE, early).await;
    assert_eq!(refusal(&taken), (409, "not_uncertain"), "{taken:?}");
    clock.advance(Duration::from_secs(2));

    // Past its lease: a fenced start is told `uncertain` and since when, Diom's `locked`.
    let (status, fenced) = start(&server, ALICE, "charge-1", true).await;
    assert_eq!(
        (status, fenced["status"].as_str()),
        (200, Some("uncertain"))
    );
    let since = fenced["since_ms"].as_u64().expect("since_ms");
    assert_eq!(
        start(&server, ALICE, "charge-1", false).await.1,
        j!({"status": "locked"})
    );
    let (_, got) = post(&server, "get", ALICE, j!({"key": "charge-1"})).await;
    assert_eq!(
        (
            got["status"].as_str(),
            got["token"].as_str(),
            got["since_ms"].as_u64()
        ),
        (Some("uncertain"), Some(holder.as_str()), Some(since)),
        "{got}"
    );
    // A token-less complete or abort cannot end it.
    let done = j!({"key": "charge-1", "response": [1], "ttl_ms": 60000});
    let completed = post(&server, "complete", ALICE, done).await;
    assert_eq!(refusal(&completed), (409, "uncertain"), "{completed:?}");
    let aborted = post(&server, "abort", ALICE, j!({"key": "charge-1"})).await;
    assert_eq!(refusal(&aborted), (409, "uncertain"), "{aborted:?}");
    assert_eq!(
        start(&server, ALICE, "charge-1", true).await.1["status"],
        "uncertain"
    );

    // The caller finds it by its own key; another caller finds nothing of it.
    let (status, found) = post(&server, "uncertain.find", ALICE, j!({"limit": 10})).await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(
        found,
        j!({"operations": [{"key": "charge-1", "token": holder, "since_ms": since}]})
    );
    let (_, none) = post(&server, "uncertain.find", BOB, j!({"limit": 10})).await;
    assert_eq!(none, j!({"operations": []}));
    let after = j!({"limit": 10, "after": "charge-1"});
    assert_eq!(post(&server, "uncertain.find", ALICE, after).await.1, none);

    // Taken over with the lapsed claim's token, once; the old holder is then fenced out.
    let wrong = j!({"key": "charge-1", "token": "0".repeat(32), "lock_period_ms": 30000});
    let taken = post(&server, "uncertain.take", ALICE, wrong).await;
    assert_eq!(refusal(&taken), (409, "not_uncertain"), "{taken:?}");
    let take = j!({"key": "charge-1", "token": holder, "lock_period_ms": 30000});
    let (status, taken) = post(&server, "uncertain.take", ALICE, take.clone()).await;
    assert_eq!(status, 200, "{taken}");
    let resolver = taken["token"].as_str().unwrap().to_owned();
    assert_ne!(resolver, holder);
    let again = post(&server, "uncertain.take", ALICE, take).await;
    assert_eq!(refusal(&again), (409, "not_uncertain"));
    let late = j!({"key": "charge-1", "token": holder, "response": [9], "ttl_ms": 60000});
    assert_eq!(
        refusal(&post(&server, "complete", ALICE, late).await),
        (409, "stale_holder")
    );
    let resolved = j!({"key": "charge-1", "token": resolver, "response": [7], "ttl_ms": 60000});
    assert_eq!(post(&server, "complete", ALICE, resolved).await.0, 200);
    assert_eq!(
        start(&server, ALICE, "charge-1", false).await.1,
        j!({"status": "completed", "data": {"response": [7]}})
    );
    assert_eq!(
        post(&server, "uncertain.find", ALICE, j!({"limit": 10}))
            .await
            .1,
        none
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_answers_expired_fenced_and_locked_to_diom() {
    let clock = ManualClock::new();
    let server = served(&clock).await;
    let (_, started) = start(&server, ALICE, "receipt-1", true).await;
    let token = started["token"].as_str().unwrap();
    let done = j!({"key": "receipt-1", "token": token, "response": [1], "ttl_ms": 1000,
                   "key_retention_ms": 60000});
    assert_eq!(post(&server, "complete", ALICE, done).await.0, 200);
    assert_eq!(
        start(&server, ALICE, "receipt-1", false).await.1["status"],
        "completed"
    );
    clock.advance(Duration::from_secs(2));

    let (status, fenced) = start(&server, ALICE, "receipt-1", true).await;
    assert_eq!(
        (status, fenced["status"].as_str()),
        (200, Some("expired")),
        "{fenced}"
    );
    let since = fenced["since_ms"].as_u64().expect("since_ms");
    assert_eq!(
        start(&server, ALICE, "receipt-1", false).await.1,
        j!({"status": "locked"})
    );
    let (_, got) = post(&server, "get", ALICE, j!({"key": "receipt-1"})).await;
    assert_eq!(got, j!({"status": "expired", "since_ms": since}));
    // A token-less complete keeps it as a completed key keeps its first response.
    let again = j!({"key": "receipt-1", "response": [2], "ttl_ms": 60000});
    assert_eq!(post(&server, "complete", ALICE, again).await.0, 200);
    assert_eq!(
        post(&server, "abort", ALICE, j!({"key": "receipt-1"}))
            .await
            .0,
        200
    );
    assert_eq!(
        start(&server, ALICE, "receipt-1", true).await.1["status"],
        "expired"
    );
    // Without key_retention_ms (Diom's complete), the key frees when its ttl ends.
    assert_eq!(
        start(&server, ALICE, "plain", false).await.1["status"],
        "started"
    );
    let plain = j!({"key": "plain", "response": [3], "ttl_ms": 1000});
    assert_eq!(post(&server, "complete", ALICE, plain).await.0, 200);
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        start(&server, ALICE, "plain", false).await.1["status"],
        "started"
    );
    // Once its key retention has passed too, the tombstone frees.
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        start(&server, ALICE, "receipt-1", true).await.1["status"],
        "started"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_policy_and_bad_input_have_typed_answers() {
    let clock = ManualClock::new();
    let server = served(&clock).await;
    let digest = |what: &[u8], version| {
        let f = Fingerprint::of_bytes(what).with_policy(version);
        idem_wire::hex::encode(f.as_bytes())
    };
    let with = |f: String| j!({"key": "pay-1", "lock_period_ms": 30000, "fingerprint_sha256": f});
    let (_, first) = post(&server, "start", ALICE, with(digest(b"amount=5", 1))).await;
    assert_eq!(first["status"], "started");
    let (status, changed) = post(&server, "start", ALICE, with(digest(b"amount=5;eur", 2))).await;
    assert_eq!(
        (status, changed["code"].as_str(), changed["type"].as_str()),
        (422, Some("policy_changed"), Some("operation-error")),
        "{changed}"
    );
    assert_eq!(
        (&changed["stored_policy"], &changed["current_policy"]),
        (&j!(1), &j!(2))
    );
    let (_, same) = post(&server, "start", ALICE, with(digest(b"amount=5", 2))).await;
    assert_eq!(
        same["status"], "locked",
        "the same request under another version"
    );
    let (_, reused) = post(&server, "start", ALICE, with(digest(b"amount=6", 1))).await;
    assert_eq!(reused["code"], "fingerprint_mismatch");

    // Bad input: typed, at its field, and nothing claimed or named.
    let ten_years_and_a_ms = 315_360_000_001u64;
    for (route, body, at) in [
        (
            "start",
            j!({"key": "bad", "lock_period_ms": 1000, "on_lapse": "maybe"}),
            "on_lapse",
        ),
        (
            "complete",
            j!({"key": "bad", "response": [], "ttl_ms": 1000, "key_retention_ms": ten_years_and_a_ms}),
            "key_retention_ms",
        ),
        (
            "steps.write",
            j!({"key": "bad", "token": "0".repeat(32), "name": "x", "position": 0,
                "ttl_ms": 1000, "on_lapse": "never"}),
            "on_lapse",
        ),
        ("uncertain.find", j!({"limit": 0}), "limit"),
        ("uncertain.find", j!({"limit": 1001}), "limit"),
        ("uncertain.find", j!({"limit": 1, "after": "a b"}), "after"),
        (
            "uncertain.take",
            j!({"key": "bad", "token": "xyz", "lock_period_ms": 1000}),
            "token",
        ),
        (
            "uncertain.take",
            j!({"key": "bad", "token": "0".repeat(32), "lock_period_ms": 0}),
            "lock_period_ms",
        ),
    ] {
        let (status, answer) = post(&server, route, ALICE, body).await;
        assert_eq!(
            (status, answer["code"].as_str(), answer["location"].as_str()),
            (422, Some("invalid_data"), Some(at)),
            "{route}: {answer}"
        );
    }
    let (_, got) = post(&server, "get", ALICE, j!({"key": "bad"})).await;
    assert_eq!(got, j!({"status": "absent"}));
    let (_, listed) = post(&server, "uncertain.list", ADMIN, j!({"limit": 10})).await;
    assert_eq!(listed, j!({"operations": []}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_lists_and_resolves_uncertain_operations() {
    let clock = ManualClock::new();
    let server = served(&clock).await;
    for key in ["pay-a", "pay-b", "pay-c"] {
        uncertain_claim(&server, ALICE, key).await;
    }
    uncertain_claim(&server, BOB, "pay-a").await;
    clock.advance(Duration::from_secs(2));

    // A caller token may neither list nor resolve.
    let listed = post(&server, "uncertain.list", ALICE, j!({"limit": 10})).await;
    assert_eq!(refusal(&listed), (403, "forbidden"));
    // Every caller's, by store key, each with its name.
    let (status, all) = post(&server, "uncertain.list", ADMIN, j!({"limit": 10})).await;
    assert_eq!(status, 200, "{all}");
    let ops = all["operations"].as_array().unwrap().clone();
    let mut named: Vec<(String, String)> = ops
        .iter()
        .map(|op| {
            assert_eq!(op["namespace"], "default");
            let caller = op["caller"].as_str().unwrap().to_owned();
            (caller, op["client_key"].as_str().unwrap().to_owned())
        })
        .collect();
    named.sort();
    let expected = [
        ("caller:alice", "pay-a"),
        ("caller:alice", "pay-b"),
        ("caller:alice", "pay-c"),
        ("caller:bob", "pay-a"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(c, k)| ((*c).to_owned(), (*k).to_owned()))
        .collect();
    assert_eq!(named, expected);
    // Paged by store key.
    let (_, first) = post(&server, "uncertain.list", ADMIN, j!({"limit": 3})).await;
    let last = first["operations"][2]["key"].clone();
    let (_, rest) = post(
        &server,
        "uncertain.list",
        ADMIN,
        j!({"limit": 3, "after": last}),
    )
    .await;
    let paged: Vec<Value> = first["operations"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest["operations"].as_array().unwrap())
        .cloned()
        .collect();
    assert_eq!(paged, ops);
    let store_key = |caller: &str, key: &str| {
        ops.iter()
            .find(|op| op["caller"] == caller && op["client_key"] == key)
            .map(|op| op["key"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let (a, b, c) = (
        store_key("caller:alice", "pay-a"),
        store_key("caller:alice", "pay-b"),
        store_key("caller:alice", "pay-c"),
    );
    let resolve = |body: Value| post(&server, "uncertain.resolve", ADMIN, body);

    // Refused input changes nothing.
    let bob_resolves = post(
        &server,
        "uncertain.resolve",
        BOB,
        j!({"key": a, "resolution": "failed"}),
    )
    .await;
    assert_eq!(refusal(&bob_resolves), (403, "forbidden"));
    for (body, at) in [
        (j!({"key": "pay-a", "resolution": "failed"}), "key"),
        (j!({"key": a, "resolution": "completed"}), "response"),
        (
            j!({"key": a, "resolution": "completed", "response": [1], "reason": "r"}),
            "reason",
        ),
        (
            j!({"key": a, "resolution": "failed", "response": [1]}),
            "response",
        ),
        (
            j!({"key": a, "resolution": "failed", "reason": "r"}),
            "reason",
        ),
        (j!({"key": a, "resolution": "abandoned"}), "reason"),
        (
            j!({"key": a, "resolution": "abandoned", "reason": ""}),
            "reason",
        ),
        (
            j!({"key": a, "resolution": "abandoned", "reason": "r".repeat(1025)}),
            "reason",
        ),
        (j!({"key": a, "resolution": "maybe"}), "resolution"),
    ] {
        let (status, answer) = resolve(body.clone()).await;
        assert_eq!(
            (status, answer["code"].as_str(), answer["location"].as_str()),
            (422, Some("invalid_data"), Some(at)),
            "{body}: {answer}"
        );
    }
    let (_, unchanged) = post(&server, "uncertain.list", ADMIN, j!({"limit": 10})).await;
    assert_eq!(unchanged["operations"], j!(ops));

    // Completed: every start replays the response; a second resolution is refused.
    let completed = j!({"key": a, "resolution": "completed", "response": [7],
                        "context": {"status": "201"}});
    assert_eq!(resolve(completed.clone()).await.0, 200);
    assert_eq!(
        start(&server, ALICE, "pay-a", false).await.1,
        j!({"status": "completed", "data": {"response": [7], "context": {"status": "201"}}})
    );
    assert_eq!(refusal(&resolve(completed).await), (409, "not_uncertain"));
    let failed_too = resolve(j!({"key": a, "resolution": "failed"})).await;
    assert_eq!(refusal(&failed_too), (409, "not_uncertain"));
    // Bob's pay-a is another key, still uncertain.
    assert_eq!(
        start(&server, BOB, "pay-a", true).await.1["status"],
        "uncertain"
    );

    // Failed: the key is free, the next start runs.
    assert_eq!(resolve(j!({"key": b, "resolution": "failed"})).await.0, 200);
    assert_eq!(
        start(&server, ALICE, "pay-b", true).await.1["status"],
        "started"
    );

    // Abandoned: a fenced start is refused with the reason, Diom's clients are told `locked`,
    // `get` says why.
    let abandoned = j!({"key": c, "resolution": "abandoned", "reason": "refunded by hand"});
    assert_eq!(resolve(abandoned).await.0, 200);
    let refused = start(&server, ALICE, "pay-c", true).await;
    assert_eq!(refusal(&refused), (409, "abandoned"), "{refused:?}");
    assert_eq!(refused.1["reason"], "refunded by hand");
    assert_eq!(
        start(&server, ALICE, "pay-c", false).await.1,
        j!({"status": "locked"})
    );
    let (_, got) = post(&server, "get", ALICE, j!({"key": "pay-c"})).await;
    assert_eq!(
        (got["status"].as_str(), got["abandoned"].as_str()),
        (Some("completed"), Some("refunded by hand")),
        "{got}"
    );

    // What is left: Bob's.
    let (_, left) = post(&server, "uncertain.list", ADMIN, j!({"limit": 10})).await;
    let left = left["operations"].as_array().unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(
        (&left[0]["caller"], &left[0]["client_key"]),
        (&j!("caller:bob"), &j!("pay-a"))
    );
}

/// Diom's published Python client (`IDEM_DIOM_PYTHON`) meets an uncertain key and a
/// tombstone, both made through the fenced extension, and is told `locked` for both: it never
/// runs them again, and its models (which know three statuses) read every answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diom_python_client_sees_locked_past_the_lease() {
    let Some(python) = idem_test_support::setting(
        "diom_python_client_sees_locked_past_the_lease",
        "IDEM_DIOM_PYTHON",
        "IDEM_REQUIRE_DIOM",
    ) else {
        return;
    };
    let clock = ManualClock::new();
    let server = served(&clock).await;
    uncertain_claim(&server, ALICE, "charge-9").await;
    let (_, started) = start(&server, ALICE, "receipt-9", true).await;
    let done = j!({"key": "receipt-9", "token": started["token"], "response": [1],
                   "ttl_ms": 1000, "key_retention_ms": 3_600_000});
    assert_eq!(post(&server, "complete", ALICE, done).await.0, 200);
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        start(&server, ALICE, "charge-9", true).await.1["status"],
        "uncertain"
    );
    assert_eq!(
        start(&server, ALICE, "receipt-9", true).await.1["status"],
        "expired"
    );

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/diom_lapse.py");
    let env = [
        ("IDEM_SERVER_URL", server.url.as_str()),
        ("IDEM_ALICE", ALICE),
        ("IDEM_UNCERTAIN_KEY", "charge-9"),
        ("IDEM_TOMBSTONE_KEY", "receipt-9"),
    ];
    let (passed, stdout) = common::run_python(&python, script, &env).await;
    assert!(passed, "the Python client's checks failed");
    assert!(
        stdout.contains("all 3 checks passed"),
        "not every check ran"
    );
    // Nothing the client did changed either key.
    assert_eq!(
        start(&server, ALICE, "charge-9", true).await.1["status"],
        "uncertain"
    );
    assert_eq!(
        start(&server, ALICE, "receipt-9", true).await.1["status"],
        "expired"
    );
}

/// A namespace's record is the server's own, written through its engine: whatever the engine's
/// policy (here: uncertain on lapse, tombstones of a week), it is claimed released on lapse and
/// completed with no tombstone, so it ends with its retention; and one an older server left as a
/// tombstone or uncertain never blocks configuring the namespace again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_records_never_block_reconfiguration() {
    use idem_core::{CallClaim, Idempotency, Key, OnLapse};
    let clock = ManualClock::new();
    let engine = Idempotency::builder(MemoryStore::with_clock(clock.clone()))
        .on_lapse(OnLapse::Uncertain)
        .build()
        .unwrap();
    let app =
        idem_server::App::from_engine(engine.clone(), common::tokens(), Config::default(), None);
    let post = |route: &str, token: &str, body: Value| {
        let request = json(&format!("/api/v1.idempotency.{route}"), Some(token), body);
        let app = app.clone();
        async move {
            let (status, _, bytes) = call(&app, request).await;
            (status, serde_json::from_slice::<Value>(&bytes).unwrap())
        }
    };
    let record = |name: &str| Key::derive("idem-server.namespaces", "", name).unwrap();
    let configure = |name: &str| j!({"name": name, "require_token": true});

    assert_eq!(
        post("namespace.configure", ADMIN, configure("payments"))
            .await
            .0,
        200
    );
    // The settings an older server left: as a tombstone, and uncertain.
    let settings =
        |name: &str| serde_json::to_vec(&j!({"name": name, "created": 1, "updated": 1})).unwrap();
    let CallClaim::Claimed(old) = engine.call(record("ledger")).claim().await.unwrap() else {
        panic!("a new key is claimed");
    };
    engine
        .finish("old", &old, settings("ledger"))
        .retention(Duration::from_secs(1))
        .key_retention(Duration::from_secs(3600))
        .await
        .unwrap();
    let dying = engine.call(record("audit")).lease(Duration::from_secs(1));
    assert!(matches!(
        dying.claim().await.unwrap(),
        CallClaim::Claimed(_)
    ));
    clock.advance(Duration::from_secs(2));
    assert!(matches!(
        engine.holder(&record("ledger")).await.unwrap(),
        idem_core::Holder::Expired { .. }
    ));
    assert!(matches!(
        engine.holder(&record("audit")).await.unwrap(),
        idem_core::Holder::Uncertain { .. }
    ));
    for name in ["ledger", "audit"] {
        let (status, out) = post("namespace.configure", ADMIN, configure(name)).await;
        assert_eq!(status, 200, "{name}: {out}");
        let (_, got) = post("namespace.get", ADMIN, j!({"name": name})).await;
        assert_eq!(got["require_token"], true, "{name}: {got}");
        let start = j!({"namespace": name, "key": "k", "lock_period_ms": 1000});
        assert_eq!(post("start", ALICE, start).await.1["status"], "started");
    }
    // Its own records end with their retention (ten years), with no tombstone after it.
    clock.advance(Duration::from_secs(10 * 365 * 24 * 3600 + 1));
    assert_eq!(
        engine.holder(&record("payments")).await.unwrap(),
        idem_core::Holder::Absent
    );
    assert_eq!(
        post("namespace.configure", ADMIN, configure("payments"))
            .await
            .0,
        200
    );
}
