//! What only the SQLite store has to show: persistence in a file, its configuration, its
//! migrations, concurrency across connections and pools, and leases measured by SQLite's clock.
//! The behaviour every store shares is checked by the conformance suite.
#![cfg(feature = "sqlite")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use idem_core::{
    ClaimOutcome, ClaimRequest, Completion, Error, Key, OnLapse, RecordState, Store, StoreError,
    StoreErrorKind,
};
use idem_sql::{SqliteStore, SqliteStoreBuilder, SqliteSync};
use sqlx::Connection;
use tempfile::TempDir;

use idem_test_support::{eventually, not_migrated, Tmpfs};

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);
/// A lease short enough to wait out in a test.
const SHORT: Duration = Duration::from_millis(250);
/// Waiting this long after a SHORT lease was taken guarantees it ended (same host clock).
const PAST_SHORT: Duration = Duration::from_millis(300);

fn key(n: usize) -> Key {
    Key::derive("sqlite-test", "", &format!("k{n}")).unwrap()
}

fn db(dir: &TempDir) -> std::path::PathBuf {
    dir.path().join("idem.db")
}

fn done(bytes: &[u8], retention: Duration) -> Completion<'_> {
    Completion {
        response: Some(bytes),
        is_error: false,
        retention,
        key_retention: Duration::ZERO,
    }
}

async fn claim(store: &SqliteStore, key: &Key, lease: Duration) -> idem_core::Claim {
    match store.claim(ClaimRequest::new(key, lease)).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// A builder without the background pruner, for the tests that count rows, time the write lock
/// or write the file behind the store's back: the pruner's lease is a row while it runs, and
/// its statements take the write lock.
fn quiet() -> SqliteStoreBuilder {
    SqliteStore::builder().pruner(None)
}

async fn rows(store: &SqliteStore) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM \"{}\"", store.table()))
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn completed_record_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let k = key(1);
    {
        let store = SqliteStore::open(db(&dir)).await.unwrap();
        let c = claim(&store, &k, LEASE).await;
        store
            .complete(&c, done(b"receipt", RETENTION))
            .await
            .unwrap();
        store.pool().close().await;
    }
    let store = SqliteStore::open(db(&dir)).await.unwrap();
    match store.claim(ClaimRequest::new(&k, LEASE)).await.unwrap() {
        ClaimOutcome::Completed(cached) => {
            assert_eq!(cached.response.as_deref(), Some(&b"receipt"[..]));
            assert!(!cached.is_error);
        }
        other => panic!("expected a replay after reopening, got {other:?}"),
    }
    let record = store.get(&k).await.unwrap().expect("record kept");
    assert!(matches!(record.state, RecordState::Completed(_)));
}

/// `open` and a URL agree: both create a missing file; a URL that says `mode=rw` refuses one,
/// naming it.
#[tokio::test]
async fn open_and_connect_both_create_the_file_unless_the_url_says_mode_rw() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let url = format!("sqlite://{}", missing.display());
    match SqliteStore::connect(&format!("{url}?mode=rw")).await {
        Err(Error::SqliteFile { path, reason }) => {
            assert_eq!(path, missing);
            assert!(reason.starts_with("the file does not exist"), "{reason}");
        }
        other => panic!("expected SqliteFile, got {other:?}"),
    }
    assert!(!missing.exists());

    SqliteStore::connect(&url).await.unwrap();
    assert!(missing.exists());
    let created = dir.path().join("created.db");
    SqliteStore::connect(&format!("sqlite://{}?mode=rwc", created.display()))
        .await
        .unwrap();
    assert!(created.exists());

    let opened = dir.path().join("opened.db");
    let store = SqliteStore::open(&opened).await.unwrap();
    assert!(opened.exists());
    // The pools the store makes hand out connections without a ping first (sqlx's default
    // would hand each statement's connection over to its worker thread twice).
    assert!(!store.pool().options().get_test_before_acquire());
    let in_memory = SqliteStore::connect("sqlite::memory:").await.unwrap();
    assert!(!in_memory.pool().options().get_test_before_acquire());
}

/// A file in a directory that does not exist: the error names the file and the directory, by
/// `open` and by URL.
#[tokio::test]
async fn a_missing_directory_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("idem.db");
    let by_url = SqliteStore::connect(&format!("sqlite://{}", path.display())).await;
    for result in [SqliteStore::open(&path).await, by_url] {
        let err = result.unwrap_err();
        let Error::SqliteFile {
            path: named,
            reason,
        } = &err
        else {
            panic!("expected SqliteFile, got {err:?}");
        };
        assert_eq!(named, &path);
        assert_eq!(
            reason,
            &format!(
                "its directory {:?} does not exist: create it first, or give a path in a \
                 directory that exists",
                dir.path().join("no-such-dir")
            )
        );
        assert!(err.to_string().contains(&format!("{path:?}")), "{err}");
    }
    // A directory where the file should be.
    let err = SqliteStore::open(dir.path()).await.unwrap_err();
    assert!(
        matches!(&err, Error::SqliteFile { reason, .. } if reason.starts_with("it is a directory")),
        "{err:?}"
    );
}

#[tokio::test]
async fn bad_configuration_is_a_typed_error_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "",
        "bad-name",
        "1st",
        "a;drop table x",
        "sqlite_master",
        "x\"y",
    ] {
        let result = SqliteStore::builder().table(name).open(db(&dir)).await;
        assert!(
            matches!(result, Err(Error::InvalidConfig(_))),
            "{name:?} gave {result:?}"
        );
    }
    assert!(
        !db(&dir).exists(),
        "a refused configuration opened the file"
    );

    assert!(matches!(
        SqliteStore::connect("postgres://not-sqlite").await,
        Err(Error::InvalidConfig(_))
    ));

    // A keyword is a plain identifier and works, because the store quotes it.
    let store = SqliteStore::builder()
        .table("order")
        .open(db(&dir))
        .await
        .unwrap();
    claim(&store, &key(1), LEASE).await;
}

