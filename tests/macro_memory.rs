//! `#[idempotent]` end to end on the memory store, with tokio's paused clock driving leases and
//! retention.

mod macro_support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Idempotency, MemoryStore, TokioClock};
use macro_support::Harness;

/// A memory store on tokio's clock (so `start_paused` tests control leases and retention), with
/// responses limited to 512 bytes.
fn harness(store: MemoryStore) -> Harness {
    let engine = Idempotency::builder(store.clone())
        .max_response_bytes(512)
        .build()
        .unwrap();
    Harness::new(
        engine,
        Idempotency::new(store.clone()),
        Box::new(move || {
            let n = store.len();
            Box::pin(async move { n })
        }),
        (),
    )
}

fn paused() -> Harness {
    harness(MemoryStore::with_clock(TokioClock::new()))
}

#[tokio::test(start_paused = true)]
async fn skipped_arguments_are_not_hashed() {
    macro_support::skipped_arguments_are_not_hashed(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn key_only_arguments_are_not_hashed() {
    macro_support::key_only_arguments_are_not_hashed(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn duplicate_storm() {
    macro_support::duplicate_storm(&paused(), Duration::from_millis(50)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_storm_on_worker_threads() {
    macro_support::duplicate_storm(&harness(MemoryStore::new()), Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn error_releases_the_claim() {
    macro_support::error_releases_the_claim(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn fingerprint_mismatch_is_key_reused() {
    macro_support::fingerprint_mismatch_is_key_reused(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn default_fingerprint_refuses_another_request() {
    macro_support::default_fingerprint_refuses_another_request(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn unit_fingerprint_replays_any_request() {
    macro_support::unit_fingerprint_replays_any_request(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn explicit_fingerprint_wins() {
    macro_support::explicit_fingerprint_wins(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn default_fingerprint_leaves_out_engine_key_and_caller() {
    macro_support::default_fingerprint_leaves_out_engine_key_and_caller(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn invalid_keys_change_nothing() {
    macro_support::invalid_keys_change_nothing(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn oversized_response_is_not_run_again() {
    macro_support::oversized_response_is_not_run_again(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn no_key_runs_every_time() {
    macro_support::no_key_runs_every_time(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn cancelled_call_releases_its_claim() {
    macro_support::cancelled_call_releases_its_claim(&paused()).await;
}

#[tokio::test(start_paused = true)]
async fn callers_do_not_share_records() {
    macro_support::callers_do_not_share_records(&paused()).await;
}

struct Timed {
    idem: Idempotency,
    runs: AtomicU32,
}

impl Timed {
    #[idempotent(key = key, scope = "short_lived", engine = self.idem, retention = "2s")]
    async fn short_lived(&self, key: &str) -> Result<u32, idem::Error> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }

    #[idempotent(key = key, scope = "long_work", engine = self.idem, lease = "3s")]
    async fn long_work(&self, key: &str) -> Result<u32, idem::Error> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok(run)
    }
}

fn timed() -> Arc<Timed> {
    Arc::new(Timed {
        idem: paused().engine,
        runs: AtomicU32::new(0),
    })
}

#[tokio::test(start_paused = true)]
async fn retention_sets_how_long_a_result_is_replayed() {
    let t = timed();
    assert_eq!(t.short_lived("k").await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(1_900)).await;
    assert_eq!(
        t.short_lived("k").await.unwrap(),
        1,
        "replayed within the retention"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    // After the retention the key is a tombstone (the engine's default `key_retention`, seven
    // days): told, not run again.
    let expired = t.short_lived("k").await;
    assert!(
        matches!(expired, Err(idem::Error::ResultExpired { .. })),
        "{expired:?}"
    );
    assert_eq!(t.runs.load(Ordering::SeqCst), 1);
    tokio::time::sleep(idem::DEFAULT_KEY_RETENTION).await;
    assert_eq!(
        t.short_lived("k").await.unwrap(),
        2,
        "runs again after the retention and the tombstone"
    );
}

#[tokio::test(start_paused = true)]
async fn lease_is_renewed_while_the_body_runs() {
    let t = timed();
    let first = tokio::spawn({
        let t = t.clone();
        async move { t.long_work("k").await }
    });
    // Let the first call claim the key and enter its body.
    for _ in 0..100 {
        if t.runs.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(t.runs.load(Ordering::SeqCst), 1);
    match t.long_work("k").await {
        Err(idem::Error::Locked { retry_after }) => {
            assert!(retry_after <= Duration::from_secs(3), "{retry_after:?}");
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    // Well past one lease, the claim is still held: the body's heartbeat renewed it.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(matches!(
        t.long_work("k").await,
        Err(idem::Error::Locked { .. })
    ));
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(
        t.long_work("k").await.unwrap(),
        1,
        "replays the first result"
    );
    assert_eq!(t.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn cancelled_then_retried_is_never_locked() {
    macro_support::cancelled_then_retried_is_never_locked(&paused()).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn detached_body_survives_its_caller() {
    macro_support::detached_body_survives_its_caller(&paused()).await;
}

/// Two types with a `create` method each, neither with a `scope`: the default scope is the
/// function's path, which holds the type, so the same client key does not make one replay the
/// other's result.
mod default_scope {
    use super::*;

    pub struct Orders {
        pub idem: Idempotency,
        pub runs: AtomicU32,
    }

    pub struct Refunds {
        pub idem: Idempotency,
        pub runs: AtomicU32,
    }

    impl Orders {
        #[idempotent(key = id, engine = self.idem)]
        pub async fn create(&self, id: &str) -> Result<String, idem::Error> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            Ok(format!("order {id}"))
        }
    }

    impl Refunds {
        #[idempotent(key = id, engine = self.idem)]
        pub async fn create(&self, id: &str) -> Result<String, idem::Error> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            Ok(format!("refund {id}"))
        }
    }

    /// A free function of the same name, in this module.
    #[idempotent(key = id, engine = engine)]
    pub async fn create(engine: &Idempotency, id: &str) -> Result<String, idem::Error> {
        Ok(format!("free {id}"))
    }
}

#[tokio::test(start_paused = true)]
async fn methods_of_the_same_name_on_two_types_do_not_share_keys() {
    use default_scope::{Orders, Refunds};
    let engine = paused().engine;
    let orders = Orders {
        idem: engine.clone(),
        runs: AtomicU32::new(0),
    };
    let refunds = Refunds {
        idem: engine.clone(),
        runs: AtomicU32::new(0),
    };
    assert_eq!(orders.create("42").await.unwrap(), "order 42");
    assert_eq!(refunds.create("42").await.unwrap(), "refund 42");
    assert_eq!(
        default_scope::create(&engine, "42").await.unwrap(),
        "free 42"
    );
    // Each replays its own result.
    assert_eq!(orders.create("42").await.unwrap(), "order 42");
    assert_eq!(refunds.create("42").await.unwrap(), "refund 42");
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
    assert_eq!(refunds.runs.load(Ordering::SeqCst), 1);
    // The default scopes are the paths, so a key can be derived outside the function.
    let module = concat!(module_path!(), "::default_scope");
    for scope in [
        format!("{module}::Orders::create"),
        format!("{module}::Refunds::create"),
        format!("{module}::create"),
    ] {
        let key = idem::Key::derive(&scope, "", "42").unwrap();
        assert!(engine.store().get(&key).await.unwrap().is_some(), "{scope}");
    }
}

#[tokio::test(start_paused = true)]
async fn policy_versions_tell_a_changed_fingerprint_from_a_reused_key() {
    macro_support::policy_versions_tell_a_changed_fingerprint_from_a_reused_key(&paused()).await;
}

/// A memory store (on tokio's clock) whose renewals fail: what a holder sees of an outage
/// longer than its lease.
struct NoRenewals(MemoryStore);

impl idem::store::Forward for NoRenewals {
    fn inner(&self) -> &dyn idem::Store {
        &self.0
    }

    fn gate(&self, op: idem::store::Operation) -> Result<(), idem::Error> {
        match op {
            idem::store::Operation::Renew => Err(idem::Error::Store(idem::StoreError::new(
                idem::StoreErrorKind::Unavailable,
                "the store is down",
            ))),
            _ => Ok(()),
        }
    }
}

/// Charges `order_id` once the gate opens: an effect outside the store that must not repeat.
#[idempotent(key = order_id, scope = "charge-uncertain", engine = engine, on_lapse = uncertain, skip(gate))]
async fn charge_once(
    engine: &Idempotency,
    order_id: &str,
    gate: Arc<tokio::sync::Semaphore>,
) -> Result<u32, idem::Error> {
    gate.acquire()
        .await
        .map_err(|e| idem::Error::Codec(e.into()))?
        .forget();
    Ok(7)
}

/// `on_lapse = uncertain`: a call whose holder cannot renew past its lease (an outage) leaves
/// the key uncertain: a retry gets `Error::Uncertain` naming the operation and does not run;
/// the late holder still completes, and retries then replay its result.
#[tokio::test(start_paused = true)]
async fn on_lapse_uncertain_keeps_a_lapsed_key_from_running_again() {
    let store = idem::store::Forwarding(NoRenewals(MemoryStore::with_clock(TokioClock::new())));
    let engine = Idempotency::builder(store)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let holder = {
        let (engine, gate) = (engine.clone(), gate.clone());
        tokio::spawn(async move { charge_once(&engine, "o-1", gate).await })
    };
    tokio::time::sleep(Duration::from_secs(31)).await;
    let retry = charge_once(&engine, "o-1", Arc::new(tokio::sync::Semaphore::new(1))).await;
    let key = idem::Key::derive("charge-uncertain", "", "o-1").unwrap();
    assert!(
        matches!(retry, Err(idem::Error::Uncertain { operation, .. }) if operation == key),
        "{retry:?}"
    );
    gate.add_permits(1);
    assert_eq!(holder.await.unwrap().unwrap(), 7);
    let replayed = charge_once(&engine, "o-1", Arc::new(tokio::sync::Semaphore::new(1))).await;
    assert_eq!(replayed.unwrap(), 7);
}
