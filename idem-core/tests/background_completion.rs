//! A completion that fails for a passing reason is retried in the background and must not lose
//! its key (docs/never-twice.md, "The store goes away after the work ran"):
//!
//! - while the store answers renewals, the lease is renewed on its own schedule whatever the
//!   pause between two tries, so no caller, in this process or another, claims the key;
//! - a call of this process that meets the pending completion never claims, even once the lease
//!   has run out in the store: it follows its `on_locked` policy, failing fast with `Locked` and
//!   the completion's next try as `retry_after`, or waiting at most its timeout for the
//!   completion and then replaying its result;
//! - a lapsed holder, with nobody having claimed the key since, completes when the store is
//!   back, however long the outage (`LAPSED_CLAIMS_KEPT`), even with the store pruned;
//! - what cannot be prevented, counted: another process whose retry reaches the store after an
//!   outage longer than the lease claims the key and runs the work a second time.
//!
//! On a store that injects faults, under tokio's paused clock (the memory store follows it through
//! `TokioClock`): deterministic, and seconds of leases cost no wall time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{Forward, Forwarding, Operation};
use idem_core::{
    Error, Idempotency, Key, MemoryStore, OnLocked, Outcome, Store, StoreError, StoreErrorKind,
    TokioClock,
};
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
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    fn gate(&self, op: Operation) -> Result<(), Error> {
        self.up()?;
        if op == Operation::Complete {
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
/// work again: both get `Locked` (fail fast, the default) until it landed, and then the replay.
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

    let (mut locked_here, mut replayed_here) = (0, 0);
    let (mut locked_elsewhere, mut replayed_elsewhere) = (0, 0);
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match tally.call(&here).await {
            // The completion's next try is at most a third of the lease away.
            Err(Error::Locked { retry_after }) if retry_after <= lease / 3 => locked_here += 1,
            Ok(Outcome::Replayed(100)) => replayed_here += 1,
            other => panic!("a retry in this process got {other:?}"),
        }
        match tally.call(&elsewhere).await {
            Err(Error::Locked { .. }) => locked_elsewhere += 1,
            Ok(Outcome::Replayed(100)) => replayed_elsewhere += 1,
            other => panic!("a retry in another process got {other:?}"),
        }
        assert_eq!(tally.runs(), 1, "the work ran twice");
    }
    assert!(locked_here > 0 && replayed_here > 0);
    assert!(locked_elsewhere > 0 && replayed_elsewhere > 0);
    let Some(record) = store.get(&key()).await.unwrap() else {
        panic!("the result was lost");
    };
    assert!(matches!(record.state, idem_core::RecordState::Completed(_)));
}

/// The store is down for 4 s right after the work, with a 3 s lease: renewals fail too, so the
/// lease runs out in the store. Retries of this process every 50 ms, during the outage and after
/// it, meet the completion still pending here: failing fast (the default), each is `Locked` at
/// once, with the completion's next try (1 s, a third of the lease) as `retry_after`, until the
/// completion lands; from then on each replays. None waits, none claims: one execution, one
/// answer, and the result is in the store.
#[tokio::test(start_paused = true)]
async fn a_retry_here_after_an_outage_longer_than_the_lease_fails_fast_then_replays() {
    let store = Arc::new(Faulty::new());
    let lease = Duration::from_secs(3);
    let here = engine(&store, lease);
    let tally = Tally::default();
    let outage = Duration::from_secs(4);

    tally.charge_then_outage(&here, &store, outage).await;

    let began = Instant::now();
    let (mut locked, mut replayed) = (0, 0);
    while began.elapsed() < outage + Duration::from_secs(6) {
        let asked = Instant::now();
        match tally.call(&here).await {
            Err(Error::Locked { retry_after }) => {
                assert_eq!(retry_after, Duration::from_secs(1));
                assert_eq!(
                    replayed,
                    0,
                    "Locked after a replay, at {:?}",
                    began.elapsed()
                );
                locked += 1;
            }
            Ok(Outcome::Replayed(100)) => replayed += 1,
            other => panic!("at {:?}: {other:?}", began.elapsed()),
        }
        assert_eq!(asked.elapsed(), Duration::ZERO, "a fail-fast call waited");
        assert_eq!(tally.runs(), 1, "the work ran twice");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        locked > 0 && replayed > 0,
        "{locked} locked, {replayed} replayed"
    );
    let Some(record) = store.get(&key()).await.unwrap() else {
        panic!("the result was lost");
    };
    assert!(matches!(record.state, idem_core::RecordState::Completed(_)));
}

