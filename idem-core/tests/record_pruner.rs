//! The background pruner of idempotency records: what a run deletes, its pacing, its lease, a
//! spawned pruner's schedule and shutdown, and its configuration. The memory tests run on a
//! paused tokio clock (pauses and intervals are exact) with a [`ManualClock`] for record
//! expiry, so the two move independently, on a [`TestStore`] that keeps the pruner's counts
//! exact; the SQL tests wait out short leases for real.

use idem_sql::sqlx;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Forward, Forwarding};
use idem_core::{
    Claim, ClaimOutcome, ClaimRequest, Completion, Error, Key, ManualClock, MemoryStore,
    PruneReport, Pruner, PrunerConfig, Record, Store, StoreError, StoreErrorKind,
};
use tokio::time::Instant;

const SHORT: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(3600);
const PAUSE: Duration = Duration::from_millis(20);

fn key(scope: &str, n: usize) -> Key {
    Key::derive(scope, "", &format!("k{n}")).unwrap()
}

async fn claim(store: &dyn Store, key: &Key, lease: Duration) -> Claim {
    match store.claim(ClaimRequest::new(key, lease)).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

fn done(retention: Duration) -> Completion<'static> {
    Completion {
        response: Some(b"ok"),
        is_error: false,
        retention,
        key_retention: Duration::ZERO,
    }
}

/// Adds `n` completed records whose retention ends in [`SHORT`]. (A claim whose lease ends is
/// not the pruner's before `LAPSED_CLAIMS_KEPT` has passed too: its holder may still complete
/// it; `a_record_pruner_leaves_a_lapsed_claim_to_its_holder` shows that.)
async fn add_expiring(store: &dyn Store, scope: &str, n: usize) {
    for i in 0..n {
        let c = claim(store, &key(scope, i), LONG).await;
        store.complete(&c, done(SHORT)).await.unwrap();
    }
}

/// Adds `n` records that stay live for [`LONG`]: half running claims, half completed.
async fn add_live(store: &dyn Store, scope: &str, n: usize) -> Vec<Key> {
    let mut keys = Vec::new();
    for i in 0..n {
        let k = key(scope, i);
        let c = claim(store, &k, LONG).await;
        if i % 2 == 1 {
            store.complete(&c, done(LONG)).await.unwrap();
        }
        keys.push(k);
    }
    keys
}

/// The record that is the records' pruners' lease (documented on `Pruner::records`).
fn lease_key() -> Key {
    Key::derive("idem.pruner", "", "records").unwrap()
}

/// The records of a memory store, with the pruners' lease in a memory store of its own.
///
/// A memory store frees a few expired records by itself in every mutating call, so on one store
/// the lease's own claims and renewals would free records that these tests count the pruner
/// deleting. With the lease kept apart, nothing but the pruner touches the records once they
/// have expired. `prune_expired` fails while `failing` is set, and `prune_calls` counts its
/// calls.
struct TestStore {
    records: MemoryStore,
    leases: MemoryStore,
    failing: AtomicBool,
    prune_calls: AtomicU32,
    /// How long each `prune_expired` takes (on the paused tokio clock), in microseconds; a
    /// test may change it midway.
    prune_cost: AtomicU64,
    /// What `prune_batch_size` says.
    batch: AtomicU32,
}

impl TestStore {
    /// Records held, the lease aside.
    fn len(&self) -> usize {
        self.records.len()
    }

    /// The store that keeps `key`: the lease's own for the lease, the records' for the rest.
    fn route(&self, key: &Key) -> &MemoryStore {
        if *key == lease_key() {
            &self.leases
        } else {
            &self.records
        }
    }
}

/// The operations on one key go where [`TestStore::route`] says; the pruner's go to the records.
#[async_trait]
impl Forward for TestStore {
    fn inner(&self) -> &dyn Store {
        &self.records
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        self.route(request.key).claim(request).await
    }

    async fn complete(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error> {
        self.route(claim.key()).complete(claim, completion).await
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        self.route(claim.key()).abort(claim).await
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        self.route(claim.key()).renew(claim, lease).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        self.route(key).get(key).await
    }

    async fn evict(&self, key: &Key) -> Result<bool, Error> {
        self.route(key).evict(key).await
    }

    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        self.prune_calls.fetch_add(1, Ordering::SeqCst);
        let cost = Duration::from_micros(self.prune_cost.load(Ordering::SeqCst));
        if !cost.is_zero() {
            tokio::time::sleep(cost).await;
        }
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                "the database is down",
            )));
        }
        self.records.prune_expired(limit).await
    }

    fn prune_batch_size(&self) -> u32 {
        self.batch.load(Ordering::SeqCst)
    }
}