#[tokio::test]
async fn tables_in_one_file_are_independent_stores() {
    let dir = tempfile::tempdir().unwrap();
    let a = SqliteStore::builder()
        .table("idem_a")
        .open(db(&dir))
        .await
        .unwrap();
    let b = SqliteStore::builder()
        .table("idem_b")
        .open(db(&dir))
        .await
        .unwrap();
    let k = key(1);

    let in_a = claim(&a, &k, LEASE).await;
    let in_b = claim(&b, &k, LEASE).await;
    a.complete(&in_a, done(b"from a", RETENTION)).await.unwrap();
    assert!(matches!(
        b.get(&k).await.unwrap().map(|r| r.state),
        Some(RecordState::InProgress { .. })
    ));
    b.abort(&in_b).await.unwrap();
    assert!(b.get(&k).await.unwrap().is_none());
    assert!(matches!(
        a.claim(ClaimRequest::new(&k, LEASE)).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
    assert!(a.evict(&k).await.unwrap());
    assert!(!b.evict(&k).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_once_from_concurrent_pools_and_again_harmlessly() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move { SqliteStore::open(&path).await })
        })
        .collect();
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.unwrap().unwrap());
    }
    let store = SqliteStore::open(&path).await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM idem_records_migrations")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(versions, vec![1, 2, 3, 4, 5, 6]);
    // Every pool sees the one table.
    let c = claim(&stores[0], &key(1), LEASE).await;
    assert!(matches!(
        stores[7]
            .claim(ClaimRequest::new(&key(1), LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Locked { .. }
    ));
    stores[1].abort(&c).await.unwrap();
}

#[tokio::test]
async fn a_schema_from_a_newer_idem_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(db(&dir)).await.unwrap();
    sqlx::query(
        "INSERT INTO idem_records_migrations (version, description, applied_at) \
         VALUES (999, 'from the future', 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store.pool().close().await;
    let reopened = SqliteStore::open(db(&dir)).await;
    assert!(
        matches!(reopened, Err(Error::InvalidConfig(ref m)) if m.contains("999")),
        "{reopened:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_start_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    // Two pools on one file as well as many connections in each: like two processes.
    let first = SqliteStore::open(db(&dir)).await.unwrap();
    let second = SqliteStore::open(db(&dir)).await.unwrap();
    for round in 0..4 {
        let k = key(round);
        let tasks: Vec<_> = (0..24)
            .map(|i| {
                let store = if i % 2 == 0 {
                    first.clone()
                } else {
                    second.clone()
                };
                tokio::spawn(async move { store.claim(ClaimRequest::new(&k, LEASE)).await })
            })
            .collect();
        let (mut started, mut locked) = (0, 0);
        for t in tasks {
            match t.await.unwrap().unwrap() {
                ClaimOutcome::Claimed(_) => started += 1,
                ClaimOutcome::Locked { retry_after } => {
                    assert!(retry_after <= LEASE);
                    locked += 1;
                }
                other => panic!("nothing completed or lapsed yet: {other:?}"),
            }
        }
        assert_eq!((started, locked), (1, 23), "round {round}");
    }
}

#[tokio::test]
async fn prune_deletes_at_most_limit_expired_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().open(db(&dir)).await.unwrap();
    for n in 0..5 {
        let c = claim(&store, &key(n), LEASE).await;
        store.complete(&c, done(b"x", SHORT)).await.unwrap();
    }
    let live = claim(&store, &key(100), LEASE).await;
    let kept = claim(&store, &key(101), LEASE).await;
    store.complete(&kept, done(b"x", RETENTION)).await.unwrap();
    assert_eq!(
        store.prune_expired(10).await.unwrap(),
        0,
        "nothing expired yet"
    );

    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(store.prune_expired(0).await.unwrap(), 0);
    assert_eq!(store.prune_expired(2).await.unwrap(), 2);
    assert_eq!(store.prune_expired(2).await.unwrap(), 2);
    assert_eq!(store.prune_expired(2).await.unwrap(), 1);
    assert_eq!(store.prune_expired(2).await.unwrap(), 0);
    assert_eq!(rows(&store).await, 2);
    store.renew(&live, LEASE).await.unwrap();
    assert!(store.get(&key(101)).await.unwrap().is_some());
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_fences_the_old_claim() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().open(db(&dir)).await.unwrap();
    let k = key(1);
    let old = claim(&store, &k, SHORT).await;
    match store.claim(ClaimRequest::new(&k, LEASE)).await.unwrap() {
        ClaimOutcome::Locked { retry_after } => {
            assert!(retry_after > Duration::ZERO && retry_after <= SHORT)
        }
        other => panic!("expected Locked while the lease runs, got {other:?}"),
    }

    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        store.get(&k).await.unwrap().is_none(),
        "an expired lease reads as absent"
    );
    // Not yet taken over: the expired row still carries the old token, so renewing is safe.
    store.renew(&old, SHORT).await.unwrap();
    tokio::time::sleep(PAST_SHORT).await;

    let new = claim(&store, &k, LEASE).await;
    assert_ne!(new.token(), old.token());
    assert!(matches!(
        store.complete(&old, done(b"late", RETENTION)).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        store.renew(&old, LEASE).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(store.abort(&old).await, Err(Error::LeaseLost)));
    match store.get(&k).await.unwrap().map(|r| r.state) {
        Some(RecordState::InProgress { token, .. }) => assert_eq!(token, new.token()),
        other => panic!("the new claim must be untouched, got {other:?}"),
    }
    store.complete(&new, done(b"ok", RETENTION)).await.unwrap();
}

#[tokio::test]
async fn retention_ends_and_the_key_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().open(db(&dir)).await.unwrap();
    let k = key(1);
    let c = claim(&store, &k, LEASE).await;
    store.complete(&c, done(b"first", SHORT)).await.unwrap();
    assert!(matches!(
        store.claim(ClaimRequest::new(&k, LEASE)).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
    tokio::time::sleep(PAST_SHORT).await;
    assert!(store.get(&k).await.unwrap().is_none());
    let again = claim(&store, &k, LEASE).await;
    assert_ne!(again.token(), c.token());
}

#[tokio::test]
async fn bad_durations_are_rejected_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().open(db(&dir)).await.unwrap();
    let ten_years_and_a_day = Duration::from_secs(10 * 365 * 24 * 3600 + 86_400);
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        ten_years_and_a_day,
    ] {
        assert!(matches!(
            store.claim(ClaimRequest::new(&key(1), lease)).await,
            Err(Error::InvalidConfig(_))
        ));
    }
    assert_eq!(rows(&store).await, 0);

    let c = claim(&store, &key(1), LEASE).await;
    let before = store.get(&key(1)).await.unwrap();
    assert!(matches!(
        store.renew(&c, Duration::ZERO).await,
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        store.complete(&c, done(b"x", ten_years_and_a_day)).await,
        Err(Error::InvalidConfig(_))
    ));
    assert_eq!(store.get(&key(1)).await.unwrap(), before);
    store.complete(&c, done(b"x", RETENTION)).await.unwrap();
}

/// Also with the writers taking turns, where the store's group writes the claims: a group that
/// meets the lock held fails each of its writes `Unavailable`, having written none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_lock_past_the_busy_timeout_is_unavailable() {
    for turns in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = quiet()
            .writers_take_turns(turns)
            .busy_timeout(Duration::from_millis(100))
            .open(db(&dir))
            .await
            .unwrap();
        let url = format!("sqlite://{}", db(&dir).display());
        let mut blocker = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let tx = blocker.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let claims = (1..=8).map(|n| {
            let store = store.clone();
            tokio::spawn(async move { store.claim(ClaimRequest::new(&key(n), LEASE)).await })
        });
        for call in claims.collect::<Vec<_>>() {
            match call.await.unwrap() {
                Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}"),
                other => panic!("expected the store to be unavailable, got {other:?}"),
            }
        }
        assert!(Error::Store(StoreError::new(StoreErrorKind::Unavailable, "x")).is_retryable());
        tx.rollback().await.unwrap();
        assert_eq!(rows(&store).await, 0, "turns {turns}");
        claim(&store, &key(1), LEASE).await;
    }
}

/// A store in `dir` of two connections with a 10 s busy timeout (its writers taking `turns`),
/// both connections open and idle (so that taking one, once a test stops the clock, waits on
/// nothing but the pool), and another connection to the file, to hold its write lock.
async fn two_writers(dir: &TempDir, turns: bool) -> (SqliteStore, sqlx::SqliteConnection) {
    let store = quiet()
        .writers_take_turns(turns)
        .max_connections(2)
        .busy_timeout(Duration::from_secs(10))
        .open(db(dir))
        .await
        .unwrap();
    let both = (
        store.pool().acquire().await.unwrap(),
        store.pool().acquire().await.unwrap(),
    );
    drop(both);
    assert!(eventually(|| async { store.pool().num_idle() == 2 }).await);
    let blocker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db(dir).display()))
        .await
        .unwrap();
    (store, blocker)
}

/// With turns, this process's writers take turns for SQLite's write lock, and one waits for its
/// turn no longer than the busy timeout: while another process holds the lock, the writer whose
/// turn it is (a renewal) waits in SQLite's busy handler, and a claim queued behind it (which
/// the store's group of writers writes) fails `Unavailable` after the busy timeout of its own
/// wait, having written nothing, instead of after the sum of the waits ahead of it. The clock is
/// paused, so the queued writer's wait passes at once while the first still waits (in real
/// time) for the lock.
#[tokio::test]
async fn a_writer_waits_for_its_turn_no_longer_than_the_busy_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut blocker) = two_writers(&dir, true).await;
    let held = opened_writers(&store).await;
    let tx = blocker.begin_with("BEGIN IMMEDIATE").await.unwrap();

    tokio::time::pause();
    let two = key(2);
    let renewal = store.renew(&held, LEASE);
    let claim_two = store.claim(ClaimRequest::new(&two, LEASE));
    tokio::pin!(renewal, claim_two);
    let queued = tokio::time::timeout(Duration::from_secs(3600), async {
        tokio::select! {
            biased;
            r = &mut renewal => (r.map(|()| None), 1),
            r = &mut claim_two => (r.map(Some), 2),
        }
    })
    .await
    .expect("the writer queued behind a held turn waited past the busy timeout");
    let (gave_up, which) = queued;
    match &gave_up {
        Err(Error::Store(e)) => {
            assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
            assert!(e.to_string().contains("their turn"), "{e} from {which}");
        }
        other => panic!("expected the queued writer to give up, got {other:?} from {which}"),
    }
    assert!(gave_up.unwrap_err().is_retryable());

    // The lock comes free: the writer whose turn it was writes, and the one that gave up wrote
    // nothing. The clock runs again, since the pool's own waits (a connection on its way back)
    // are timed too.
    tokio::time::resume();
    tx.rollback().await.unwrap();
    match which {
        1 => {
            let claimed = claim_two.await;
            assert!(
                matches!(claimed, Ok(ClaimOutcome::Claimed(_))),
                "{claimed:?}"
            );
        }
        _ => {
            renewal.await.unwrap();
            assert_eq!(store.get(&two).await.unwrap(), None);
        }
    }
}

