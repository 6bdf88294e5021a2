//! A completion that fails for a passing reason is retried in the background and must not lose
//! its key (docs/never-twice.md, "The store goes away after the work ran"):
//!
//! - while the store answers renewals, the lease is renewed on its own schedule whatever the
//!   pause between two tries, so no caller, in this process or another, claims the key;
//! - a call of this process that meets the pending completion waits for it and replays its
//!   result: it never claims, even once the lease has run out in the store;
//! - what cannot be prevented, counted: another process whose retry reaches the store after an
//!   outage longer than the lease claims the key and runs the work a second time.
//!
//! On a store that injects faults, under tokio's paused clock (the memory store follows it through
//! `TokioClock`): deterministic, and seconds of leases cost no wall time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{
    Error, Idempotency, Key, MemoryStore, Outcome, Store, StoreError, StoreErrorKind, TokioClock,
};
use idem_test_support::forward::{Forward, Forwarding, Op};
use tokio::time::Instant;

/// A memory store that fails, with a passing error, every operation while it is down and every
/// completion while completions fail.
struct Faulty {
    inner: MemoryStore,
    down_until: Mutex<Option<Instant>>,
    /// Down until switched back on: the store comes back at an exact point of the test, with
    /// no background timer due at the same instant.
    switched_off: std::sync::atomic::AtomicBool,
    completions_fail_until: Mutex<Option<Instant>>,
}

impl Faulty {
    fn new() -> Forwarding<Faulty> {
        Forwarding(Faulty {
            inner: MemoryStore::with_clock(TokioClock::new()),
            down_until: Mutex::new(None),
            switched_off: std::sync::atomic::AtomicBool::new(false),
            completions_fail_until: Mutex::new(None),
        })
    }

    /// Unreachable for `d` from now.
    fn down_for(&self, d: Duration) {
        *self.down_until.lock().unwrap() = Some(Instant::now() + d);
    }

    /// Completions fail for `d` from now; everything else works.
    fn completions_fail_for(&self, d: Duration) {
        *self.completions_fail_until.lock().unwrap() = Some(Instant::now() + d);
    }

    fn check(&self, until: &Mutex<Option<Instant>>) -> Result<(), Error> {
        match *until.lock().unwrap() {
            Some(t) if Instant::now() < t => Err(Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                "injected: the store is unreachable",
            ))),
            _ => Ok(()),
        }
    }

    /// Unreachable (`true`) until switched back on (`false`).
    fn switch_off(&self, off: bool) {
        self.switched_off.store(off, Ordering::SeqCst);
    }

    fn up(&self) -> Result<(), Error> {
        if self.switched_off.load(Ordering::SeqCst) {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                "injected: the store is switched off",
            )));
        }
        self.check(&self.down_until)
    }
}

impl Forward for Faulty {
    fn records(&self) -> &dyn Store {
        &self.inner
    }

    fn gate(&self, op: Op) -> Result<(), Error> {
        self.up()?;
        if op == Op::Complete {
            self.check(&self.completions_fail_until)?;
        }
        Ok(())
    }
}

fn key() -> Key {
    Key::derive("charge", "customer-7", "order-1").unwrap()
}

fn engine(store: &Arc<Forwarding<Faulty>>, lease: Duration) -> Idempotency {
    Idempotency::builder(store.clone())
        .lease(lease)
        .build()
        .unwrap()
}

/// How often the work ran, and what each caller got.
#[derive(Default)]
struct Tally {
    runs: AtomicUsize,
}

impl Tally {
    /// One call of the charge: the work returns 100 + how many times it ran before.
    async fn call(&self, engine: &Idempotency) -> Result<Outcome<u64>, Error> {
        engine
            .call(key())
            .run(async { Ok::<_, Error>(100 + self.runs.fetch_add(1, Ordering::SeqCst) as u64) })
            .await
    }

