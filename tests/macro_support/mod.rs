//! Attributed functions and scenarios shared by the `macro_*` integration tests. Every scenario
//! goes through `#[idempotent]`, never through the engine API, and runs against any store.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{idempotent, Fingerprint, Idempotency, Key, KeyError, OnLocked};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

type RecordCount = Box<dyn Fn() -> Pin<Box<dyn Future<Output = usize> + Send>> + Send + Sync>;

/// An engine plus a way to count the records its store holds, live or not.
pub struct Harness {
    pub engine: Idempotency,
    /// Another engine on the same store, with the default configuration.
    pub second_engine: Idempotency,
    records: RecordCount,
    /// What must outlive the store, such as its temporary directory.
    _keep: Box<dyn Any + Send + Sync>,
}

impl Harness {
    /// `keep` lives as long as the harness (a temporary directory; `()` when there is none).
    pub fn new(
        engine: Idempotency,
        second_engine: Idempotency,
        records: RecordCount,
        keep: impl Any + Send + Sync,
    ) -> Harness {
        Harness {
            engine,
            second_engine,
            records,
            _keep: Box::new(keep),
        }
    }

    pub async fn record_count(&self) -> usize {
        (self.records)().await
    }

    pub fn service(&self, tenant: &str) -> Arc<Service> {
        Arc::new(Service {
            idem: self.engine.clone(),
            tenant: tenant.to_owned(),
            runs: Mutex::default(),
            sequence: AtomicU64::new(1),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error("the card was declined")]
    Declined,
}

#[derive(Debug, Clone, Serialize)]
pub struct Payment {
    pub key: String,
    pub cents: u64,
}

impl Payment {
    pub fn new(key: impl Into<String>, cents: u64) -> Payment {
        Payment {
            key: key.into(),
            cents,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub key: String,
    pub cents: u64,
    /// A number taken from a shared sequence when the body runs: two runs never share it.
    pub run: u64,
}

/// A payment service whose fields feed the attribute's `store` and `caller`.
pub struct Service {
    pub idem: Idempotency,
    pub tenant: String,
    /// How many times the body ran, per client key.
    pub runs: Mutex<HashMap<String, u32>>,
    pub sequence: AtomicU64,
}

impl Service {
    /// Charges once per `(tenant, payment.key)`; concurrent duplicates wait for the first.
    /// A zero amount is declined (an error, so the claim is released).
    #[idempotent(
        key = payment.key,
        caller = self.tenant,
        scope = "pay",
        engine = self.idem,
        fingerprint = payment,
        on_locked = OnLocked::Wait { timeout: Duration::from_secs(60) },
    )]
    pub async fn pay(&self, payment: Payment, work: Duration) -> Result<Receipt, PayError> {
        self.count_run(&payment.key);
        tokio::time::sleep(work).await;
        if payment.cents == 0 {
            return Err(PayError::Declined);
        }
        Ok(Receipt {
            key: payment.key,
            cents: payment.cents,
            run: self.sequence.fetch_add(1, Ordering::SeqCst),
        })
    }

    /// Optional idempotency: `None` runs every time. Fails fast on a live claim.
    #[idempotent(key = key, caller = self.tenant, scope = "note", engine = self.idem, lease = "3s")]
    pub async fn note(&self, key: Option<&str>, work: Duration) -> Result<u64, PayError> {
        self.count_run(key.unwrap_or("<none>"));
        tokio::time::sleep(work).await;
        Ok(self.sequence.fetch_add(1, Ordering::SeqCst))
    }

    /// Returns a text of `len` bytes, to exceed the engine's response limit.
    #[idempotent(key = key, scope = "report", engine = self.idem)]
    pub async fn report(&self, key: &str, len: usize) -> Result<String, PayError> {
        self.count_run(key);
        Ok("x".repeat(len))
    }

    /// Like `pay`, detached: once claimed, the body runs to its end even if the caller is
    /// cancelled. It owns what it uses (`self: Arc<Self>`, the payment by value). The payment
    /// is the fingerprint: `started` is not part of the request (nor `Serialize`).
    #[idempotent(
        key = payment.key,
        caller = self.tenant,
        scope = "pay-detached",
        engine = self.idem,
        fingerprint = payment,
        on_locked = OnLocked::Wait { timeout: Duration::from_secs(60) },
        detach = true,
    )]
    pub async fn pay_detached(
        self: Arc<Self>,
        payment: Payment,
        started: tokio::sync::oneshot::Sender<()>,
    ) -> Result<Receipt, PayError> {
        self.count_run(&payment.key);
        let _ = started.send(());
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(Receipt {
            key: payment.key,
            cents: payment.cents,
            run: self.sequence.fetch_add(1, Ordering::SeqCst),
        })
    }