/// Claims `key(1)` and renews it, so that the connections of the store's group of writers and
/// of its renewals are open, and waits until each is back in its pool (a test that stops the
/// clock then waits on nothing but the lock; under a stopped clock, an acquire that waited for
/// a connection on its way back would time out at once): the claim, to renew again.
async fn opened_writers(store: &SqliteStore) -> idem_core::Claim {
    let held = claim(store, &key(1), LEASE).await;
    store.renew(&held, LEASE).await.unwrap();
    let idle = || async { idem_sql::__private::sqlite_connections_idle(store) };
    assert!(idem_test_support::eventually(idle).await);
    held
}

/// The store's group of writers (turns, a file) writes the claims and completions waiting at one
/// moment in one transaction: each still gets its own answer. Of two claims of one key one
/// claims; a completion under a token that no longer holds its key fails alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_writers_each_get_their_own_answer() {
    const KEYS: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let store = quiet()
        .writers_take_turns(true)
        .open(db(&dir))
        .await
        .unwrap();
    let claims = (0..2 * KEYS).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            (
                i % KEYS,
                store.claim(ClaimRequest::new(&key(i % KEYS), LEASE)).await,
            )
        })
    });
    let mut holders = vec![None; KEYS];
    let mut met = vec![0; KEYS];
    for call in claims.collect::<Vec<_>>() {
        match call.await.unwrap() {
            (k, Ok(ClaimOutcome::Claimed(c))) => {
                assert!(holders[k].replace(c).is_none(), "key {k} claimed twice");
            }
            (k, Ok(ClaimOutcome::Locked { .. })) => met[k] += 1,
            (k, other) => panic!("key {k}: {other:?}"),
        }
    }
    assert_eq!(met, vec![1; KEYS]);
    let holders: Vec<_> = holders.into_iter().map(Option::unwrap).collect();

    // Each key completed with its own response, beside completions under the next key's token.
    let mut calls = Vec::new();
    for (k, c) in holders.iter().enumerate() {
        let (mine, c) = (store.clone(), c.clone());
        let stale = idem_core::Claim::new(*c.key(), holders[(k + 1) % KEYS].token());
        calls.push(tokio::spawn(async move {
            let response = format!("response {k}");
            (
                true,
                mine.complete(&c, done(response.as_bytes(), RETENTION))
                    .await,
            )
        }));
        if k % 4 == 0 {
            let store = store.clone();
            calls.push(tokio::spawn(async move {
                (
                    false,
                    store.complete(&stale, done(b"not mine", RETENTION)).await,
                )
            }));
        }
    }
    for call in calls {
        match call.await.unwrap() {
            (true, answer) => answer.unwrap(),
            (false, answer) => assert!(matches!(answer, Err(Error::LeaseLost)), "{answer:?}"),
        }
    }
    for k in 0..KEYS {
        match store
            .claim(ClaimRequest::new(&key(k), LEASE))
            .await
            .unwrap()
        {
            ClaimOutcome::Completed(cached) => {
                assert_eq!(
                    cached.response.as_deref(),
                    Some(format!("response {k}").as_bytes())
                );
            }
            other => panic!("key {k}: {other:?}"),
        }
    }
}

/// The group's commits run no checkpoint (one that crossed SQLite's threshold would make every
/// writer queued behind it wait for the checkpoint's copy and syncs); its checkpointer runs
/// them beside the writes, so the log is reused from its start and stays bounded however many
/// writes the group makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_log_is_checkpointed_beside_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet()
        .writers_take_turns(true)
        .synchronous(SqliteSync::Normal)
        .open(db(&dir))
        .await
        .unwrap();
    for round in 0..80 {
        let calls = (0..64).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let k = key(round * 64 + i);
                let c = claim(&store, &k, LEASE).await;
                store
                    .complete(&c, done(&[7; 200], RETENTION))
                    .await
                    .unwrap();
            })
        });
        for call in calls.collect::<Vec<_>>() {
            call.await.unwrap();
        }
    }
    let log = std::fs::metadata(dir.path().join("idem.db-wal"))
        .unwrap()
        .len();
    // 5,120 writes: about 54 MB of log without the checkpointer, bounded by it at about 16 MiB
    // (4,000 frames) and the writes of one checkpoint's copy.
    assert!(log < 32 << 20, "the log grew to {log} bytes");
}

/// A group of writes that does not fit in the database (its page limit reached) is written
/// write by write: each write that fits is made and answered, each that does not fails `Full`
/// having written nothing, and nothing a failed group began stays behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_does_not_fit_is_written_write_by_write() {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let dir = tempfile::tempdir().unwrap();
    let pages: i64 = {
        let store = quiet().open(db(&dir)).await.unwrap();
        let pages = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(store.pool())
            .await
            .unwrap();
        store.close().await.unwrap();
        pages
    };
    let options = SqliteConnectOptions::new()
        .filename(db(&dir))
        .journal_mode(SqliteJournalMode::Wal)
        .pragma("max_page_count", (pages + 16).to_string());
    let pool = SqlitePoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await
        .unwrap();
    let store = quiet()
        .writers_take_turns(true)
        .from_pool(pool)
        .await
        .unwrap();

    let response = vec![7u8; 1500];
    let (mut claims_full, mut completions_made, mut completions_full) = (0, 0, 0);
    for round in 0..40 {
        let keys: Vec<Key> = (0..16).map(|i| key(1000 + round * 16 + i)).collect();
        let claims = keys.iter().map(|k| {
            let (store, k) = (store.clone(), *k);
            tokio::spawn(async move { (k, store.claim(ClaimRequest::new(&k, LEASE)).await) })
        });
        let mut held = Vec::new();
        for call in claims.collect::<Vec<_>>() {
            match call.await.unwrap() {
                (_, Ok(ClaimOutcome::Claimed(c))) => {
                    assert!(store.get(c.key()).await.unwrap().is_some());
                    held.push(c);
                }
                (k, Err(Error::Store(e))) if e.kind() == StoreErrorKind::Full => {
                    claims_full += 1;
                    assert_eq!(
                        store.get(&k).await.unwrap(),
                        None,
                        "a claim that failed was kept"
                    );
                }
                (_, other) => panic!("{other:?}"),
            }
        }
        let completions = held.into_iter().map(|c| {
            let (store, response) = (store.clone(), response.clone());
            tokio::spawn(async move {
                let answer = store.complete(&c, done(&response, RETENTION)).await;
                (c, answer)
            })
        });
        for call in completions.collect::<Vec<_>>() {
            let (c, answer) = call.await.unwrap();
            let record = store.get(c.key()).await.unwrap().unwrap();
            match answer {
                Ok(()) => {
                    completions_made += 1;
                    match record.state {
                        RecordState::Completed(stored) => {
                            assert_eq!(stored.response.as_deref(), Some(&response[..]));
                        }
                        other => panic!("a completion made reads as {other:?}"),
                    }
                }
                Err(Error::Store(e)) if e.kind() == StoreErrorKind::Full => {
                    completions_full += 1;
                    assert!(
                        matches!(record.state, RecordState::InProgress { .. }),
                        "a completion that failed was kept: {:?}",
                        record.state
                    );
                }
                Err(other) => panic!("{other:?}"),
            }
        }
        if claims_full + completions_full > 0 && round > 0 {
            break;
        }
    }
    assert!(completions_made > 0, "nothing fitted");
    assert!(
        claims_full + completions_full > 0,
        "the database never filled"
    );
}

