//! What a cancelled caller can and cannot cause ("Never twice"): on every store and on a
//! current-thread runtime (where a release spawned from `Drop` has not run yet when the caller
//! retries).
//!
//! - A call cancelled by `timeout` and retried at once never meets its own claim as `Locked`:
//!   the retry waits for the release this process began.
//! - Detached, the cancelled work runs on, once; the retry replays its result, or meets it
//!   running with a `retry_after` no longer than the documented estimate.
//! - A call dropped while its claim statement waits on a lock leaves no orphaned claim: once the
//!   lock is gone, a waiting retry runs at once, not after a lease.
//! - A completion that fails because the store is busy is retried in the background; the caller
//!   gets its result, and the retry replays it.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Call, Error, Idempotency, Key, MemoryStore, OnLocked, Outcome, RecordState, Store, TokioClock,
};
use idem_sql::{PostgresStore, SqliteStore};
use idem_test_support::postgres::{drop_store_tables, fresh_store, pg_url};
use sqlx::Connection;

/// The lease of every call here: far longer than any test takes, so a claim that is not
/// released shows as `Locked`.
const LEASE: Duration = Duration::from_secs(30);
/// The documented ceiling of `retry_after` while no work of the engine took longer: the first
/// guess before any work finished (1 s); after that, the typical duration of recent work.
const ESTIMATE_CEILING: Duration = Duration::from_secs(1);
const ROUNDS: usize = 300;

/// A call of these tests: the test's lease, and what to do on a locked key.
fn guarded(engine: &Idempotency, k: Key, on_locked: OnLocked) -> Call<'_, Idempotency> {
    engine.call(k).lease(LEASE).on_locked(on_locked)
}

fn key(test: &str, i: usize) -> Key {
    Key::derive("cancellation", test, &format!("k{i}")).unwrap()
}

async fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(dir.path().join("idem.db")).await.unwrap())
}

async fn postgres(test: &str) -> Option<(Arc<dyn Store>, PostgresStore)> {
    let url = pg_url(test)?;
    let store = fresh_store(&url, |b| b).await;
    Some((Arc::new(store.clone()), store))
}

/// A call cancelled by `timeout` (after 0 to 3 ms: sometimes in its claim statement, sometimes
/// in its work), then retried at once, fail fast: the retry runs, never `Locked`.
async fn cancelled_then_retried(engine: Idempotency, test: &str) {
    let fail_fast = OnLocked::FailFast;
    for i in 0..ROUNDS {
        let k = key(test, i);
        let cut = Duration::from_millis((i % 4) as u64);
        let cancelled = tokio::time::timeout(
            cut,
            guarded(&engine, k, fail_fast).run(async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok::<_, Error>(0u32)
            }),
        )
        .await;
        assert!(cancelled.is_err(), "round {i}: the call was not cancelled");
        let retry = guarded(&engine, k, fail_fast)
            .run(async { Ok::<_, Error>(i) })
            .await;
        match retry {
            Ok(out) => assert_eq!(out, Outcome::Fresh(i), "round {i}"),
            Err(Error::Locked { retry_after }) => {
                panic!("round {i}: the retry met its own cancelled claim: Locked {retry_after:?}")
            }
            Err(e) => panic!("round {i}: {e}"),
        }
    }
}