    pub fn runs(&self, key: &str) -> u32 {
        self.runs.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    pub fn total_runs(&self) -> u32 {
        self.runs.lock().unwrap().values().sum()
    }

    fn count_run(&self, key: &str) {
        *self.runs.lock().unwrap().entry(key.to_owned()).or_default() += 1;
    }
}

/// A charge of one order, numbered from a sequence shared by the `charge*` functions: two runs
/// never share a number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Charge {
    pub order_id: String,
    pub cents: u64,
    pub run: u64,
}

static CHARGES: AtomicU64 = AtomicU64::new(1);

fn new_charge(order_id: &str, cents: u64) -> Charge {
    Charge {
        order_id: order_id.to_owned(),
        cents,
        run: CHARGES.fetch_add(1, Ordering::SeqCst),
    }
}

/// No `fingerprint`: the engine, the caller and the key are parameters and left out, so the
/// default fingerprint hashes `cents` alone.
#[idempotent(key = order_id, caller = tenant, scope = "charge", engine = engine)]
pub async fn charge(
    engine: &Idempotency,
    tenant: &str,
    order_id: &str,
    cents: u64,
) -> Result<Charge, PayError> {
    Ok(new_charge(order_id, cents))
}

/// `fingerprint = ()`: no fingerprint, so any request under a key replays its result.
#[idempotent(key = order_id, scope = "charge-unchecked", engine = engine, fingerprint = ())]
pub async fn charge_unchecked(
    engine: &Idempotency,
    order_id: &str,
    cents: u64,
) -> Result<Charge, PayError> {
    Ok(new_charge(order_id, cents))
}

/// `fingerprint = cents`: the memo is not part of what identifies the request.
#[idempotent(key = order_id, scope = "charge-memo", engine = engine, fingerprint = cents)]
pub async fn charge_with_memo(
    engine: &Idempotency,
    order_id: &str,
    cents: u64,
    memo: String,
) -> Result<Charge, PayError> {
    Ok(Charge {
        order_id: format!("{order_id}: {memo}"),
        ..new_charge(order_id, cents)
    })
}

/// What the caller keeps about its attempts: not part of the request, nor `Serialize`.
#[derive(Default)]
pub struct Attempts {
    pub runs: AtomicU64,
    /// The trace id of the last call that ran the body.
    pub trace_id: AtomicU64,
}

/// `skip(attempts, trace_id)`: neither is hashed, so the default fingerprint is `cents` alone,
/// and `Attempts` need not be `Serialize`.
#[idempotent(key = order_id, scope = "charge-skip", engine = engine, skip(attempts, trace_id))]
pub async fn charge_counted(
    engine: &Idempotency,
    order_id: &str,
    cents: u64,
    attempts: &Attempts,
    trace_id: u64,
) -> Result<Charge, PayError> {
    attempts.runs.fetch_add(1, Ordering::SeqCst);
    attempts.trace_id.store(trace_id, Ordering::SeqCst);
    Ok(new_charge(order_id, cents))
}

/// A client key of the caller's own type, not `Serialize`.
pub struct OrderId(pub String);