/// By default the writers take no turns: with another process holding the lock, both writers
/// wait in SQLite's busy handler, neither in a queue of the store's, so neither gives up before
/// the busy timeout (on the paused clock, the queue's wait would pass at once); both claim once
/// the lock comes free.
#[tokio::test]
async fn by_default_writers_take_no_turns() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut blocker) = two_writers(&dir, false).await;
    let tx = blocker.begin_with("BEGIN IMMEDIATE").await.unwrap();

    tokio::time::pause();
    let (one, two) = (key(1), key(2));
    let both = async {
        tokio::join!(
            store.claim(ClaimRequest::new(&one, LEASE)),
            store.claim(ClaimRequest::new(&two, LEASE)),
        )
    };
    tokio::pin!(both);
    assert!(
        tokio::time::timeout(Duration::from_secs(3600), &mut both)
            .await
            .is_err(),
        "a writer gave up while the other held a turn"
    );
    tokio::time::resume();
    tx.rollback().await.unwrap();
    let (first, second) = both.await;
    assert!(matches!(first, Ok(ClaimOutcome::Claimed(_))), "{first:?}");
    assert!(matches!(second, Ok(ClaimOutcome::Claimed(_))), "{second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_store_keeps_its_records_across_operations() {
    let store = Arc::new(SqliteStore::connect("sqlite::memory:").await.unwrap());
    let k = key(1);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.claim(ClaimRequest::new(&k, LEASE)).await.unwrap() })
        })
        .collect();
    let mut claims = Vec::new();
    for t in tasks {
        if let ClaimOutcome::Claimed(c) = t.await.unwrap() {
            claims.push(c);
        }
    }
    assert_eq!(claims.len(), 1);
    store
        .complete(&claims[0], done(b"mem", RETENTION))
        .await
        .unwrap();
    assert_eq!(store.pool().size(), 1);
    assert!(matches!(
        store.claim(ClaimRequest::new(&k, LEASE)).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));

    let other = SqliteStore::open(":memory:").await.unwrap();
    assert!(
        other.get(&k).await.unwrap().is_none(),
        "each in-memory store is its own database"
    );
}

#[tokio::test]
async fn from_pool_keeps_the_pool_and_creates_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path: &Path = &db(&dir);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true),
        )
        .await
        .unwrap();
    let store = SqliteStore::from_pool(pool.clone()).await.unwrap();
    let c = claim(&store, &key(1), LEASE).await;
    store.complete(&c, done(b"ok", RETENTION)).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records WHERE state = 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

/// Whether `start` on a completed key answers while another connection holds the write lock:
/// only a `start` that reads first can (a claim would wait for the lock and time out).
async fn replays_under_a_held_write_lock(store: &SqliteStore, path: &Path, key: &Key) -> bool {
    let mut blocker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let tx = blocker.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let answered = match store.claim(ClaimRequest::new(key, LEASE)).await {
        Ok(ClaimOutcome::Completed(_)) => true,
        Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unavailable => false,
        other => panic!("expected a replay or a busy database, got {other:?}"),
    };
    tx.rollback().await.unwrap();
    answered
}

#[tokio::test]
async fn claim_order_follows_the_traffic_and_pinned_orders_hold() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    let open = |order| {
        quiet()
            .busy_timeout(Duration::from_millis(100))
            .claim_order(order)
            .open(path.clone())
    };
    let store = open(idem_sql::ClaimOrder::Adaptive).await.unwrap();
    assert_eq!(store.claim_order(), idem_sql::ClaimOrder::Adaptive);
    let done_key = key(1);
    let c = claim(&store, &done_key, LEASE).await;
    store.complete(&c, done(b"r", RETENTION)).await.unwrap();

    // A new store claims first: its replay meets the write lock.
    let fresh = open(idem_sql::ClaimOrder::Adaptive).await.unwrap();
    assert!(!replays_under_a_held_write_lock(&fresh, &path, &done_key).await);

    // After a run of replays it reads first, and answers without the lock.
    for _ in 0..32 {
        assert!(matches!(
            fresh
                .claim(ClaimRequest::new(&done_key, LEASE))
                .await
                .unwrap(),
            ClaimOutcome::Completed(_)
        ));
    }
    assert!(replays_under_a_held_write_lock(&fresh, &path, &done_key).await);

    // A run of new keys brings it back to claiming first; every one of them was claimed.
    for n in 100..132 {
        claim(&fresh, &key(n), LEASE).await;
    }
    assert!(!replays_under_a_held_write_lock(&fresh, &path, &done_key).await);

    // Pinned orders ignore the traffic.
    let read_first = open(idem_sql::ClaimOrder::ReadFirst).await.unwrap();
    let claim_first = open(idem_sql::ClaimOrder::ClaimFirst).await.unwrap();
    for n in 200..232 {
        claim(&read_first, &key(n), LEASE).await;
    }
    for _ in 0..32 {
        let replay = claim_first
            .claim(ClaimRequest::new(&done_key, LEASE))
            .await
            .unwrap();
        assert!(matches!(replay, ClaimOutcome::Completed(_)));
    }
    assert!(replays_under_a_held_write_lock(&read_first, &path, &done_key).await);
    assert!(!replays_under_a_held_write_lock(&claim_first, &path, &done_key).await);
}

/// Renewal runs on a connection of its own: work that holds every connection of the store's
/// pool still gets its lease renewed, instead of the heartbeat queueing for a connection until
/// the lease is gone.
#[tokio::test]
async fn renewal_is_not_starved_by_work_holding_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().max_connections(1).open(db(&dir)).await.unwrap();
    let c = claim(&store, &key(1), LEASE).await;
    let held = store.pool().acquire().await.unwrap();
    let renewed = tokio::time::timeout(Duration::from_secs(5), store.renew(&c, LEASE)).await;
    assert!(
        matches!(renewed, Ok(Ok(()))),
        "renewal while the pool is held: {renewed:?}"
    );
    drop(held);
    store.complete(&c, done(b"ok", RETENTION)).await.unwrap();
}

/// A records table dropped behind the store's back (its ledger still lists the migration) is
/// created again when a store connects, instead of every call failing with "no such table".
#[tokio::test]
async fn a_dropped_records_table_is_created_again_on_connect() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().open(db(&dir)).await.unwrap();
    claim(&store, &key(1), LEASE).await;
    sqlx::query("DROP TABLE idem_records")
        .execute(store.pool())
        .await
        .unwrap();
    let err = store
        .claim(ClaimRequest::new(&key(2), LEASE))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Store(e) if e.kind() == StoreErrorKind::Query),
        "{err:?}"
    );
    store.pool().close().await;

    let store = quiet().open(db(&dir)).await.unwrap();
    let c = claim(&store, &key(1), LEASE).await;
    store.complete(&c, done(b"again", RETENTION)).await.unwrap();
    let indexes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'idem_records_expires_at'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(indexes, 1, "the pruner's index is back too");
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM idem_records_migrations")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(versions, vec![1, 2, 3, 4, 5, 6]);
}

/// Fills a database with completed records (so its tables span several pages), closes it, and
/// returns the page size and the last root page of its tables and indexes (the records', the
/// steps' and their indexes', created empty before the records were written).
async fn populated_file(path: &Path, extra_sql: Option<&str>) -> (u64, u64) {
    let store = quiet().open(path).await.unwrap();
    for n in 0..120 {
        let c = claim(&store, &key(n), LEASE).await;
        store
            .complete(&c, done(&[b'r'; 300], RETENTION))
            .await
            .unwrap();
    }
    if let Some(sql) = extra_sql {
        sqlx::query(sql).execute(store.pool()).await.unwrap();
    }
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let root: i64 = sqlx::query_scalar("SELECT max(rootpage) FROM sqlite_master")
        .fetch_one(store.pool())
        .await
        .unwrap();
    // Everything into the database file, so that what is overwritten there is what is read.
    let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(busy, 0, "the checkpoint could not finish");
    store.pool().close().await;
    drop(store);
    (page_size as u64, root as u64)
}

/// Overwrites `len` bytes of the file at `offset` with a pattern no valid page holds.
fn scribble(path: &Path, offset: u64, len: u64) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(&vec![0xA5; len as usize]).unwrap();
    file.sync_all().unwrap();
}

/// The error of opening `path` and, if that succeeds, of its first use.
async fn open_or_first_use(path: &Path) -> Error {
    match quiet().open(path).await {
        Err(e) => e,
        Ok(store) => match store.claim(ClaimRequest::new(&key(0), LEASE)).await {
            Err(e) => e,
            Ok(start) => panic!("a damaged file served a start: {start:?}"),
        },
    }
}