/// The same, detached: the cancelled work goes on and runs once; a retry at once replays it or
/// finds it running with a `retry_after` within the estimate, and a waiting retry replays it.
/// Even rounds cancel the caller once the work has started; odd ones after 0 to 3 ms, which may
/// be before the detached task claimed the key (then the retry may be the one that runs).
async fn detached_cancelled_then_retried(engine: Idempotency, test: &str) {
    let fail_fast = OnLocked::FailFast;
    let wait = OnLocked::Wait {
        timeout: Duration::from_secs(20),
    };
    let mut locked = 0;
    for i in 0..ROUNDS {
        let k = key(test, i);
        let runs = Arc::new(AtomicUsize::new(0));
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let work = {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _ = started_tx.send(());
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok::<_, Error>(i)
            }
        };
        let call = guarded(&engine, k, fail_fast).run_detached(work);
        let started_first = i % 2 == 0;
        if started_first {
            tokio::select! {
                biased;
                _ = started_rx => {}
                out = call => panic!("round {i}: finished before it started: {out:?}"),
            }
        } else {
            let cut = Duration::from_millis((i % 4) as u64);
            if tokio::time::timeout(cut, call).await.is_ok() {
                continue; // finished within the cut: nothing was cancelled this round
            }
        }
        let again = || {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(usize::MAX)
            }
        };
        match guarded(&engine, k, fail_fast).run_detached(again()).await {
            Ok(Outcome::Replayed(v)) => assert_eq!(v, i, "round {i}"),
            Ok(Outcome::Fresh(v)) => assert!(!started_first, "round {i}: ran again: {v}"),
            Err(Error::Locked { retry_after }) => {
                locked += 1;
                assert!(
                    retry_after <= ESTIMATE_CEILING,
                    "round {i}: retry_after {retry_after:?} is more than the estimate"
                );
            }
            Err(e) => panic!("round {i}: {e}"),
        }
        let replay = guarded(&engine, k, wait).run_detached(again()).await;
        let replay = replay.unwrap();
        if started_first {
            assert_eq!(replay, Outcome::Replayed(i), "round {i}");
        } else {
            assert!(replay.is_replayed(), "round {i}: {replay:?}");
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "round {i}: the work ran twice"
        );
    }
    eprintln!("{test}: {locked} retries met the work still running");
}

/// A `MemoryStore` given by value: the engine calls its claims and completions directly
/// (they never wait).
fn memory_engine() -> Idempotency {
    Idempotency::new(MemoryStore::with_clock(TokioClock::new()))
}