    /// The first charge, whose work takes the store away for `outage` as it ends: its completion
    /// fails, and the caller gets its result all the same.
    async fn charge_then_outage(&self, engine: &Idempotency, store: &Faulty, outage: Duration) {
        let first = engine
            .call(key())
            .run(async {
                store.down_for(outage);
                Ok::<_, Error>(100 + self.runs.fetch_add(1, Ordering::SeqCst) as u64)
            })
            .await
            .unwrap();
        assert_eq!(first, Outcome::Fresh(100));
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// Completions fail for 5 s with a 2 s lease, while renewals work: the pause between two tries
/// grows past the lease, but the lease is renewed on its own schedule, so the key stays this
/// process's. Retries every 100 ms for 10 s, from this process and from another, never run the
/// work again: this process's get the one result, the other's get `Locked` until it landed and
/// then the replay.
#[tokio::test(start_paused = true)]
async fn completions_failing_longer_than_the_lease_keep_the_key() {
    let store = Arc::new(Faulty::new());
    let lease = Duration::from_secs(2);
    let (here, elsewhere) = (engine(&store, lease), engine(&store, lease));
    let tally = Tally::default();

    store.completions_fail_for(Duration::from_secs(5));
    let first = tally.call(&here).await.unwrap();
    assert_eq!(
        first,
        Outcome::Fresh(100),
        "the caller gets its real result"
    );

    let (mut locked_elsewhere, mut replayed_elsewhere) = (0, 0);
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = tally.call(&here).await.unwrap();
        assert_eq!(again, Outcome::Replayed(100), "a retry in this process");
        match tally.call(&elsewhere).await {
            Err(Error::Locked { .. }) => locked_elsewhere += 1,
            Ok(Outcome::Replayed(100)) => replayed_elsewhere += 1,
            other => panic!("a retry in another process got {other:?}"),
        }
        assert_eq!(tally.runs(), 1, "the work ran twice");
    }
    assert!(locked_elsewhere > 0 && replayed_elsewhere > 0);
    let Some(record) = store.get(&key()).await.unwrap() else {
        panic!("the result was lost");
    };
    assert!(matches!(record.state, idem_core::RecordState::Completed(_)));
}

/// The store is down for 4 s right after the work, with a 3 s lease: renewals fail too, so the
/// lease runs out in the store. A retry of this process 50 ms after the store is back, and every
/// 50 ms after, meets the completion still pending here: it waits for it and replays, never
/// claims. One execution, one answer.
#[tokio::test(start_paused = true)]
async fn a_retry_here_after_an_outage_longer_than_the_lease_replays_the_pending_result() {
    let store = Arc::new(Faulty::new());
    let lease = Duration::from_secs(3);
    let here = engine(&store, lease);
    let tally = Tally::default();
    let outage = Duration::from_secs(4);

    tally.charge_then_outage(&here, &store, outage).await;

    // Retries during the outage and after it: each replays the one result.
    let began = Instant::now();
    while began.elapsed() < outage + Duration::from_secs(6) {
        let again = tally.call(&here).await.unwrap();
        assert_eq!(again, Outcome::Replayed(100), "at {:?}", began.elapsed());
        assert_eq!(tally.runs(), 1, "the work ran twice");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(record) = store.get(&key()).await.unwrap() else {
        panic!("the result was lost");
    };
    assert!(matches!(record.state, idem_core::RecordState::Completed(_)));
}

/// The same outage, with the retry coming from another process (another engine over the store)
/// 50 ms after the store is back: the lease ran out during the outage, so that retry claims the
/// key and runs the work again. This is the one case no process can prevent alone; the docs
/// state it, with the rule that prevents it (a lease longer than the outages to ride out). The
/// test counts it: exactly one more execution, in the other process; this process's callers
/// keep getting their result while its completion is pending, and the completion, refused by
/// the store (the key was taken over), does not overwrite the other execution's result.
#[tokio::test(start_paused = true)]
async fn another_process_after_an_outage_longer_than_the_lease_runs_again() {
    let store = Arc::new(Faulty::new());
    let lease = Duration::from_secs(3);
    let (here, elsewhere) = (engine(&store, lease), engine(&store, lease));
    let tally = Tally::default();

    let first = here
        .call(key())
        .run(async {
            store.switch_off(true);
            Ok::<_, Error>(100 + tally.runs.fetch_add(1, Ordering::SeqCst) as u64)
        })
        .await
        .unwrap();
    assert_eq!(first, Outcome::Fresh(100));

    // Four seconds down: every renewal and completion try fails, the lease runs out at 3 s. The
    // store comes back and the other process's retry reaches it first: switched on and claimed
    // in one step of this task, before any background timer of this process runs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    store.switch_off(false);
    let other = tally.call(&elsewhere).await.unwrap();
    assert_eq!(
        other,
        Outcome::Fresh(101),
        "the documented case: the work ran a second time, in the other process"
    );
    assert_eq!(tally.runs(), 2);

    // Well past the pending completion's retries: the store keeps the other execution's result,
    // and every caller now replays it; nothing ran a third time.
    tokio::time::sleep(lease * 4).await;
    for engine in [&here, &elsewhere] {
        assert_eq!(tally.call(engine).await.unwrap(), Outcome::Replayed(101));
    }
    assert_eq!(tally.runs(), 2);
}

/// A pending completion answers a call with another fingerprint as the store would: the key was
/// reused for another request.
#[tokio::test(start_paused = true)]
async fn a_pending_result_refuses_a_reused_key() {
    let store = Arc::new(Faulty::new());
    let here = engine(&store, Duration::from_secs(3));
    let (a, b) = (
        idem_core::Fingerprint::of_bytes(b"a"),
        idem_core::Fingerprint::of_bytes(b"b"),
    );
    store.completions_fail_for(Duration::from_secs(10));
    here.call(key())
        .fingerprint(a)
        .run(async { Ok::<_, Error>(1u64) })
        .await
        .unwrap();
    let reused = here
        .call(key())
        .fingerprint(b)
        .run(async { Ok::<_, Error>(2u64) })
        .await;
    assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
    let same = here
        .call(key())
        .fingerprint(a)
        .run(async { Ok::<_, Error>(3u64) })
        .await
        .unwrap();
    assert_eq!(same, Outcome::Replayed(1));
}