/// An empty [`TestStore`] on `clock` whose `prune_expired` takes `cost`.
fn test_store(clock: &ManualClock, cost: Duration) -> Arc<Forwarding<TestStore>> {
    Arc::new(Forwarding(TestStore {
        records: MemoryStore::with_clock(clock.clone()),
        leases: MemoryStore::with_clock(clock.clone()),
        failing: AtomicBool::new(false),
        prune_calls: AtomicU32::new(0),
        prune_cost: AtomicU64::new(u64::try_from(cost.as_micros()).unwrap()),
        batch: AtomicU32::new(PrunerConfig::DEFAULT_BATCH_SIZE),
    }))
}

/// A [`TestStore`] on a manual clock holding `expired` expired records and `live` live ones.
/// The clock moves after the last record is added, so no call frees an expired one.
async fn memory_store(
    expired: usize,
    live: usize,
) -> (Arc<Forwarding<TestStore>>, ManualClock, Vec<Key>) {
    let clock = ManualClock::new();
    let store = test_store(&clock, Duration::ZERO);
    add_expiring(&*store, "expired", expired).await;
    let live = add_live(&*store, "live", live).await;
    clock.advance(SHORT * 2);
    (store, clock, live)
}

/// Starts `pruner`'s run in a task and returns in its first pause, after its first batch.
async fn run_into_first_pause(pruner: Pruner) -> tokio::task::JoinHandle<PruneReport> {
    let running = tokio::spawn(async move { pruner.run_once().await.unwrap() });
    tokio::time::sleep(PAUSE / 2).await;
    running
}

fn config(batch_size: u32) -> PrunerConfig {
    PrunerConfig::new().batch_size(batch_size).pause(PAUSE)
}

#[tokio::test(start_paused = true)]
async fn a_run_deletes_exactly_the_expired_records_in_batches() {
    let (store, _clock, live) = memory_store(250, 40).await;
    let pruner = Pruner::records(store.clone(), config(100)).unwrap();

    let report = pruner.run_once().await.unwrap();

    assert_eq!(report.deleted, 250);
    assert_eq!(report.batches, 3, "ceil(250 / 100) batches");
    assert!(report.drained);
    assert_eq!(store.len(), 40);
    for k in &live {
        assert!(
            store.get(k).await.unwrap().is_some(),
            "a live record was pruned"
        );
    }
    let again = pruner.run_once().await.unwrap();
    assert_eq!((again.deleted, again.batches, again.drained), (0, 0, true));
}

#[tokio::test(start_paused = true)]
async fn pauses_come_between_full_batches_only() {
    // 250 records: full, full, short, so two pauses. Memory prunes take no tokio time, so the
    // elapsed time is exactly the pauses.
    let (store, _clock, _) = memory_store(250, 0).await;
    let started = Instant::now();
    let report = Pruner::records(store, config(100))
        .unwrap()
        .run_once()
        .await
        .unwrap();
    assert_eq!(started.elapsed(), PAUSE * 2);
    assert_eq!(report.elapsed, PAUSE * 2);

    // An exact multiple: the third full batch is followed by a pause and an empty batch.
    let (store, _clock, _) = memory_store(300, 0).await;
    let report = Pruner::records(store, config(100))
        .unwrap()
        .run_once()
        .await
        .unwrap();
    assert_eq!((report.deleted, report.batches), (300, 3));
    assert_eq!(report.elapsed, PAUSE * 3);

    // No pause configured: back to back.
    let (store, _clock, _) = memory_store(250, 0).await;
    let report = Pruner::records(store, config(100).pause(Duration::ZERO))
        .unwrap()
        .run_once()
        .await
        .unwrap();
    assert_eq!((report.deleted, report.elapsed), (250, Duration::ZERO));
}