fn assert_damaged(err: &Error) {
    match err {
        Error::Store(e) if e.kind() == StoreErrorKind::Corrupt => {
            let message = err.to_string();
            assert!(message.contains("damaged"), "{message}");
        }
        other => panic!("expected a Corrupt store error naming damage, got {other:?}"),
    }
}

/// Bytes overwritten in the middle of the file (after the header page) make a `Corrupt` store
/// error that says the file is damaged, not a configuration error about a newer idem.
#[tokio::test]
async fn a_damaged_file_is_a_corrupt_store_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    let (page_size, _) = populated_file(&path, None).await;
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len >= 8 * page_size, "the file has {len} bytes");
    scribble(&path, page_size, len / 2);
    assert_damaged(&open_or_first_use(&path).await);
}

/// A file whose ledger still reads but lists a version no idem wrote, and which is damaged
/// elsewhere: `PRAGMA quick_check` tells damage from a newer idem.
#[tokio::test]
async fn an_unknown_version_in_a_damaged_file_is_reported_as_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    let (page_size, root) = populated_file(
        &path,
        Some(
            "INSERT INTO idem_records_migrations (version, description, applied_at) \
             VALUES (999, 'garbage', 0)",
        ),
    )
    .await;
    // Cells of the page after the last table's or index's root (a page of rows), not its
    // header: sqlite_master and the ledger still read, and `PRAGMA quick_check` lists what it
    // finds instead of failing outright.
    scribble(&path, root * page_size + 100, 1500);
    let err = open_or_first_use(&path).await;
    assert_damaged(&err);
    assert!(err.to_string().contains("quick_check"), "{err}");
}

/// A file that is not a database at all (SQLITE_NOTADB) is `Corrupt` too, and says so.
#[tokio::test]
async fn a_file_that_is_not_a_database_is_a_corrupt_store_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = db(&dir);
    std::fs::write(&path, vec![0x42; 8192]).unwrap();
    assert_damaged(&open_or_first_use(&path).await);
}

/// A database opened read-only refuses the claim with a `ReadOnly` store error
/// (SQLITE_READONLY), which is retryable, not a failed query.
#[tokio::test]
async fn a_read_only_database_is_a_read_only_store_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().open(db(&dir)).await.unwrap();
    let mut ro =
        sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=ro", db(&dir).display()))
            .await
            .unwrap();
    let e = sqlx::query("DELETE FROM idem_records")
        .execute(&mut ro)
        .await
        .unwrap_err();
    let e = idem_sql::sql_error(e);
    assert_eq!(e.kind(), StoreErrorKind::ReadOnly, "{e}");
    assert!(Error::Store(e).is_retryable());
    claim(&store, &key(1), LEASE).await;
}

/// Writes a file in `dir` until the file system has no room left; returns its path.
fn fill(dir: &Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    // Bounded by the file system's size: a write that finds no room fails with ENOSPC (28).
    loop {
        if let Err(e) = file.write_all(&chunk) {
            assert_eq!(
                e.raw_os_error(),
                Some(28),
                "filling the disk failed otherwise: {e}"
            );
            return path;
        }
    }
}

/// Set in the child process that runs the full-disk test under `ulimit -f` when no tmpfs can be
/// mounted.
const SIZE_LIMITED_CHILD: &str = "IDEM_TEST_SIZE_LIMITED_CHILD";

/// A claim whose COMMIT fails (SQLITE_FULL on a full disk) must be reported as failed. Reading
/// only the claim's `RETURNING` row used to drop the COMMIT's error: the claim was reported as
/// won, rolled back, and won again by the next caller, so the work ran once per caller and each
/// completion found no record (`LeaseLost`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_claims_as_full_and_never_runs_the_work_twice() {
    if std::env::var_os(SIZE_LIMITED_CHILD).is_some() {
        let dir = tempfile::tempdir().unwrap();
        full_disk(dir.path(), false).await;
        return;
    }
    match Tmpfs::mount(2 << 20, None) {
        Ok(fs) => full_disk(fs.path(), true).await,
        Err(why) => {
            eprintln!(
                "cannot mount a tmpfs ({why}); running this test again in a child process whose \
                 file size is limited with `ulimit -f` instead (SQLite then reports the EFBIG of \
                 a short write as an I/O error, so the child checks for a store error of any kind)"
            );
            let exe = std::env::current_exe().unwrap();
            let status = std::process::Command::new("sh")
                .arg("-c")
                .arg(r#"trap "" XFSZ; ulimit -f 4096; exec "$0" "$@""#)
                .arg(exe)
                .args([
                    "--exact",
                    "a_full_disk_fails_claims_as_full_and_never_runs_the_work_twice",
                    "--nocapture",
                ])
                .env(SIZE_LIMITED_CHILD, "1")
                .status()
                .unwrap();
            assert!(status.success(), "the size-limited child failed: {status}");
        }
    }
}

/// The full-disk scenario on a store in `dir`. With `tmpfs` the disk is filled by a file and
/// errors must be `Full`; without, the process's file size limit is reached by the store's own
/// writes.
async fn full_disk(dir: &Path, tmpfs: bool) {
    use idem_core::{Idempotency, Outcome};
    use std::sync::atomic::{AtomicUsize, Ordering};

    let path = dir.join("idem.db");
    let store = quiet().open(&path).await.unwrap();
    let engine = Idempotency::new(store.clone());
    let before = Key::derive("full-disk", "", "done-before").unwrap();
    let during = Key::derive("full-disk", "", "during").unwrap();
    let out = engine
        .call(before)
        .run(async { Ok::<_, Error>("kept".to_string()) })
        .await
        .unwrap();
    assert_eq!(out, Outcome::Fresh("kept".to_string()));

    let filler = if tmpfs {
        Some(fill(dir))
    } else {
        // Grow the database until even the smallest commit fails at the size limit: large rows
        // first, then ever smaller ones into the room they left.
        sqlx::query("CREATE TABLE ballast (b BLOB)")
            .execute(store.pool())
            .await
            .unwrap();
        for size in [65536, 4096, 16] {
            let grown = 'grow: {
                for _ in 0..10_000 {
                    let r = sqlx::query("INSERT INTO ballast VALUES (zeroblob(?1))")
                        .bind(size)
                        .execute(store.pool())
                        .await;
                    if r.is_err() {
                        break 'grow true;
                    }
                }
                false
            };
            assert!(grown, "the database never reached the file size limit");
        }
        None
    };

    let runs = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let (engine, runs) = (engine.clone(), runs.clone());
            tokio::spawn(async move {
                engine
                    .call(during)
                    .run(async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, Error>("receipt".to_string())
                    })
                    .await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    let ran = runs.load(Ordering::SeqCst);
    assert!(
        ran <= 1,
        "the work ran {ran} times on a full disk: {answers:?}"
    );
    let mut full = 0;
    for answer in answers {
        match answer {
            Ok(out) => assert_eq!(out.into_inner(), "receipt"),
            Err(Error::Store(e)) if !tmpfs || e.kind() == StoreErrorKind::Full => full += 1,
            Err(other) => panic!("expected the result or a Full store error, got {other:?}"),
        }
    }
    eprintln!(
        "on the full disk: {full} of 20 calls failed with a store error, the work ran {ran} times"
    );

    // Reading needs no room: the key completed before the disk filled still replays.
    let replay = engine
        .call(before)
        .run(async { Ok::<_, Error>("again".to_string()) })
        .await
        .unwrap();
    assert_eq!(replay, Outcome::Replayed("kept".to_string()));

    // Room again: the key runs (or replays), and its work has run once in all.
    if let Some(filler) = filler {
        std::fs::remove_file(filler).unwrap();
        let out = engine
            .call(during)
            .run(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>("receipt".to_string())
            })
            .await
            .unwrap();
        assert_eq!(out.into_inner(), "receipt");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the work ran more than once"
        );
    }
    store.pool().close().await;
}