impl AsRef<str> for OrderId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// `key = id.as_ref()`: the key is all of `id`, so `id` is left out of the default fingerprint
/// (`cents` alone) and its generic type need not be `Serialize`.
#[idempotent(key = id.as_ref(), scope = "ship", engine = engine)]
pub async fn ship<K: AsRef<str>>(
    engine: &Idempotency,
    id: K,
    cents: u64,
) -> Result<Charge, PayError> {
    Ok(new_charge(id.as_ref(), cents))
}

/// `key = format!(…)` of two arguments: both are left out, `cents` is hashed.
#[idempotent(key = format!("{tenant}/{}", order), scope = "label", engine = engine)]
pub async fn label(
    engine: &Idempotency,
    tenant: &str,
    order: u64,
    cents: u64,
) -> Result<Charge, PayError> {
    Ok(new_charge(&format!("{tenant}/{order}"), cents))
}

/// `key = payment.key.as_str()`: the key is one field of `payment`, whose rest (the amount) is
/// the request, so `payment` stays in the default fingerprint.
#[idempotent(key = payment.key.as_str(), scope = "pay-field", engine = engine)]
pub async fn pay_by_field(engine: &Idempotency, payment: Payment) -> Result<Charge, PayError> {
    Ok(new_charge(&payment.key, payment.cents))
}

/// The fingerprint the record of `key` under `scope` holds, its policy version set aside (see
/// [`policy_versions_tell_a_changed_fingerprint_from_a_reused_key`]).
async fn stored_fingerprint(h: &Harness, scope: &str, key: &str) -> Option<Fingerprint> {
    stored_versioned(h, scope, key)
        .await
        .map(|f| f.with_policy(0))
}

/// The fingerprint the record of `key` under `scope` holds, as stored.
async fn stored_versioned(h: &Harness, scope: &str, key: &str) -> Option<Fingerprint> {
    let key = Key::derive(scope, "", key).unwrap();
    h.engine
        .store()
        .get(&key)
        .await
        .unwrap()
        .unwrap()
        .fingerprint
}

/// `policy = 1`: the fingerprint of this deploy's request.
#[idempotent(key = order_id, scope = "charge-policy", engine = engine, policy = 1)]
pub async fn charge_v1(
    engine: &Idempotency,
    order_id: &str,
    cents: u64,
) -> Result<Charge, PayError> {
    Ok(new_charge(order_id, cents))
}

/// `policy = 2`: the next deploy, whose fingerprint reads the request another way (here the
/// amount in tenths).
#[idempotent(key = order_id, scope = "charge-policy", engine = engine, fingerprint = cents / 10, policy = 2)]
pub async fn charge_v2(
    engine: &Idempotency,
    order_id: &str,
    cents: u64,
) -> Result<Charge, PayError> {
    Ok(new_charge(order_id, cents))
}

/// `policy = …`: a retry across a deploy that changed what is fingerprinted gets
/// `PolicyChanged`, not `KeyReused`, and runs nothing; the record keeps the version it was
/// stored under. Without `policy`, the attribute derives a version from what it hashes: stable
/// from call to call, and not 0.
pub async fn policy_versions_tell_a_changed_fingerprint_from_a_reused_key(h: &Harness) {
    let first = charge_v1(&h.engine, "p-1", 100).await.unwrap();
    let across = charge_v2(&h.engine, "p-1", 100).await;
    assert!(
        matches!(
            across,
            Err(PayError::Idem(idem::Error::PolicyChanged {
                stored: 1,
                current: 2
            }))
        ),
        "{across:?}"
    );
    assert_eq!(
        stored_versioned(h, "charge-policy", "p-1")
            .await
            .map(|f| f.policy()),
        Some(1)
    );
    assert_eq!(charge_v1(&h.engine, "p-1", 100).await.unwrap(), first);
    charge(&h.engine, "acme", "d-1", 100).await.unwrap();
    let key = Key::derive("charge", "acme", "d-1").unwrap();
    let derived = h
        .engine
        .store()
        .get(&key)
        .await
        .unwrap()
        .unwrap()
        .fingerprint;
    let derived = derived.map(|f| f.policy());
    assert!(matches!(derived, Some(v) if v != 0), "{derived:?}");
    charge(&h.engine, "acme", "d-2", 100).await.unwrap();
    let key = Key::derive("charge", "acme", "d-2").unwrap();
    let again = h
        .engine
        .store()
        .get(&key)
        .await
        .unwrap()
        .unwrap()
        .fingerprint;
    assert_eq!(again.map(|f| f.policy()), derived);
}