/// The same store behind `Arc<dyn Store>`: the engine goes through the `Store` trait, as for
/// every other store.
fn memory_engine_via_trait() -> Idempotency {
    Idempotency::from_arc(Arc::new(MemoryStore::with_clock(TokioClock::new())))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn memory_cancelled_then_retried() {
    cancelled_then_retried(memory_engine(), "memory").await;
    cancelled_then_retried(memory_engine_via_trait(), "memory-via-trait").await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn memory_detached_cancelled_then_retried() {
    detached_cancelled_then_retried(memory_engine(), "memory-detached").await;
    detached_cancelled_then_retried(memory_engine_via_trait(), "memory-detached-via-trait").await;
}

#[tokio::test(flavor = "current_thread")]
async fn sqlite_cancelled_then_retried() {
    let dir = tempfile::tempdir().unwrap();
    cancelled_then_retried(Idempotency::from_arc(sqlite(&dir).await), "sqlite").await;
}

#[tokio::test(flavor = "current_thread")]
async fn sqlite_detached_cancelled_then_retried() {
    let dir = tempfile::tempdir().unwrap();
    detached_cancelled_then_retried(Idempotency::from_arc(sqlite(&dir).await), "sqlite-detached")
        .await;
}

#[tokio::test(flavor = "current_thread")]
async fn postgres_cancelled_then_retried() {
    let Some((store, pg)) = postgres("postgres_cancelled_then_retried").await else {
        return;
    };
    cancelled_then_retried(Idempotency::from_arc(store), "postgres").await;
    drop_store_tables(&pg).await;
}

#[tokio::test(flavor = "current_thread")]
async fn postgres_detached_cancelled_then_retried() {
    let Some((store, pg)) = postgres("postgres_detached_cancelled_then_retried").await else {
        return;
    };
    detached_cancelled_then_retried(Idempotency::from_arc(store), "postgres-detached").await;
    drop_store_tables(&pg).await;
}

/// Starts a call whose claim statement blocks on `held`, drops it while it waits, lets `free`
/// release the lock, and checks that a waiting retry runs within a second (the lease is 30 s):
/// whatever the dropped statement claimed was released.
async fn claim_dropped_while_blocked(
    store: Arc<dyn Store>,
    k: Key,
    free: impl std::future::Future<Output = ()>,
) {
    let engine = Idempotency::from_arc(store.clone());
    let fail_fast = OnLocked::FailFast;
    let runs = AtomicUsize::new(0);
    // The claim statement waits on the lock; the caller gives up first.
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        guarded(&engine, k, fail_fast).run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("dropped".to_string())
        }),
    )
    .await;
    assert!(dropped.is_err(), "the claim did not block: {dropped:?}");
    free.await;
    let wait = OnLocked::Wait {
        timeout: Duration::from_secs(1),
    };
    let retry = guarded(&engine, k, wait)
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("retry".to_string())
        })
        .await;
    assert_eq!(
        retry.unwrap(),
        Outcome::Fresh("retry".to_string()),
        "the key was orphaned"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claim_dropped_while_waiting_for_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::builder()
        .busy_timeout(Duration::from_secs(10))
        .open(dir.path().join("idem.db"))
        .await
        .unwrap();
    let k = key("sqlite-blocked", 0);
    // Another connection holds SQLite's write lock, so the claim's INSERT waits in the busy
    // handler.
    let mut blocker = sqlx::SqliteConnection::connect(&format!(
        "sqlite://{}",
        dir.path().join("idem.db").display()
    ))
    .await
    .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut blocker)
        .await
        .unwrap();
    let free = async move {
        sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    };
    claim_dropped_while_blocked(Arc::new(store), k, free).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claim_dropped_while_waiting_for_a_row_lock() {
    let Some((store, pg)) = postgres("postgres_claim_dropped_while_waiting_for_a_row_lock").await
    else {
        return;
    };
    let k = key("pg-blocked", 0);
    // An uncommitted insert of the same key makes the claim's INSERT wait on the unique index.
    let mut blocker = pg.pool().acquire().await.unwrap();
    let mut tx = blocker.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO \"{}\" (key, token, state, expires_at) \
         VALUES ($1, $2, 0, clock_timestamp() - interval '1 second')",
        pg.table()
    ))
    .bind(&k.as_bytes()[..])
    .bind(&[0u8; 16][..])
    .execute(&mut *tx)
    .await
    .unwrap();
    let free = async move {
        tx.rollback().await.unwrap();
    };
    claim_dropped_while_blocked(store, k, free).await;
    drop(blocker);
    drop_store_tables(&pg).await;
}

/// Storing the result fails because the store is busy (SQLite's write lock held past the busy
/// timeout): the caller still gets its result, the completion lands in the background once the
/// lock is free, and the retry replays it. The work ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_completion_retried_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::builder()
        .busy_timeout(Duration::from_millis(100))
        .open(&path)
        .await
        .unwrap();
    let engine = Idempotency::from_arc(Arc::new(store.clone()));
    let k = key("sqlite-busy-complete", 0);
    let runs = AtomicUsize::new(0);
    let mut blocker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let out = engine
        .call(k)
        .lease(LEASE)
        .on_locked(OnLocked::FailFast)
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            // The work is done; now the store becomes busy for longer than its busy timeout.
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut blocker)
                .await
                .unwrap();
            Ok::<_, Error>("charged".to_string())
        })
        .await;
    assert_eq!(
        out.unwrap(),
        Outcome::Fresh("charged".to_string()),
        "the caller gets its result"
    );
    assert!(matches!(
        store.get(&k).await.unwrap().unwrap().state,
        RecordState::InProgress { .. }
    ));
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let wait = OnLocked::Wait {
        timeout: Duration::from_secs(10),
    };
    let replay = guarded(&engine, k, wait)
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("charged again".to_string())
        })
        .await;
    assert_eq!(replay.unwrap(), Outcome::Replayed("charged".to_string()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