/// How many completed records `store`'s table holds (the background pruner's lease is an
/// in-progress row, never counted).
async fn completed(store: &SqliteStore) -> i64 {
    let sql = format!("SELECT count(*) FROM \"{}\" WHERE state = 1", store.table());
    sqlx::query_scalar(&sql)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Expired records go with no pruner spawned by the user: the store runs one while it lives.
/// A store without a pruner writes 250 records whose retention ends at once (SQLite's clock is
/// the host's: the test polls, bounded, until they have expired) and one kept for an hour; a
/// store opened on the file with the defaults then deletes the 250 and keeps the one. (They are
/// expired before it opens because a spawned pruner paces its runs by the rate it measured:
/// records that began to expire after a run found a few could wait for the interval, 60 s.)
#[tokio::test]
async fn expired_records_are_deleted_with_no_pruner_spawned() {
    let dir = tempfile::tempdir().unwrap();
    let writer = quiet().open(db(&dir)).await.unwrap();
    for n in 0..250 {
        let c = claim(&writer, &key(n), LEASE).await;
        writer
            .complete(&c, done(b"short", Duration::from_millis(1)))
            .await
            .unwrap();
    }
    let kept = claim(&writer, &key(1_000), LEASE).await;
    writer
        .complete(&kept, done(b"kept", RETENTION))
        .await
        .unwrap();
    let expired = "SELECT count(*) FROM idem_records \
                   WHERE expires_at <= CAST(round(unixepoch('subsec') * 1000) AS INTEGER)";
    assert!(
        eventually(|| async {
            sqlx::query_scalar::<_, i64>(expired)
                .fetch_one(writer.pool())
                .await
                .unwrap()
                == 250
        })
        .await
    );

    let store = SqliteStore::open(db(&dir)).await.unwrap();
    assert!(store.prunes_in_background());
    assert!(
        eventually(|| async { completed(&store).await == 1 }).await,
        "{} completed records left",
        completed(&store).await
    );
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&key(1_000), LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Completed(_)
    ));
}

/// The runtime's live tasks once the ones sqlx spawns to hand connections back have finished;
/// the test's own future is not a task.
async fn settled_tasks(at_most: usize) -> bool {
    let metrics = tokio::runtime::Handle::current().metrics();
    eventually(|| async { metrics.num_alive_tasks() <= at_most }).await
}

/// The background pruner is one task, which ends once the last clone of the store is gone (a
/// pruner holding the store would keep it alive for ever); `pruner(None)` spawns none.
#[tokio::test(flavor = "current_thread")]
async fn the_background_pruner_ends_with_the_last_clone_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    // No idle timeout nor lifetime: sqlx then runs no maintenance task of its own.
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(db(&dir))
                .create_if_missing(true),
        )
        .await
        .unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();

    let quiet = quiet().from_pool(pool.clone()).await.unwrap();
    assert!(!quiet.prunes_in_background());
    claim(&quiet, &key(1), LEASE).await;
    assert!(
        settled_tasks(0).await,
        "a store without a pruner left a task"
    );

    let store = SqliteStore::from_pool(pool.clone()).await.unwrap();
    let clone = store.clone();
    drop(store);
    // The clone that is left still has its records pruned.
    let c = claim(&clone, &key(2), LEASE).await;
    clone
        .complete(&c, done(b"short", Duration::from_millis(1)))
        .await
        .unwrap();
    assert!(eventually(|| async { completed(&clone).await == 0 }).await);
    drop(clone);
    assert!(
        settled_tasks(0).await,
        "{} tasks left after the last clone went",
        metrics.num_alive_tasks()
    );
    drop(quiet);
}

/// The names and the `CREATE` text of every table and index in the database at `url`.
async fn schema_of(url: &str) -> Vec<(String, String, Option<String>)> {
    let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
    sqlx::query_as("SELECT type, name, sql FROM sqlite_master ORDER BY name")
        .fetch_all(&mut conn)
        .await
        .unwrap()
}

fn url_of(path: &Path) -> String {
    format!("sqlite://{}?mode=rwc", path.display())
}

/// A store told not to migrate creates nothing: it needs the schema, and names the two ways to
/// bring it (no file, an empty database, a ledger listing no version). After `migrate()` it
/// works.
#[tokio::test]
async fn a_store_that_does_not_migrate_needs_the_schema_and_migrate_brings_it() {
    let dir = tempfile::tempdir().unwrap();
    let checking = || SqliteStore::builder().migrate_on_connect(false);

    let err = checking().open(db(&dir)).await.unwrap_err();
    assert!(
        matches!(&err, Error::SchemaNotMigrated { table, found: None, needed: 6 } if table == "idem_records"),
        "{err:?}"
    );
    assert!(
        !db(&dir).exists(),
        "a store that does not migrate created the file"
    );

    let url = url_of(&db(&dir));
    let err = checking().connect(&url).await.unwrap_err();
    assert!(not_migrated(&err, None, 6), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("migrate") && message.contains(".sql"),
        "{message}"
    );
    assert_eq!(schema_of(&url).await, vec![], "it created something");

    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    SqliteStore::builder().migrate(&mut conn).await.unwrap();
    SqliteStore::builder().migrate(&mut conn).await.unwrap();
    let store = checking().connect(&url).await.unwrap();
    let c = claim(&store, &key(1), LEASE).await;
    store.complete(&c, done(b"ok", RETENTION)).await.unwrap();
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&key(1), LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Completed(_)
    ));

    // A ledger that lists no version: the schema is older than this idem needs.
    sqlx::query("DELETE FROM idem_records_migrations")
        .execute(&mut conn)
        .await
        .unwrap();
    let err = checking().connect(&url).await.unwrap_err();
    assert!(not_migrated(&err, Some(0), 6), "{err:?}");
    // Another table of the same database is not migrated either.
    let err = checking().table("other").connect(&url).await.unwrap_err();
    assert!(not_migrated(&err, None, 6), "{err:?}");
}

/// The `.sql` file shipped for teams that migrate out of band makes what `migrate()` makes, to
/// the byte of every `CREATE`, and a store that does not migrate then works on it. It is what
/// `schema_sql()` writes. Applying it again fails at version 3's `ADD COLUMN` (SQLite cannot
/// add a column only if it is missing) and changes nothing, committed or not.
#[tokio::test]
async fn the_shipped_sql_file_makes_what_migrate_makes() {
    let file = include_str!("../sql/sqlite/idem_records.sql");
    assert_eq!(file, SqliteStore::builder().schema_sql().unwrap());
    let dir = tempfile::tempdir().unwrap();

    let migrated = url_of(&dir.path().join("migrated.db"));
    let mut conn = sqlx::SqliteConnection::connect(&migrated).await.unwrap();
    SqliteStore::builder().migrate(&mut conn).await.unwrap();

    let applied = url_of(&dir.path().join("applied.db"));
    let mut conn = sqlx::SqliteConnection::connect(&applied).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::raw_sql(file).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(schema_of(&applied).await, schema_of(&migrated).await);
    let mut tx = conn.begin().await.unwrap();
    let again = sqlx::raw_sql(file).execute(&mut *tx).await.unwrap_err();
    assert!(
        again
            .to_string()
            .contains("duplicate column name: result_until"),
        "{again}"
    );
    tx.commit().await.unwrap();
    assert_eq!(schema_of(&applied).await, schema_of(&migrated).await);
    let ledger = "SELECT version, description FROM idem_records_migrations";
    let listed: Vec<(i64, String)> = sqlx::query_as(ledger).fetch_all(&mut conn).await.unwrap();
    assert_eq!(listed.len(), 6);
    let mut other = sqlx::SqliteConnection::connect(&migrated).await.unwrap();
    let by_migrate: Vec<(i64, String)> =
        sqlx::query_as(ledger).fetch_all(&mut other).await.unwrap();
    assert_eq!(listed, by_migrate);

    let store = SqliteStore::builder()
        .migrate_on_connect(false)
        .connect(&applied)
        .await
        .unwrap();
    let c = claim(&store, &key(1), LEASE).await;
    store.complete(&c, done(b"ok", RETENTION)).await.unwrap();
}

