//! Diom's token-less `complete` and `abort` after a token-less `start` on the same node: the
//! node kept the claim's token and acts under it, one store operation, with no read first; a
//! claim that changed hands since, and one that may become uncertain, answer as they did when
//! every token-less request read first. On memory stores counted by a wrapper, with a manual
//! clock, through the router in process.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{call, json, ALICE};
use idem_core::store::{Forward, Forwarding};
use idem_core::{Error, Key, ManualClock, MemoryStore, Record, Store};
use idem_server::{auth::Tokens, App, Config};
use serde_json::{json as j, Value};

/// A memory store that counts its reads (`get`).
struct Counted {
    inner: Arc<MemoryStore>,
    reads: AtomicU64,
}

#[async_trait]
impl Forward for Counted {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key).await
    }
}

/// A node over `store`, and the count of its reads.
fn node(store: &Arc<MemoryStore>) -> (App, Arc<Forwarding<Counted>>) {
    let counted = Arc::new(Forwarding(Counted {
        inner: store.clone(),
        reads: AtomicU64::new(0),
    }));
    let tokens = Tokens::new(common::ADMIN, &[format!("alice={ALICE}")]).unwrap();
    let app = App::new(counted.clone(), tokens, Config::default(), None).unwrap();
    (app, counted)
}

fn reads(store: &Forwarding<Counted>) -> u64 {
    store.0.reads.load(Ordering::Relaxed)
}

async fn post(app: &App, route: &str, body: Value) -> (u16, Value) {
    let (status, _, bytes) = call(
        app,
        json(&format!("/api/v1.idempotency.{route}"), Some(ALICE), body),
    )
    .await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Diom's start: no `fenced`, no token back.
async fn start(app: &App, key: &str, lock_ms: u64) -> Value {
    let (status, answer) = post(app, "start", j!({"key": key, "lock_period_ms": lock_ms})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer.get("token"), None, "{answer}");
    answer
}

async fn complete(app: &App, key: &str, response: &[u8]) -> (u16, Value) {
    let body = j!({"key": key, "response": response, "ttl_ms": 60_000});
    post(app, "complete", body).await
}

#[tokio::test]
async fn a_token_less_complete_or_abort_after_this_nodes_start_reads_nothing() {
    let store = Arc::new(MemoryStore::new());
    let (app, counted) = node(&store);

    // The start reads the namespace's settings once (then kept for a few seconds).
    assert_eq!(start(&app, "order-1", 30_000).await["status"], "started");
    let before = reads(&counted);
    assert_eq!(complete(&app, "order-1", b"receipt").await.0, 200);
    assert_eq!(
        reads(&counted),
        before,
        "the complete read the record first"
    );
    let replay = start(&app, "order-1", 30_000).await;
    assert_eq!(replay["status"], "completed", "{replay}");
    assert_eq!(replay["data"]["response"], j!(b"receipt".to_vec()));

    assert_eq!(start(&app, "order-2", 30_000).await["status"], "started");
    assert_eq!(post(&app, "abort", j!({"key": "order-2"})).await.0, 200);
    assert_eq!(reads(&counted), before, "the abort read the record first");
    assert_eq!(start(&app, "order-2", 30_000).await["status"], "started");

    // A second complete of a completed key finds no token, reads, and keeps the first response.
    assert_eq!(complete(&app, "order-1", b"other").await.0, 200);
    assert_eq!(reads(&counted), before + 1);
    let replay = start(&app, "order-1", 30_000).await;
    assert_eq!(replay["data"]["response"], j!(b"receipt".to_vec()));
}

/// Node A's claim lapses and node B starts the key: A's token is stale, so its token-less
/// complete finds the holder by reading, as before, and completes B's claim (Diom's complete
/// acts on whichever claim holds the key); B's own complete then keeps that first response.
#[tokio::test]
async fn a_claim_that_changed_hands_is_found_by_reading_as_before() {
    let clock = ManualClock::new();
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let (a, counted_a) = node(&store);
    let (b, _) = node(&store);

    assert_eq!(start(&a, "order-1", 1_000).await["status"], "started");
    clock.advance(Duration::from_secs(2));
    assert_eq!(start(&b, "order-1", 30_000).await["status"], "started");

    let before = reads(&counted_a);
    assert_eq!(complete(&a, "order-1", b"from-a").await.0, 200);
    assert_eq!(
        reads(&counted_a),
        before + 1,
        "the stale token was refused, then the record read"
    );
    assert_eq!(complete(&b, "order-1", b"from-b").await.0, 200);
    let replay = start(&b, "order-1", 30_000).await;
    assert_eq!(replay["status"], "completed", "{replay}");
    assert_eq!(replay["data"]["response"], j!(b"from-a".to_vec()));

    // The same for an abort: A's stale token is refused, and the read finds B's live claim.
    assert_eq!(start(&a, "order-2", 1_000).await["status"], "started");
    clock.advance(Duration::from_secs(2));
    assert_eq!(start(&b, "order-2", 30_000).await["status"], "started");
    assert_eq!(post(&a, "abort", j!({"key": "order-2"})).await.0, 200);
    assert_eq!(start(&a, "order-2", 30_000).await["status"], "started");

    // A's claim completed through B: A still keeps its token, and A's abort under it finds no
    // live claim, reads, and leaves the response.
    assert_eq!(start(&a, "order-3", 30_000).await["status"], "started");
    assert_eq!(complete(&b, "order-3", b"kept").await.0, 200);
    assert_eq!(post(&a, "abort", j!({"key": "order-3"})).await.0, 200);
    let replay = start(&b, "order-3", 30_000).await;
    assert_eq!(replay["status"], "completed", "{replay}");
    assert_eq!(replay["data"]["response"], j!(b"kept".to_vec()));
}

/// A token-less start that is uncertain on lapse keeps no token: once its lease ran out, a
/// token-less complete or abort is refused as for any uncertain key (only a resolution, or the
/// holder's token, ends it), and does not land under the token the node would have kept.
#[tokio::test]
async fn a_token_less_claim_that_may_become_uncertain_keeps_no_token() {
    let clock = ManualClock::new();
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let (app, _) = node(&store);
    let body = j!({"key": "charge-1", "lock_period_ms": 1_000, "on_lapse": "uncertain"});
    let (status, answer) = post(&app, "start", body).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("started")));
    clock.advance(Duration::from_secs(2));

    let (status, answer) = complete(&app, "charge-1", b"late").await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (409, Some("uncertain")),
        "{answer}"
    );
    let (status, answer) = post(&app, "abort", j!({"key": "charge-1"})).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (409, Some("uncertain")),
        "{answer}"
    );
}