/// `skip(…)`: the key reused with a skipped argument changed replays; with a hashed one changed
/// it is refused. The record's fingerprint is the hashed arguments alone.
pub async fn skipped_arguments_are_not_hashed(h: &Harness) {
    let attempts = Attempts::default();
    let first = charge_counted(&h.engine, "s-1", 100, &attempts, 1)
        .await
        .unwrap();
    let other_attempts = Attempts::default();
    let retry = charge_counted(&h.engine, "s-1", 100, &other_attempts, 2)
        .await
        .unwrap();
    assert_eq!(
        retry, first,
        "replayed: another trace id is the same request"
    );
    let reused = charge_counted(&h.engine, "s-1", 999, &attempts, 1).await;
    assert!(
        matches!(reused, Err(PayError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
    assert_eq!(attempts.runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(attempts.trace_id.load(Ordering::SeqCst), 1);
    assert_eq!(other_attempts.runs.load(Ordering::SeqCst), 0);
    let only_cents = Fingerprint::of_json(&serde_json::json!({ "cents": 100 })).unwrap();
    assert_eq!(
        stored_fingerprint(h, "charge-skip", "s-1").await,
        Some(only_cents)
    );
}

/// Arguments the key is built from whole (`id.as_ref()`, `format!`) are not hashed: the same key
/// replays whatever their type, another amount is refused. An argument the key reads a field
/// of stays hashed: the same key with another amount in it is refused.
pub async fn key_only_arguments_are_not_hashed(h: &Harness) {
    let only_cents = Fingerprint::of_json(&serde_json::json!({ "cents": 100 })).unwrap();

    let first = ship(&h.engine, OrderId("o-1".into()), 100).await.unwrap();
    let retry = ship(&h.engine, "o-1", 100).await.unwrap();
    assert_eq!(retry, first, "the same key text, another type: replayed");
    let reused = ship(&h.engine, "o-1", 999).await;
    assert!(
        matches!(reused, Err(PayError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
    assert_eq!(stored_fingerprint(h, "ship", "o-1").await, Some(only_cents));

    let first = label(&h.engine, "acme", 7, 100).await.unwrap();
    assert_eq!(label(&h.engine, "acme", 7, 100).await.unwrap(), first);
    let reused = label(&h.engine, "acme", 7, 999).await;
    assert!(
        matches!(reused, Err(PayError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
    assert_ne!(label(&h.engine, "acme", 8, 100).await.unwrap(), first);
    assert_eq!(
        stored_fingerprint(h, "label", "acme/7").await,
        Some(only_cents)
    );

    let first = pay_by_field(&h.engine, Payment::new("f-1", 100))
        .await
        .unwrap();
    let again = pay_by_field(&h.engine, Payment::new("f-1", 100))
        .await
        .unwrap();
    assert_eq!(again, first);
    let reused = pay_by_field(&h.engine, Payment::new("f-1", 999)).await;
    assert!(
        matches!(reused, Err(PayError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
    let payment = serde_json::json!({ "payment": { "key": "f-1", "cents": 100 } });
    let payment = Fingerprint::of_json(&payment).unwrap();
    assert_eq!(
        stored_fingerprint(h, "pay-field", "f-1").await,
        Some(payment)
    );
}

/// Without `fingerprint`, the key reused with another amount is refused, and the same
/// arguments replay.
pub async fn default_fingerprint_refuses_another_request(h: &Harness) {
    let first = charge(&h.engine, "acme", "o-1", 100).await.unwrap();
    let reused = charge(&h.engine, "acme", "o-1", 999).await;
    assert!(
        matches!(reused, Err(PayError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
    let again = charge(&h.engine, "acme", "o-1", 100).await.unwrap();
    assert_eq!(again, first, "replayed, not run again");
    assert_eq!(h.record_count().await, 1);
}

/// `fingerprint = ()` replays the first result whatever the arguments.
pub async fn unit_fingerprint_replays_any_request(h: &Harness) {
    let first = charge_unchecked(&h.engine, "o-2", 100).await.unwrap();
    let other = charge_unchecked(&h.engine, "o-2", 999).await.unwrap();
    assert_eq!(other, first);
    assert_eq!(other.cents, 100);
}

/// An explicit `fingerprint` wins over the default: another memo replays, another amount is
/// refused.
pub async fn explicit_fingerprint_wins(h: &Harness) {
    let first = charge_with_memo(&h.engine, "o-3", 100, "first".into())
        .await
        .unwrap();
    let other_memo = charge_with_memo(&h.engine, "o-3", 100, "second".into())
        .await
        .unwrap();
    assert_eq!(other_memo, first);
    let reused = charge_with_memo(&h.engine, "o-3", 999, "first".into()).await;
    assert!(
        matches!(reused, Err(PayError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
}

/// The default fingerprint is the arguments less the engine, the caller and the key: the
/// record holds the fingerprint of `{"cents": 100}`, whichever caller made it, and a call
/// through another engine on the same store replays it.
pub async fn default_fingerprint_leaves_out_engine_key_and_caller(h: &Harness) {
    let only_cents = Fingerprint::of_json(&serde_json::json!({ "cents": 100 })).unwrap();
    let acme = charge(&h.engine, "acme", "o-4", 100).await.unwrap();
    let globex = charge(&h.engine, "globex", "o-4", 100).await.unwrap();
    assert_ne!(acme, globex, "two callers, two records");
    for tenant in ["acme", "globex"] {
        let key = Key::derive("charge", tenant, "o-4").unwrap();
        let record = h.engine.store().get(&key).await.unwrap().unwrap();
        let digest = record.fingerprint.map(|f| f.with_policy(0));
        assert_eq!(digest, Some(only_cents), "{tenant}");
    }
    let through_another_engine = charge(&h.second_engine, "acme", "o-4", 100).await.unwrap();
    assert_eq!(through_another_engine, acme);
    let reused = charge(&h.second_engine, "acme", "o-4", 999).await;
    assert!(
        matches!(reused, Err(PayError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
}

/// 1,000 concurrent calls over 20 keys run the body 20 times, and every caller of one key gets
/// the same receipt.
pub async fn duplicate_storm(h: &Harness, work: Duration) {
    let service = h.service("acme");
    let mut calls = JoinSet::new();
    for i in 0..1_000u64 {
        let service = service.clone();
        let key = format!("order-{}", i % 20);
        calls.spawn(async move {
            let receipt = service.pay(Payment::new(key.clone(), 100), work).await;
            (key, receipt)
        });
    }
    let mut receipts: HashMap<String, Vec<Receipt>> = HashMap::new();
    while let Some(joined) = calls.join_next().await {
        let (key, receipt) = joined.expect("a call panicked");
        let receipt = receipt.unwrap_or_else(|e| panic!("call for {key} failed: {e}"));
        receipts.entry(key).or_default().push(receipt);
    }
    assert_eq!(service.total_runs(), 20, "the body ran once per key");
    assert_eq!(receipts.len(), 20);
    for (key, got) in &receipts {
        assert_eq!(got.len(), 50);
        assert_eq!(service.runs(key), 1, "{key} ran more than once");
        assert!(
            got.iter().all(|r| r == &got[0]),
            "{key} got different receipts"
        );
        assert_eq!(got[0].key, *key);
    }
    assert_eq!(h.record_count().await, 20);
}

/// An `Err` from the body releases the claim: the retry runs, and its success is then replayed.
pub async fn error_releases_the_claim(h: &Harness) {
    let service = h.service("acme");
    let declined = service.pay(Payment::new("p-1", 0), Duration::ZERO).await;
    assert!(matches!(declined, Err(PayError::Declined)), "{declined:?}");
    assert_eq!(h.record_count().await, 0, "a failed call stores nothing");
    let paid = service.pay(Payment::new("p-1", 0), Duration::ZERO).await;
    assert!(
        matches!(paid, Err(PayError::Declined)),
        "the retry ran again"
    );
    let paid = service
        .pay(Payment::new("p-1", 250), Duration::ZERO)
        .await
        .unwrap();
    let replayed = service
        .pay(Payment::new("p-1", 250), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(paid, replayed);
    assert_eq!(service.runs("p-1"), 3);
}

/// The same key with another payload is refused with `KeyReused`, through the user's error type.
pub async fn fingerprint_mismatch_is_key_reused(h: &Harness) {
    let service = h.service("acme");
    let first = service
        .pay(Payment::new("p-2", 100), Duration::ZERO)
        .await
        .unwrap();
    let reused = service.pay(Payment::new("p-2", 999), Duration::ZERO).await;
    assert!(
        matches!(reused, Err(PayError::Idem(idem::Error::KeyReused))),
        "{reused:?}"
    );
    assert_eq!(service.runs("p-2"), 1);
    let again = service
        .pay(Payment::new("p-2", 100), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(first, again, "the stored result is untouched");
}

/// Malformed client keys and callers get a typed error; the body does not run and nothing is
/// stored. A space is printable ASCII, so a key that holds one is a key like any other (the
/// alphabet of docs/architecture.md, "The key").
pub async fn invalid_keys_change_nothing(h: &Harness) {
    let service = h.service("acme");
    let too_long = "k".repeat(256);
    let part = "client key";
    let cases = [
        ("", KeyError::Empty { part }),
        (too_long.as_str(), KeyError::TooLong { part, len: 256 }),
        (
            "tab\there",
            KeyError::NotPrintable {
                part,
                byte: b'\t',
                offset: 3,
            },
        ),
    ];
    for (key, expected) in cases {
        let got = service.pay(Payment::new(key, 100), Duration::ZERO).await;
        match got {
            Err(PayError::Idem(idem::Error::InvalidKey(e))) => assert_eq!(e, expected),
            other => panic!("key {key:?}: unexpected {other:?}"),
        }
    }
    let bad_caller = h.service("tenant\n");
    let got = bad_caller
        .pay(Payment::new("p-3", 100), Duration::ZERO)
        .await;
    assert!(
        matches!(
            got,
            Err(PayError::Idem(idem::Error::InvalidKey(
                KeyError::NotPrintable { part: "caller", .. }
            )))
        ),
        "{got:?}"
    );
    assert_eq!(service.total_runs() + bad_caller.total_runs(), 0);
    assert_eq!(h.record_count().await, 0);

    let spaced = Payment::new(" order 42 ", 100);
    let first = service.pay(spaced.clone(), Duration::ZERO).await.unwrap();
    let again = service.pay(spaced, Duration::ZERO).await.unwrap();
    assert_eq!(again, first, "replayed, not run again");
    assert_eq!(service.runs(" order 42 "), 1);
    assert_eq!(h.record_count().await, 1);
}

/// A result over the engine's size limit is returned but not kept: the key is recorded as
/// completed without it, and a retry gets a typed error instead of running the body again.
/// The harness's engine must limit responses to fewer than 1,000 bytes.
pub async fn oversized_response_is_not_run_again(h: &Harness) {
    let service = h.service("acme");
    let first = service.report("big", 1_000).await.unwrap();
    assert_eq!(first.len(), 1_000, "the caller gets its result");
    for _ in 0..2 {
        let got = service.report("big", 1_000).await;
        assert!(
            matches!(
                &got,
                Err(PayError::Idem(idem::Error::ResultNotRetained { reason }))
                    if reason.contains("1002 bytes")
            ),
            "{got:?}"
        );
    }
    assert_eq!(service.runs("big"), 1, "the body ran once");
    assert_eq!(h.record_count().await, 1);
    assert_eq!(service.report("small", 3).await.unwrap(), "xxx");
    assert_eq!(h.record_count().await, 2);
}

/// A call cancelled by `timeout` (sometimes in its claim, sometimes in its body) and retried at
/// once, fail fast, 300 times: the retry never meets its own cancelled claim as `Locked`.
pub async fn cancelled_then_retried_is_never_locked(h: &Harness) {
    let service = h.service("acme");
    for i in 0..300u64 {
        let key = format!("cut-{i}");
        let cut = Duration::from_millis(i % 4);
        let cancelled =
            tokio::time::timeout(cut, service.note(Some(&key), Duration::from_secs(3600))).await;
        assert!(cancelled.is_err(), "round {i}: not cancelled");
        match service.note(Some(&key), Duration::ZERO).await {
            Ok(_) => {}
            Err(e) => panic!("round {i}: the retry failed: {e}"),
        }
    }
}

/// `detach = true`: the caller gives up once the body started; the body runs on, and the retry
/// replays its receipt. The body ran once.
pub async fn detached_body_survives_its_caller(h: &Harness) {
    let service = h.service("acme");
    let (started, started_rx) = tokio::sync::oneshot::channel();
    let call = service
        .clone()
        .pay_detached(Payment::new("d-1", 700), started);
    tokio::select! {
        biased;
        _ = started_rx => {}
        out = call => panic!("finished before it started: {out:?}"),
    }
    let (unused, _) = tokio::sync::oneshot::channel();
    let retry = service
        .clone()
        .pay_detached(Payment::new("d-1", 700), unused)
        .await
        .unwrap();
    assert_eq!(retry.cents, 700);
    assert_eq!(service.runs("d-1"), 1);
}

/// A `None` key runs the body on every call and stores nothing.
pub async fn no_key_runs_every_time(h: &Harness) {
    let service = h.service("acme");
    let a = service.note(None, Duration::ZERO).await.unwrap();
    let b = service.note(None, Duration::ZERO).await.unwrap();
    assert_ne!(a, b);
    assert_eq!(service.runs("<none>"), 2);
    assert_eq!(h.record_count().await, 0);
    let c = service.note(Some("n-1"), Duration::ZERO).await.unwrap();
    let d = service.note(Some("n-1"), Duration::ZERO).await.unwrap();
    assert_eq!(c, d);
    assert_eq!(h.record_count().await, 1);
}

/// A call dropped mid-body releases its claim, so the next call runs instead of waiting for the
/// lease to end.
pub async fn cancelled_call_releases_its_claim(h: &Harness) {
    let service = h.service("acme");
    let cancelled = tokio::time::timeout(
        Duration::from_millis(100),
        service.note(Some("n-2"), Duration::from_secs(3_600)),
    )
    .await;
    assert!(cancelled.is_err(), "the call should have been cancelled");
    assert_eq!(service.runs("n-2"), 1);
    // The release runs in a spawned task: give it a bounded number of turns.
    let key = Key::derive("note", "acme", "n-2").unwrap();
    let mut released = false;
    for _ in 0..100 {
        if h.engine.store().get(&key).await.unwrap().is_none() {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(released, "the claim was not released");
    service.note(Some("n-2"), Duration::ZERO).await.unwrap();
    assert_eq!(service.runs("n-2"), 2);
}

/// Two tenants sending the same client key never share a record: `caller = self.tenant`.
pub async fn callers_do_not_share_records(h: &Harness) {
    let acme = h.service("acme");
    let globex = h.service("globex");
    for _ in 0..2 {
        acme.pay(Payment::new("same", 100), Duration::ZERO)
            .await
            .unwrap();
        globex
            .pay(Payment::new("same", 100), Duration::ZERO)
            .await
            .unwrap();
    }
    assert_eq!(acme.runs("same"), 1);
    assert_eq!(
        globex.runs("same"),
        1,
        "globex did not replay acme's result"
    );
    assert_eq!(h.record_count().await, 2);
}