/// How many rows of `store`'s table hold `key`, whatever their state.
async fn rows_of(store: &SqliteStore, key: &Key) -> i64 {
    let sql = format!("SELECT count(*) FROM \"{}\" WHERE key = $1", store.table());
    sqlx::query_scalar(&sql)
        .bind(key.as_bytes().as_slice())
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// SQLite claims an operation and reads its steps with several statements in one query, each
/// committing on its own (and a retry's begin is a statement more): when what follows the claim
/// fails after the claim committed, the claim is released, not left to hold the key for its
/// lease with nobody to run it. (The steps table, dropped behind the store's back, makes the
/// read after the claim fail.)
#[tokio::test]
async fn a_claim_whose_steps_cannot_begin_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().open(db(&dir)).await.unwrap();
    let (began, fails) = (key(1), key(2));
    let (outcome, log) = store
        .claim_steps(ClaimRequest::new(&began, LEASE), RETENTION)
        .await
        .unwrap();
    assert!(matches!(outcome, ClaimOutcome::Claimed(_)), "{outcome:?}");
    assert_eq!(log.map(|l| (l.attempt, l.steps.len())), Some((1, 0)));
    assert_eq!(rows_of(&store, &began).await, 1);

    sqlx::query(&format!("DROP TABLE \"{}_steps\"", store.table()))
        .execute(store.pool())
        .await
        .unwrap();
    let err = store
        .claim_steps(ClaimRequest::new(&fails, LEASE), RETENTION)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("_steps"), "{err}");
    assert_eq!(rows_of(&store, &fails).await, 0, "the claim was released");
    claim(&store, &fails, LEASE).await;
}

/// The reliability harness's case on the store with its background pruner running: a claim with
/// a 2 s lease, completed 3 s later with nobody having claimed the key meanwhile, completes and
/// replays. The pruner demonstrably ran after the lease ended (a record whose retention ended
/// later is gone, polled, bounded) and left the lapsed claim, which its holder could still
/// complete (`LAPSED_CLAIMS_KEPT`).
#[tokio::test]
async fn a_lapsed_holder_completes_with_the_pruner_running() {
    let dir = tempfile::tempdir().unwrap();
    let pruner = idem_core::PrunerConfig::new().interval(Duration::from_millis(50));
    let store = SqliteStore::builder()
        .pruner(pruner)
        .open(db(&dir))
        .await
        .unwrap();
    let late = claim(&store, &key(1), Duration::from_secs(2)).await;
    // Waits out the lease on SQLite's clock (the host's).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let marker = claim(&store, &key(2), LEASE).await;
    store
        .complete(&marker, done(b"gone", Duration::from_millis(1)))
        .await
        .unwrap();
    assert!(
        eventually(|| async { rows_of(&store, &key(2)).await == 0 }).await,
        "the pruner never ran"
    );
    assert_eq!(
        rows_of(&store, &key(1)).await,
        1,
        "the lapsed claim was pruned"
    );
    store
        .complete(&late, done(b"late", RETENTION))
        .await
        .unwrap();
    match store
        .claim(ClaimRequest::new(&key(1), LEASE))
        .await
        .unwrap()
    {
        ClaimOutcome::Completed(r) => assert_eq!(r.response.as_deref(), Some(&b"late"[..])),
        other => panic!("expected the late result, got {other:?}"),
    }
}

/// The pruner is for space: a claim whose lease ended longer ago than `LAPSED_CLAIMS_KEPT` (its
/// expiry moved back in the table) is deleted by `prune_expired`; one within it stays.
#[tokio::test]
async fn a_claim_lapsed_past_the_late_completion_window_is_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().open(db(&dir)).await.unwrap();
    claim(&store, &key(1), SHORT).await;
    claim(&store, &key(2), SHORT).await;
    let kept_ms = i64::try_from(idem_core::LAPSED_CLAIMS_KEPT.as_millis()).unwrap();
    let sql = format!(
        "UPDATE \"{}\" SET expires_at = expires_at - $1 - 1000 WHERE key = $2",
        store.table()
    );
    sqlx::query(&sql)
        .bind(kept_ms)
        .bind(key(1).as_bytes().as_slice())
        .execute(store.pool())
        .await
        .unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(store.prune_expired(100).await.unwrap(), 1);
    assert_eq!(rows_of(&store, &key(1)).await, 0);
    assert_eq!(rows_of(&store, &key(2)).await, 1);
}

/// The longest table name the docs allow (63 bytes, PostgreSQL's identifier limit) works: every
/// name derived from it (ledger, steps table, indexes) is made to fit, and the store claims,
/// keeps steps and completes. One byte more is refused before the file is touched.
#[tokio::test]
async fn a_table_name_of_the_longest_allowed_length_works() {
    let dir = tempfile::tempdir().unwrap();
    let table = format!("t{}", "x".repeat(62));
    let store = quiet().table(&table).open(db(&dir)).await.unwrap();
    assert_eq!(store.table(), table);
    idem_test_support::claim_steps_and_complete(&store, &key(1)).await;
    let names: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE name LIKE 't%' ORDER BY name")
            .fetch_all(store.pool())
            .await
            .unwrap();
    // The records table, its ledger, its steps table, the two tables' expiry indexes (the
    // records table's on the pruner's due time), and the partial index of uncertain claims.
    assert_eq!(names.len(), 6, "{names:?}");
    assert!(names.iter().all(|n| n.len() <= 63), "{names:?}");
    assert!(names.contains(&table), "{names:?}");
    // Another store on the table finds the same names (and migrates nothing).
    let again = quiet().table(&table).open(db(&dir)).await.unwrap();
    idem_test_support::claim_steps_and_complete(&again, &key(2)).await;

    let other = tempfile::tempdir().unwrap();
    let err = quiet()
        .table(format!("{table}x"))
        .open(db(&other))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    assert!(!db(&other).exists());
}

/// A deployment migrated to version 1 with a 48-byte table name (the longest v1 allowed on
/// PostgreSQL) is brought up to date by the current store, keeps its records, and works.
#[tokio::test]
async fn a_v1_schema_with_a_48_byte_table_name_is_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let table = format!("v{}", "1".repeat(47));
    let script = quiet().table(&table).schema_sql().unwrap();
    let mut conn = sqlx::SqliteConnection::connect(&url_of(&db(&dir)))
        .await
        .unwrap();
    sqlx::raw_sql(idem_test_support::script_up_to(&script, 1))
        .execute(&mut conn)
        .await
        .unwrap();
    // A record the v1 store completed.
    let kept = key(7);
    sqlx::query(&format!(
        "INSERT INTO \"{table}\" (key, token, state, expires_at, response) \
         VALUES ($1, zeroblob(16), 1, 4102444800000, $2)"
    ))
    .bind(kept.as_bytes().as_slice())
    .bind(&b"v1 receipt"[..])
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();

    let store = quiet().table(&table).open(db(&dir)).await.unwrap();
    idem_test_support::upgraded_and_working(&store, &kept, &key(8)).await;
}

/// `PRAGMA synchronous` as every connection of the store's pool has it.
async fn synchronous_levels(store: &SqliteStore) -> Vec<i64> {
    let mut conns = Vec::new();
    for _ in 0..2 {
        conns.push(store.pool().acquire().await.unwrap());
    }
    let mut levels = Vec::new();
    for conn in &mut conns {
        levels.push(
            sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&mut **conn)
                .await
                .unwrap(),
        );
    }
    levels
}

/// The durability setting reaches every connection: FULL (2) by default, NORMAL (1) from the
/// builder or the URL, the URL's over the builder's.
#[tokio::test]
async fn synchronous_is_full_by_default_and_set_by_the_builder_or_the_url() {
    const FULL: i64 = 2;
    const NORMAL: i64 = 1;
    let dir = tempfile::tempdir().unwrap();
    let two = || quiet().max_connections(2);
    let url = format!("sqlite://{}", db(&dir).display());
    for (store, level) in [
        (two().open(db(&dir)).await.unwrap(), FULL),
        (two().connect(&url).await.unwrap(), FULL),
        (
            two()
                .synchronous(SqliteSync::Normal)
                .open(db(&dir))
                .await
                .unwrap(),
            NORMAL,
        ),
        (
            two()
                .connect(&format!("{url}?synchronous=normal"))
                .await
                .unwrap(),
            NORMAL,
        ),
        (
            two()
                .synchronous(SqliteSync::Normal)
                .connect(&format!("{url}?synchronous=FULL"))
                .await
                .unwrap(),
            FULL,
        ),
    ] {
        assert_eq!(synchronous_levels(&store).await, [level, level]);
    }
    let err = SqliteStore::connect(&format!("{url}?synchronous=off"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
}

/// `close` stops the pruner, checkpoints the log and closes the pools: the `-wal` and `-shm`
/// files are gone, the records are in the database file, and a call afterwards is refused as
/// unavailable.
#[tokio::test]
async fn close_checkpoints_the_log_and_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, shm) = (
        dir.path().join("idem.db-wal"),
        dir.path().join("idem.db-shm"),
    );
    // With its background pruner, which must stop first.
    let store = SqliteStore::open(db(&dir)).await.unwrap();
    assert!(store.prunes_in_background());
    let clone = store.clone();
    for n in 0..50 {
        let c = claim(&store, &key(n), LEASE).await;
        store.complete(&c, done(b"kept", RETENTION)).await.unwrap();
    }
    assert!(
        wal.exists() && shm.exists(),
        "WAL mode keeps both while open"
    );
    store.close().await.unwrap();
    assert!(!wal.exists(), "the log stayed behind");
    assert!(!shm.exists(), "the shared-memory file stayed behind");
    let err = clone.get(&key(0)).await.unwrap_err();
    assert!(
        matches!(&err, Error::Store(e) if e.kind() == StoreErrorKind::Unavailable),
        "{err:?}"
    );
    store.close().await.unwrap();

    let reopened = quiet().open(db(&dir)).await.unwrap();
    for n in 0..50 {
        match reopened.get(&key(n)).await.unwrap() {
            Some(record) => assert!(matches!(record.state, RecordState::Completed(_))),
            None => panic!("record {n} lost"),
        }
    }
}