/// The same outage, with retries of this process that wait (`OnLocked::Wait`): one with a 500 ms
/// timeout during the outage answers `Locked` after exactly 500 ms, not a lease; one with a 10 s
/// timeout made during the outage returns the replay as soon as the completion lands, within its
/// timeout. Neither claims: one execution.
#[tokio::test(start_paused = true)]
async fn a_waiting_retry_here_waits_at_most_its_timeout_for_a_pending_completion() {
    let store = Arc::new(Faulty::new());
    let lease = Duration::from_secs(3);
    let here = engine(&store, lease);
    let tally = Tally::default();
    let outage = Duration::from_secs(4);
    let began = Instant::now();

    tally.charge_then_outage(&here, &store, outage).await;

    let here = &here;
    let wait = |timeout| async move {
        let asked = Instant::now();
        let out = here
            .call(key())
            .on_locked(OnLocked::Wait { timeout })
            .run(async { Ok::<_, Error>(999u64) })
            .await;
        (out, asked.elapsed())
    };
    let (short, waited) = wait(Duration::from_millis(500)).await;
    assert!(
        matches!(short, Err(Error::Locked { retry_after }) if retry_after == Duration::from_secs(1)),
        "{short:?}"
    );
    assert_eq!(waited, Duration::from_millis(500));

    let (long, waited) = wait(Duration::from_secs(10)).await;
    assert_eq!(long.unwrap(), Outcome::Replayed(100));
    assert!(waited < Duration::from_secs(10), "waited {waited:?}");
    // Landed within one try's pause (at most 1 s) of the store coming back.
    assert!(
        began.elapsed() <= outage + Duration::from_secs(1),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(tally.runs(), 1, "the work ran twice");
    let Some(record) = store.get(&key()).await.unwrap() else {
        panic!("the result was lost");
    };
    assert!(matches!(record.state, idem_core::RecordState::Completed(_)));
}

/// The store is down for 40 s with a 3 s lease (thirteen leases), and pruned as the store comes
/// back: the lapsed claim, which nobody took over, is kept (`LAPSED_CLAIMS_KEPT`), so the
/// pending completion lands and the answer the caller got is the one stored.
#[tokio::test(start_paused = true)]
async fn a_lapsed_holder_completes_after_a_long_outage_and_a_prune() {
    let store = Arc::new(Faulty::new());
    let lease = Duration::from_secs(3);
    let here = engine(&store, lease);
    let tally = Tally::default();
    let outage = Duration::from_secs(40);

    tally.charge_then_outage(&here, &store, outage).await;
    tokio::time::sleep(outage).await;
    // Nothing pruned: the claim lapsed 37 s ago, a late holder may still complete it.
    assert_eq!(store.0.inner.prune_expired(1_000).await.unwrap(), 0);
    // Bounded: the completion's next try is at most a third of the lease away.
    for _ in 0..100 {
        if let Some(record) = store.get(&key()).await.unwrap()
            && matches!(record.state, idem_core::RecordState::Completed(_))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(tally.call(&here).await.unwrap(), Outcome::Replayed(100));
    assert_eq!(tally.runs(), 1, "the work ran twice");
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
    // The same request is `Locked` while the completion is pending (failing fast), and waiting
    // for it replays its result.
    let same = here
        .call(key())
        .fingerprint(a)
        .run(async { Ok::<_, Error>(3u64) })
        .await;
    assert!(matches!(same, Err(Error::Locked { .. })), "{same:?}");
    let same = here
        .call(key())
        .fingerprint(a)
        .on_locked(OnLocked::Wait {
            timeout: Duration::from_secs(20),
        })
        .run(async { Ok::<_, Error>(3u64) })
        .await
        .unwrap();
    assert_eq!(same, Outcome::Replayed(1));
}