#[tokio::test(start_paused = true)]
async fn max_batches_ends_a_run_and_the_next_run_goes_on() {
    let (store, _clock, _) = memory_store(500, 10).await;
    let pruner = Pruner::records(store.clone(), config(100).max_batches(2)).unwrap();

    let first = pruner.run_once().await.unwrap();
    assert_eq!(
        (first.deleted, first.batches, first.drained),
        (200, 2, false)
    );
    assert_eq!(
        first.elapsed, PAUSE,
        "no pause after the last allowed batch"
    );
    assert_eq!(store.len(), 310);

    let second = pruner.run_once().await.unwrap();
    let third = pruner.run_once().await.unwrap();
    assert_eq!((second.deleted, second.drained), (200, false));
    // One full batch, then an empty one that shows nothing is left.
    assert_eq!(
        (third.deleted, third.batches, third.drained),
        (100, 1, true)
    );
    assert_eq!(third.elapsed, PAUSE);
    assert_eq!(store.len(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_spawned_pruner_runs_at_once_and_then_every_interval() {
    let interval = Duration::from_secs(60);
    let (store, clock, _) = memory_store(250, 5).await;
    let started = Instant::now();
    let mut handle = Pruner::records(store.clone(), config(100).interval(interval))
        .unwrap()
        .spawn();

    let first = handle.next_report().await.expect("a first run");
    assert_eq!((first.deleted, first.batches), (250, 3));
    assert_eq!(started.elapsed(), PAUSE * 2, "the first run starts at once");
    assert_eq!(handle.last_report(), Some(first));

    add_expiring(&*store, "later", 30).await;
    clock.advance(SHORT * 2);
    // Nothing runs before the interval is over.
    let early = tokio::time::timeout(interval - Duration::from_secs(1), handle.next_report()).await;
    assert!(early.is_err(), "a run came early: {early:?}");
    assert_eq!(store.len(), 35);

    let second = handle.next_report().await.expect("a second run");
    assert_eq!(
        (second.deleted, second.batches, second.drained),
        (30, 1, true)
    );
    assert_eq!(started.elapsed(), interval);
    assert_eq!(store.len(), 5);
    handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_a_run_midway_and_for_good() {
    // 1,000 records in batches of 100, one second apart: a run takes 9 s.
    let (store, clock, _) = memory_store(1_000, 0).await;
    let pruner = Pruner::records(
        store.clone(),
        PrunerConfig::new()
            .batch_size(100)
            .pause(SHORT)
            .interval(Duration::from_secs(60)),
    )
    .unwrap();
    let handle = pruner.spawn();
    // Batches at 0, 1 and 2 s; the shutdown lands in the pause before the fourth.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let stopping = Instant::now();
    handle.shutdown().await;
    assert_eq!(
        stopping.elapsed(),
        Duration::ZERO,
        "the pause was not cut short"
    );
    assert_eq!(store.len(), 700);

    // Expired records pile up, and no later run prunes them. (The memory store frees some by
    // itself as records are added, so it is the pruner's calls that are counted.)
    let calls = store.prune_calls.load(Ordering::SeqCst);
    add_expiring(&*store, "later", 10).await;
    clock.advance(SHORT * 2);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(store.prune_calls.load(Ordering::SeqCst), calls);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_stops_the_pruner() {
    let (store, clock, _) = memory_store(10, 0).await;
    let mut handle = Pruner::records(store.clone(), config(100)).unwrap().spawn();
    assert_eq!(handle.next_report().await.map(|r| r.deleted), Some(10));
    drop(handle);

    add_expiring(&*store, "later", 10).await;
    clock.advance(SHORT * 2);
    tokio::time::sleep(PrunerConfig::DEFAULT_INTERVAL * 10).await;
    assert_eq!(store.len(), 10, "a dropped handle's pruner kept running");
}

#[tokio::test(start_paused = true)]
async fn a_record_pruner_skips_while_another_holds_the_lease() {
    let (store, _clock, _) = memory_store(250, 0).await;
    let a = Pruner::records(store.clone(), config(100)).unwrap();
    let b = Pruner::records(store.clone(), config(100)).unwrap();

    // A's run takes 2 pauses; B runs in A's first pause.
    let running = run_into_first_pause(a).await;
    assert_eq!(store.len(), 150, "A's first batch");
    assert_eq!(store.leases.len(), 1, "A's lease");
    let skipped = b.run_once().await.unwrap();
    assert!(skipped.skipped && !skipped.drained, "{skipped:?}");
    assert_eq!((skipped.deleted, skipped.batches), (0, 0));

    let ran = running.await.unwrap();
    assert_eq!(
        (ran.deleted, ran.batches, ran.skipped, ran.drained),
        (250, 3, false, true)
    );
    // A released its lease on the way out: B may run at once, and finds nothing.
    assert_eq!(store.len(), 0);
    assert_eq!(store.leases.len(), 0, "the lease record was released");
    let after = b.run_once().await.unwrap();
    assert_eq!(
        (after.skipped, after.deleted, after.drained),
        (false, 0, true)
    );
}

#[tokio::test(start_paused = true)]
async fn a_crashed_holder_blocks_record_pruning_for_one_lease() {
    let (store, clock, _) = memory_store(10, 0).await;
    // A pruner elsewhere took the lease and vanished.
    claim(&*store, &lease_key(), PrunerConfig::DEFAULT_LEASE).await;
    let pruner = Pruner::records(store.clone(), config(100)).unwrap();
    assert!(pruner.run_once().await.unwrap().skipped);
    assert_eq!((store.len(), store.leases.len()), (10, 1));

    clock.advance(PrunerConfig::DEFAULT_LEASE + SHORT);
    let ran = pruner.run_once().await.unwrap();
    assert_eq!((ran.skipped, ran.deleted), (false, 10));
    assert_eq!(store.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_record_pruner_that_loses_its_lease_midway_stops() {
    let (store, _clock, _) = memory_store(250, 0).await;
    let pruner = Pruner::records(store.clone(), config(100)).unwrap();
    let running = run_into_first_pause(pruner).await;
    // An operator evicts the lease and another pruner takes it during the pause.
    assert!(store.evict(&lease_key()).await.unwrap());
    claim(&*store, &lease_key(), LONG).await;

    let stopped = running.await.unwrap();
    assert_eq!(
        (stopped.deleted, stopped.batches, stopped.drained),
        (100, 1, false)
    );
    assert_eq!(store.len(), 150);
    assert_eq!(store.leases.len(), 1, "the other holder's lease stays");
}

#[tokio::test(start_paused = true)]
async fn without_a_lease_record_pruners_run_side_by_side() {
    let (store, _clock, _) = memory_store(250, 0).await;
    let a = Pruner::records(store.clone(), config(100).without_lease()).unwrap();
    let b = Pruner::records(store.clone(), config(100).without_lease()).unwrap();
    let running = run_into_first_pause(a).await;
    assert_eq!(store.len(), 150);
    assert_eq!(store.leases.len(), 0, "no lease record");
    // B deletes a batch in A's pause (t = 10 ms), A the last 50 in B's (t = 20 ms), and B's
    // next batch (t = 30 ms) finds nothing.
    let b_report = b.run_once().await.unwrap();
    assert_eq!(
        (b_report.skipped, b_report.deleted, b_report.drained),
        (false, 100, true)
    );
    let a_report = running.await.unwrap();
    assert_eq!((a_report.deleted, a_report.drained), (150, true));
    assert_eq!(store.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_store_error_is_survived_and_the_next_interval_tries_again() {
    let interval = Duration::from_secs(60);
    let (store, _clock, _) = memory_store(120, 3).await;
    store.failing.store(true, Ordering::SeqCst);
    let pruner = Pruner::records(store.clone(), config(100).interval(interval)).unwrap();
    assert!(matches!(pruner.run_once().await, Err(Error::Store(_))));
    assert_eq!(store.prune_calls.swap(0, Ordering::SeqCst), 1);

    let mut handle = pruner.spawn();
    let failed = tokio::time::timeout(interval / 2, handle.next_report()).await;
    assert!(failed.is_err(), "a failed run reported: {failed:?}");
    assert_eq!(
        store.prune_calls.load(Ordering::SeqCst),
        1,
        "the first run did not try"
    );
    assert_eq!(handle.last_report(), None);

    store.failing.store(false, Ordering::SeqCst);
    let next = handle.next_report().await.expect("the pruner kept going");
    assert_eq!((next.deleted, next.batches, next.drained), (120, 2, true));
    assert_eq!(store.len(), 3);
    handle.shutdown().await;
}

/// On a plain memory store, which frees up to 8 expired records in every mutating call, the
/// lease's own calls (a claim, then a renewal before each later batch) free some of the
/// backlog, and the pruner deletes the rest.
#[tokio::test(start_paused = true)]
async fn on_a_plain_memory_store_the_lease_calls_free_some_and_the_pruner_the_rest() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    add_expiring(&store, "expired", 250).await;
    clock.advance(SHORT * 2);
    let report = Pruner::records(store.clone(), config(100))
        .unwrap()
        .run_once()
        .await
        .unwrap();
    // Claim: 8 freed, batch of 100; renewal: 8, batch of 100; renewal: 8, batch of 26.
    assert_eq!(
        (report.deleted, report.batches, report.drained),
        (226, 3, true)
    );
    assert_eq!(store.len(), 0, "the lease was released too");
}

#[test]
fn bad_config_is_a_typed_error() {
    let bad = [
        (PrunerConfig::new().batch_size(0), "batch size"),
        (PrunerConfig::new().batch_size(100_001), "batch size"),
        (PrunerConfig::new().max_batches(0), "max_batches"),
        (PrunerConfig::new().interval(Duration::ZERO), "interval"),
        (PrunerConfig::new().lease(Duration::ZERO), "lease"),
        (PrunerConfig::new().lease(PAUSE).pause(PAUSE), "lease"),
    ];
    for (config, what) in bad {
        match Pruner::records(MemoryStore::new(), config.clone()) {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(what), "{config:?}: {msg}"),
            other => panic!("{config:?} was accepted: {other:?}"),
        }
    }
    assert!(Pruner::records(MemoryStore::new(), PrunerConfig::default()).is_ok());
    assert!(Pruner::records(MemoryStore::new(), config(1).max_batches(1)).is_ok());
    assert!(Pruner::records(MemoryStore::new(), config(1).pause(LONG).without_lease()).is_ok());
}

/// Without a batch size in its config a pruner takes the store's, through an `Arc<dyn Store>`
/// as through the store itself; one the config names wins; a store's outside 1 to 100,000 is a
/// typed error, and not used.
#[tokio::test(start_paused = true)]
async fn the_batch_size_is_the_stores_unless_the_config_names_one() {
    let (store, _clock, _) = memory_store(350, 0).await;
    store.batch.store(150, Ordering::SeqCst);
    let dynamic: Arc<dyn Store> = store.clone();
    let pruner = Pruner::records(dynamic.clone(), PrunerConfig::new().pause(PAUSE)).unwrap();
    assert_eq!(pruner.batch_size(), 150);
    let report = pruner.run_once().await.unwrap();
    assert_eq!(
        (report.deleted, report.batches, report.largest_batch),
        (350, 3, 150)
    );
    assert_eq!(store.len(), 0);
    assert_eq!(
        Pruner::records(store.clone(), config(40))
            .unwrap()
            .batch_size(),
        40
    );
    for bad in [0, 100_001] {
        store.batch.store(bad, Ordering::SeqCst);
        match Pruner::records(dynamic.clone(), PrunerConfig::new()) {
            Err(Error::InvalidConfig(msg)) => assert!(
                msg.contains("prune_batch_size") && msg.contains(&bad.to_string()),
                "{msg}"
            ),
            other => panic!("a store's batch size of {bad} was accepted: {other:?}"),
        }
        assert_eq!(
            Pruner::records(dynamic.clone(), config(10))
                .unwrap()
                .batch_size(),
            10
        );
    }
    let plain = Pruner::records(MemoryStore::new(), PrunerConfig::new()).unwrap();
    assert_eq!(plain.batch_size(), PrunerConfig::DEFAULT_BATCH_SIZE);
}

/// Adds 35 records whose retentions really end (SQL stores use the database's clock) and 6 live
/// ones; returns the live keys.
async fn fill_sql(store: &dyn Store) -> Vec<Key> {
    const SQL_RETENTION: Duration = Duration::from_millis(250);
    for i in 0..35 {
        let c = claim(store, &key("expired", i), LONG).await;
        store.complete(&c, done(SQL_RETENTION)).await.unwrap();
    }
    let live = add_live(store, "live", 6).await;
    // Waits out the retentions: the database runs on this host's clock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    live
}

/// [`fill_sql`], then [`prune_sql`], on a SQL store whose table `rows` counts: 41 rows before
/// (35 expired and the live ones), 6 after.
async fn fill_and_prune_sql<F: std::future::Future<Output = i64>>(
    store: Arc<dyn Store>,
    rows: impl Fn() -> F,
) {
    let live = fill_sql(&*store).await;
    assert_eq!(rows().await, 41);
    prune_sql(store, &live).await;
    assert_eq!(rows().await, 6);
}

/// Prunes in batches of 10 and checks that exactly the 35 expired records went.
async fn prune_sql(store: Arc<dyn Store>, live: &[Key]) {
    let pruner = Pruner::records(
        store.clone(),
        PrunerConfig::new()
            .batch_size(10)
            .pause(Duration::from_millis(1)),
    )
    .unwrap();
    let report = pruner.run_once().await.unwrap();
    assert_eq!(
        (report.deleted, report.batches, report.drained),
        (35, 4, true)
    );
    for k in live {
        assert!(
            store.get(k).await.unwrap().is_some(),
            "a live record was pruned"
        );
    }
    let again = pruner.run_once().await.unwrap();
    assert_eq!((again.deleted, again.drained), (0, true));
}

/// A SQLite store in `dir` without a pruner of its own: the test's pruner is the one measured.
async fn sqlite_without_pruner(dir: &tempfile::TempDir) -> idem_sql::SqliteStore {
    idem_sql::SqliteStore::builder()
        .pruner(None)
        .open(dir.path().join("idem.db"))
        .await
        .unwrap()
}

#[tokio::test]
async fn prunes_expired_sqlite_records_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_without_pruner(&dir).await;
    let count = format!("SELECT count(*) FROM \"{}\"", store.table());
    let rows = || sqlx::query_scalar::<_, i64>(&count).fetch_one(store.pool());
    fill_and_prune_sql(Arc::new(store.clone()), || async { rows().await.unwrap() }).await;
}

/// A SQLite store's own batch is the default, 100: with nothing in the config, a run over 150
/// expired records deletes them in a batch of 100 and one of 50.
#[tokio::test]
async fn a_sqlite_pruner_deletes_100_records_a_batch_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_without_pruner(&dir).await;
    // 150 completed records whose retention ended in 1970.
    sqlx::query(&format!(
        "INSERT INTO \"{}\" (key, token, state, expires_at) \
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 150) \
         SELECT randomblob(32), randomblob(16), 1, 0 FROM n",
        store.table()
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let dynamic: Arc<dyn Store> = Arc::new(store.clone());
    let pruner = Pruner::records(dynamic, PrunerConfig::new()).unwrap();
    assert_eq!(pruner.batch_size(), 100);
    let report = pruner.run_once().await.unwrap();
    assert_eq!(
        (report.deleted, report.batches, report.largest_batch),
        (150, 2, 100)
    );
}

/// A PostgreSQL store on a table of its own (for `test`), and the table's name; `None` when the
/// test skips.
async fn pg_store(test: &str) -> Option<(idem_sql::PostgresStore, String)> {
    let url = idem_test_support::postgres::pg_url(test)?;
    // Without the store's own pruner: the test's pruner is the one measured.
    let store = idem_test_support::postgres::fresh_store(&url, |b| b.pruner(None)).await;
    let table = store.table().to_owned();
    Some((store, table))
}

/// A PostgreSQL store's own batch is 1,000 (docs/performance.md, "The sustained run"): with
/// nothing in the config, a run over 1,500 expired records deletes them in a batch of 1,000 and
/// one of 500, through an `Arc<dyn Store>` as an engine holds it.
#[tokio::test]
async fn a_postgres_pruner_deletes_1000_records_a_batch_by_default() {
    let Some((store, table)) =
        pg_store("a_postgres_pruner_deletes_1000_records_a_batch_by_default").await
    else {
        return;
    };
    // 1,500 completed records whose retention ended an hour ago.
    sqlx::query(&format!(
        "INSERT INTO \"{table}\" (key, token, state, expires_at) \
         SELECT sha256(('k' || i)::bytea), substring(sha256(('t' || i)::bytea) FROM 1 FOR 16), \
                1, now() - interval '1 hour' \
         FROM generate_series(1, 1500) AS i"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let engine = idem_core::Idempotency::new(store.clone());
    let pruner = Pruner::records(engine.store().clone(), PrunerConfig::new()).unwrap();
    assert_eq!(pruner.batch_size(), 1_000);
    let report = pruner.run_once().await.unwrap();
    assert_eq!(
        (report.deleted, report.batches, report.largest_batch),
        (1_500, 2, 1_000)
    );
    idem_test_support::postgres::drop_store_tables(&store).await;
}

#[tokio::test]
async fn prunes_expired_postgres_records_in_batches() {
    let Some((store, table)) = pg_store("prunes_expired_postgres_records_in_batches").await else {
        return;
    };
    let count = format!("SELECT count(*) FROM \"{table}\"");
    let rows = || sqlx::query_scalar::<_, i64>(&count).fetch_one(store.pool());
    fill_and_prune_sql(Arc::new(store.clone()), || async { rows().await.unwrap() }).await;
    idem_test_support::postgres::drop_store_tables(&store).await;
}

/// A [`TestStore`] whose `prune_expired` takes `cost`, holding `expired` expired records.
async fn costly_store(expired: usize, cost: Duration) -> (Arc<Forwarding<TestStore>>, ManualClock) {
    let clock = ManualClock::new();
    let store = test_store(&clock, cost);
    add_expiring(&*store, "expired", expired).await;
    clock.advance(SHORT * 2);
    (store, clock)
}

#[tokio::test(start_paused = true)]
async fn paced_by_cost_a_pause_is_in_proportion_to_the_batch_before_it() {
    // Batches of 100 over 250 records, each call taking 2 ms: three calls, two pauses.
    for (share, pauses) in [
        (PrunerConfig::DEFAULT_SHARE, Duration::from_millis(8)),
        (0.5, Duration::from_millis(2)),
        (1.0, Duration::ZERO),
    ] {
        let (store, _clock) = costly_store(250, Duration::from_millis(2)).await;
        let config = PrunerConfig::new().batch_size(100).share(share);
        let report = Pruner::records(store.clone(), config)
            .unwrap()
            .run_once()
            .await
            .unwrap();
        assert_eq!((report.deleted, report.batches), (250, 3));
        assert!(report.drained);
        assert_eq!(
            report.elapsed,
            Duration::from_millis(6) + pauses * 2,
            "share {share}"
        );
        assert_eq!(store.len(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn paced_by_cost_a_pause_is_at_most_a_quarter_of_the_lease() {
    // A 1 s batch would be followed by 4 s at a 20 % share; the lease of 2 s caps it at 0.5 s.
    let (store, _clock) = costly_store(150, Duration::from_secs(1)).await;
    let config = PrunerConfig::new()
        .batch_size(100)
        .lease(Duration::from_secs(2));
    let report = Pruner::records(store, config)
        .unwrap()
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.elapsed, Duration::from_millis(2_500));
}

/// What a spawned pruner (the default config) left behind over records expiring steadily.
struct Backlog {
    /// The most expired records the store held at once, from `from_ms` on.
    worst: usize,
    /// The expired records it held when the last record expired.
    at_end: usize,
}

impl Backlog {
    /// The backlog never went above `worst` and ended at most at `at_end`.
    fn assert_within(&self, worst: usize, at_end: usize) {
        assert!(
            self.worst <= worst,
            "the expired backlog reached {}",
            self.worst
        );
        assert!(self.at_end <= at_end, "{} left at the end", self.at_end);
    }
}

/// Completes `rate × seconds` records on `store` whose retentions end steadily, `rate` a second
/// from 1 ms on (nothing has expired yet, so adding them frees nothing, and afterwards only the
/// pruner touches them), spawns a pruner with the default config, and moves the records' clock
/// with the tokio clock a millisecond at a time for `seconds` + 1 s, calling `each_ms` before
/// each step. Checks that everything expired was pruned and the pruner reported.
async fn expire_steadily(
    store: &Arc<Forwarding<TestStore>>,
    clock: &ManualClock,
    rate: u64,
    seconds: u64,
    from_ms: u64,
    each_ms: impl FnMut(u64),
) -> Backlog {
    let config = PrunerConfig::default();
    expire_steadily_after(store, clock, (rate, seconds), 1, config, from_ms, each_ms).await
}

/// [`expire_steadily`] with the first lease ending at `quiet_ms` (nothing expires before) and
/// a pruner spawned with `config`.
async fn expire_steadily_after(
    store: &Arc<Forwarding<TestStore>>,
    clock: &ManualClock,
    (rate, seconds): (u64, u64),
    quiet_ms: u64,
    config: PrunerConfig,
    from_ms: u64,
    mut each_ms: impl FnMut(u64),
) -> Backlog {
    let leases: Vec<u64> = (0..rate * seconds)
        .map(|i| quiet_ms * 1_000 + i * 1_000_000 / rate)
        .collect();
    for (i, &micros) in leases.iter().enumerate() {
        let c = claim(&**store, &key("steady", i), LONG).await;
        store
            .complete(&c, done(Duration::from_micros(micros)))
            .await
            .unwrap();
    }
    let expired_by = |ms: u64| leases.partition_point(|&l| l <= ms * 1_000);
    let handle = Pruner::records(store.clone(), config).unwrap().spawn();
    let mut found = Backlog {
        worst: 0,
        at_end: 0,
    };
    let last_expiry_ms = quiet_ms + seconds * 1_000;
    for ms in 1..=(last_expiry_ms + 1_000) {
        each_ms(ms);
        clock.advance(Duration::from_millis(1));
        tokio::time::sleep(Duration::from_millis(1)).await;
        let backlog = store.len() - (leases.len() - expired_by(ms));
        if ms > from_ms {
            found.worst = found.worst.max(backlog);
        }
        if ms == last_expiry_ms {
            found.at_end = backlog;
        }
    }
    assert_eq!(store.len(), 0, "everything expired was pruned");
    assert!(handle.last_report().is_some());
    handle.shutdown().await;
    found
}

/// Records expiring at a steady 3,000 a second for 3 s: a spawned pruner with the default
/// pacing and a 60 s interval keeps the expired backlog near four batches, where one that ran
/// every interval would leave all of them.
#[tokio::test(start_paused = true)]
async fn a_spawned_pruner_keeps_pace_with_the_rate_records_expire_at() {
    let clock = ManualClock::new();
    let store = test_store(&clock, Duration::from_millis(1));
    let found = expire_steadily(&store, &clock, 3_000, 3, 500, |_| {}).await;
    // About four batches of 100 expire between runs, plus what expires while one runs.
    assert!(
        found.worst <= 600,
        "the expired backlog reached {}",
        found.worst
    );
    // Not a busy loop either: one run per ~133 ms, each a few calls.
    let calls = store.prune_calls.load(Ordering::SeqCst);
    assert!(calls <= 200, "{calls} prune calls");
}

/// Records that start to expire only after a quiet spell (5 s), then at 3,000 a second, with
/// batches of 1,000. The runs during the spell find nothing, and their waits double (10 ms, 20
/// ms, … 2.56 s). A rate measured from the last of them would take in the spell: a few hundred
/// records over 2.5 s, about 130 a second, and a wait of four batches at that rate, 30 s, while
/// 90,000 records expire. The rate is measured from the first run that found some instead, so
/// the backlog stays near four batches.
#[tokio::test(start_paused = true)]
async fn a_rate_is_not_measured_across_a_quiet_spell() {
    let clock = ManualClock::new();
    let store = test_store(&clock, Duration::from_millis(1));
    let config = PrunerConfig::default().batch_size(1_000);
    let found = expire_steadily_after(&store, &clock, (3_000, 10), 5_000, config, 0, |_| {}).await;
    // Four batches of 1,000 expire between runs, plus what expires while one runs and the
    // 2.56 s the last wait of the spell may overlap with the first expiries.
    found.assert_within(9_000, 5_000);
}

/// The same steady 3,000 a second, and after a second the store slows down: every
/// `prune_expired` takes 50 ms from then on (a saturated database, where each statement waits
/// behind the claims for a connection or the write lock). At the configured pace (batches of
/// 100, a 20 % share: a 200 ms pause after each 50 ms batch) the pruner would delete 400 a
/// second and the backlog would grow by 2,600 every second. Having measured the rate while the
/// store was fast, it sees that it deletes more slowly than records expire and steps up: its
/// share to the whole of the time, then its batches up to 16 times the configured size, so the
/// backlog stays bounded and everything is pruned at the end.
#[tokio::test(start_paused = true)]
async fn when_the_store_slows_down_the_pruner_steps_up_until_it_keeps_pace() {
    let clock = ManualClock::new();
    let store = test_store(&clock, Duration::from_millis(1));
    let found = expire_steadily(&store, &clock, 3_000, 5, 0, |ms| {
        if ms == 1_000 {
            store.prune_cost.store(50_000, Ordering::SeqCst);
        }
    })
    .await;
    // At 400 a second the backlog would be 10,400 when the last record expires. Stepping up
    // takes seven steps of about one batch each (under a second): the backlog peaks near a
    // second of expiries and stays below that afterwards.
    found.assert_within(3_000, 2_000);
}

/// A store that is slow from the start (every `prune_expired` takes 50 ms) under 3,000
/// expiries a second: the pruner never drains it at the configured pace (400 a second), so it
/// never measures the rate; a run that has gone on for 5 s without draining steps up all the
/// same, and again every 2 s, until it catches up. Without that the backlog would be 52,000
/// after 20 s.
#[tokio::test(start_paused = true)]
async fn a_pruner_that_never_drained_the_store_steps_up_too() {
    let clock = ManualClock::new();
    let store = test_store(&clock, Duration::from_millis(50));
    let found = expire_steadily(&store, &clock, 3_000, 20, 0, |_| {}).await;
    // 5 s at 400 a second leave 13,000; the steps at 5, 7 and 9 s bring the whole share, the one
    // at 11 s batches of 200 (4,000 a second), and the backlog turns there.
    found.assert_within(25_000, 3_000);
}

#[test]
fn a_share_outside_0_to_1_is_invalid() {
    for share in [0.0, -0.5, 1.5, f64::NAN] {
        let e = Pruner::records(MemoryStore::new(), PrunerConfig::new().share(share)).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidConfig(m) if m.contains("share")),
            "{share}: {e}"
        );
    }
}

/// An idle store is looked at less and less often (10 ms, 20 ms, 40 ms, … up to the interval),
/// and what expires after a quiet spell is pruned within about that spell.
#[tokio::test(start_paused = true)]
async fn an_idle_pruner_backs_off_and_wakes_up_within_the_quiet_spell() {
    let (store, clock) = costly_store(0, Duration::ZERO).await;
    let handle = Pruner::records(store.clone(), PrunerConfig::default())
        .unwrap()
        .spawn();
    // Runs at 0, 10, 30, 70, 150, 310 and 630 ms; the next at 1,270 ms.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(store.prune_calls.load(Ordering::SeqCst), 7);
    add_expiring(&*store, "after a quiet spell", 50).await;
    clock.advance(SHORT * 2);
    tokio::time::sleep(Duration::from_millis(280)).await;
    assert_eq!(store.len(), 0, "pruned at the 1,270 ms run");
    // Idle for an hour: the waits grow to the 60 s interval, so about 60 runs, not thousands.
    let before = store.prune_calls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    let calls = store.prune_calls.load(Ordering::SeqCst) - before;
    assert!((55..=75).contains(&calls), "{calls} runs in an idle hour");
    handle.shutdown().await;
}

/// A claim whose lease ended is left to its holder, who completes it after a prune; one whose
/// lease ended longer ago than `LAPSED_CLAIMS_KEPT` is the pruner's.
#[tokio::test(start_paused = true)]
async fn a_record_pruner_leaves_a_lapsed_claim_to_its_holder() {
    let (store, clock, _) = memory_store(0, 0).await;
    let late = claim(&*store, &key("lapsed", 1), SHORT).await;
    let gone = claim(&*store, &key("lapsed", 2), SHORT).await;
    clock.advance(SHORT * 2);
    let pruner = Pruner::records(store.clone(), config(100)).unwrap();
    assert_eq!(pruner.run_once().await.unwrap().deleted, 0);
    store.complete(&late, done(LONG)).await.unwrap();
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&key("lapsed", 1), LONG))
            .await
            .unwrap(),
        ClaimOutcome::Completed(_)
    ));

    // Past the window, the lapsed claim is the pruner's (and so is the completed record, whose
    // retention ended too).
    clock.advance(idem_core::LAPSED_CLAIMS_KEPT);
    assert_eq!(pruner.run_once().await.unwrap().deleted, 2);
    assert!(matches!(
        store.complete(&gone, done(LONG)).await,
        Err(idem_core::Error::LeaseLost)
    ));
}