/// The payload bytes SQLite's `dbstat` counts for the b-tree `name` (a table or an index).
async fn payload_of(store: &SqliteStore, name: &str) -> i64 {
    sqlx::query_scalar("SELECT coalesce(sum(payload), 0) FROM dbstat WHERE name = $1")
        .bind(name)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// A completion with a tombstone keeps its result for its retention; then `prune_expired`
/// drops the response's bytes (counting the row) and keeps the row, which a claim meets as
/// `Expired` (since the retention's end) and `get` reads as such. A completion without one is
/// deleted at the same moment. The row left holds no response: a 70-byte record in the table
/// (102 with a fingerprint), 35 bytes in the key's index and 10 in the pruner's index (each
/// with the row's rowid, 0 bytes for rowid 1 here, 1 to 3 in a table of millions), and none in
/// the partial index (docs/stores.md has what that makes on the page).
#[tokio::test]
async fn a_tombstone_keeps_no_response_bytes_after_prune() {
    let dir = tempfile::tempdir().unwrap();
    let store = quiet().open(db(&dir)).await.unwrap();
    let (kept, gone) = (key(1), key(2));
    let body = vec![7u8; 4096];
    let c = claim(&store, &kept, LEASE).await;
    let tombstone = Completion {
        key_retention: Duration::from_secs(3600),
        ..done(&body, SHORT)
    };
    store.complete(&c, tombstone).await.unwrap();
    let c = claim(&store, &gone, LEASE).await;
    store.complete(&c, done(b"gone", SHORT)).await.unwrap();
    let table = store.table().to_owned();
    let (result_until, expires_at): (i64, i64) = sqlx::query_as(&format!(
        "SELECT result_until, expires_at FROM \"{table}\" WHERE key = $1"
    ))
    .bind(kept.as_bytes().as_slice())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(
        expires_at - result_until,
        3_600_000,
        "whole seconds after the result"
    );
    assert!(payload_of(&store, &format!("{table}_expires_at")).await > 0);
    tokio::time::sleep(PAST_SHORT).await;

    // One record deleted, one response dropped; then nothing left to do.
    assert_eq!(store.prune_expired(100).await.unwrap(), 2);
    assert_eq!(store.prune_expired(100).await.unwrap(), 0);
    assert_eq!(rows_of(&store, &gone).await, 0);
    let (response, bytes): (Option<Vec<u8>>, i64) = sqlx::query_as(&format!(
        "SELECT response, length(key) + length(token) FROM \"{table}\" WHERE key = $1"
    ))
    .bind(kept.as_bytes().as_slice())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!((response, bytes), (None, 48));
    let since = UNIX_EPOCH + Duration::from_millis(result_until.try_into().unwrap());
    for _ in 0..2 {
        match store.claim(ClaimRequest::new(&kept, LEASE)).await.unwrap() {
            ClaimOutcome::Expired { since: s } => assert_eq!(s, since),
            other => panic!("a tombstone answers Expired, got {other:?}"),
        }
    }
    match store.get(&kept).await.unwrap().map(|r| r.state) {
        Some(RecordState::Expired { since: s }) => assert_eq!(s, since),
        other => panic!("get of a tombstone read {other:?}"),
    }

    // What the tombstone costs: its record, its entries in the key's and the pruner's index,
    // and nothing in the partial index of uncertain claims.
    let record = payload_of(&store, &table).await;
    let key_index = payload_of(&store, &format!("sqlite_autoindex_{table}_1")).await;
    let pruner_index = payload_of(&store, &format!("{table}_expires_at")).await;
    let partial = payload_of(&store, &format!("{table}_uncertain")).await;
    assert_eq!((record, key_index, pruner_index, partial), (72, 35, 10, 0));
}

/// A table at schema version 2 (before uncertain claims and tombstones), holding what a
/// version-2 store wrote, is upgraded on connect: its rows read as before (no `result_until`:
/// a completed record's retention ends with its `expires_at`), a running claim still locks its
/// key, an ended record is pruned, and the store then keeps tombstones and uncertain claims on
/// the upgraded table.
#[tokio::test]
async fn a_v2_schema_is_upgraded_and_its_records_read_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let script = SqliteStore::builder().schema_sql().unwrap();
    let mut conn = sqlx::SqliteConnection::connect(&url_of(&db(&dir)))
        .await
        .unwrap();
    sqlx::raw_sql(idem_test_support::script_up_to(&script, 2))
        .execute(&mut conn)
        .await
        .unwrap();
    let (completed, running, ended) = (key(1), key(2), key(3));
    let now = "CAST(round(unixepoch('subsec') * 1000) AS INTEGER)";
    for (k, state, expires, response) in [
        (
            &completed,
            1,
            format!("{now} + 3600000"),
            Some(&b"v2 receipt"[..]),
        ),
        (&running, 0, format!("{now} + 3600000"), None),
        (&ended, 1, format!("{now} - 1000"), Some(&b"old"[..])),
    ] {
        sqlx::query(&format!(
            "INSERT INTO idem_records (key, token, state, expires_at, response) \
             VALUES ($1, zeroblob(16), $2, {expires}, $3)"
        ))
        .bind(k.as_bytes().as_slice())
        .bind(state)
        .bind(response)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let expires_ms: i64 = sqlx::query_scalar("SELECT expires_at FROM idem_records WHERE key = $1")
        .bind(completed.as_bytes().as_slice())
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let store = quiet().open(db(&dir)).await.unwrap();
    idem_test_support::upgraded_and_working(&store, &completed, &key(8)).await;
    match store
        .claim(ClaimRequest::new(&completed, LEASE))
        .await
        .unwrap()
    {
        ClaimOutcome::Completed(r) => {
            assert_eq!(r.response.as_deref(), Some(&b"v2 receipt"[..]));
            let ms = u64::try_from(expires_ms).unwrap();
            assert_eq!(r.expires_at, UNIX_EPOCH + Duration::from_millis(ms));
        }
        other => panic!("the v2 record replays, got {other:?}"),
    }
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&running, LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Locked { .. }
    ));
    assert!(store.get(&ended).await.unwrap().is_none());
    assert_eq!(store.prune_expired(100).await.unwrap(), 1);
    assert_eq!(rows_of(&store, &ended).await, 0);

    // The new columns work on the upgraded table.
    let c = claim(&store, &key(4), LEASE).await;
    let tombstone = Completion {
        key_retention: Duration::from_secs(60),
        ..done(b"paid", SHORT)
    };
    store.complete(&c, tombstone).await.unwrap();
    let uncertain = key(5);
    let request = ClaimRequest::new(&uncertain, SHORT).on_lapse(OnLapse::Uncertain);
    let ClaimOutcome::Claimed(_dead) = store.claim(request).await.unwrap() else {
        panic!("a new key is claimed");
    };
    tokio::time::sleep(PAST_SHORT).await;
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&key(4), LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Expired { .. }
    ));
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&key(5), LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Uncertain { .. }
    ));
}
