//! Storing a result on PostgreSQL when the statement fails for a passing reason: the backend
//! killed under it three times, or a `statement_timeout` hit. The work ran, so the engine hands
//! the completion to the background and returns the result; the completion lands once the
//! obstacle is gone, and a retry replays it. The work runs once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Error, Idempotency, OnLocked, Outcome, PostgresStore, RecordState, Store};
use idem_stress::key;
use idem_test_support::postgres as env;
use idem_test_support::unique_name;
use sqlx::{Connection, PgConnection};

const LEASE: Duration = Duration::from_secs(20);

async fn drop_table(store: &PostgresStore) {
    for t in [
        store.table().to_owned(),
        format!("{}_migrations", store.table()),
    ] {
        sqlx::query(&format!("DROP TABLE IF EXISTS \"{t}\""))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

/// Locks the key's row from another connection, so the completion's `UPDATE` waits on it.
async fn lock_row(url: &str, store: &PostgresStore, i: usize) -> PgConnection {
    let mut locker = PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut locker).await.unwrap();
    let locked = sqlx::query(&format!(
        "SELECT 1 FROM \"{}\" WHERE key = $1 FOR UPDATE",
        store.table()
    ))
    .bind(&key(i).as_bytes()[..])
    .fetch_optional(&mut locker)
    .await
    .unwrap();
    assert!(locked.is_some(), "the claim's row is there to lock");
    locker
}

/// The pid of the backend whose completion waits on the row lock, once there is one.
///
/// Backends in `killed` are skipped: one that was terminated can still be listed, waiting, for a
/// moment before it exits, and terminating it again would find it gone.
async fn waiting_completion(locker: &mut PgConnection, table: &str, killed: &[i32]) -> i32 {
    for _ in 0..1000 {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%SET state = 1%' AND query LIKE $1 \
             AND pid <> ALL($2)",
        )
        .bind(format!("%{table}%"))
        .bind(killed)
        .fetch_optional(&mut *locker)
        .await
        .unwrap();
        if let Some(pid) = pid {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no completion ever waited on the row lock");
}

/// Runs key `i` through the engine; the work, once done, has the row locked so the completion
/// waits. Returns the caller's result, the locker, and the run counter.
async fn run_with_completion_blocked(
    url: &str,
    store: &PostgresStore,
    engine: &Idempotency,
    i: usize,
    runs: &Arc<AtomicUsize>,
) -> (
    tokio::task::JoinHandle<Result<Outcome<String>, Error>>,
    PgConnection,
) {
    let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let call = {
        let (engine, runs) = (engine.clone(), runs.clone());
        tokio::spawn(async move {
            engine
                .call(key(i))
                .run_detached(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // The row is locked before the work returns, so the completion waits.
                    let _ = locked_tx.send(());
                    let _ = go_rx.await;
                    Ok::<_, Error>(format!("charged {i}"))
                })
                .await
        })
    };
    locked_rx.await.unwrap();
    let locker = lock_row(url, store, i).await;
    go_tx.send(()).unwrap();
    (call, locker)
}

/// After the obstacle is gone: the record completes with the one result, and a waiting retry
/// replays it without running the work.
async fn completes_once(engine: &Idempotency, store: &PostgresStore, i: usize, runs: &AtomicUsize) {
    let wait = OnLocked::Wait { timeout: LEASE };
    let replay = engine
        .call(key(i))
        .on_locked(wait)
        .run(async { Ok::<_, Error>("ran again".to_string()) })
        .await
        .unwrap();
    assert_eq!(replay, Outcome::Replayed(format!("charged {i}")));
    assert!(matches!(
        store.get(&key(i)).await.unwrap().unwrap().state,
        RecordState::Completed(_)
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_killed_three_times_during_complete() {
    let Some(url) = env::pg_url("backend_killed_three_times_during_complete") else {
        return;
    };
    let store = PostgresStore::builder()
        // No background pruner: the test finds and terminates the store's backends.
        .pruner(None)
        .table(unique_name("idem_kill"))
        .connect(&url)
        .await
        .unwrap();
    let engine = Idempotency::builder(store.clone())
        .lease(LEASE)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (call, mut locker) = run_with_completion_blocked(&url, &store, &engine, 1, &runs).await;
    let mut call = Some(call);
    let mut admin = PgConnection::connect(&url).await.unwrap();
    let mut killed = Vec::new();
    for kill in 1..=3 {
        let pid = waiting_completion(&mut admin, store.table(), &killed).await;
        killed.push(pid);
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        assert!(killed, "kill {kill}");
        if let Some(call) = call.take() {
            // The first failure hands the completion to the background: the caller has its
            // result although nothing is stored yet.
            let out = call.await.unwrap().unwrap();
            assert_eq!(out, Outcome::Fresh("charged 1".to_string()));
        }
    }
    // The fourth attempt waits on the lock too; releasing it lets it land.
    waiting_completion(&mut admin, store.table(), &killed).await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut locker)
        .await
        .unwrap();
    completes_once(&engine, &store, 1, &runs).await;
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_during_complete() {
    let Some(url) = env::pg_url("statement_timeout_during_complete") else {
        return;
    };
    // Every statement of the store's pool may take at most 300 ms.
    let sep = if url.contains('?') { '&' } else { '?' };
    let timed = format!("{url}{sep}options=-c%20statement_timeout%3D300");
    let store = PostgresStore::builder()
        // No background pruner: the test finds and terminates the store's backends.
        .pruner(None)
        .table(unique_name("idem_timeout"))
        .connect(&timed)
        .await
        .unwrap();
    let engine = Idempotency::builder(store.clone())
        .lease(LEASE)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (call, mut locker) = run_with_completion_blocked(&url, &store, &engine, 2, &runs).await;
    // The completion times out on the lock after 300 ms: the caller gets its result anyway.
    let out = call.await.unwrap().unwrap();
    assert_eq!(out, Outcome::Fresh("charged 2".to_string()));
    assert!(matches!(
        store.get(&key(2)).await.unwrap().unwrap().state,
        RecordState::InProgress { .. }
    ));
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut locker)
        .await
        .unwrap();
    completes_once(&engine, &store, 2, &runs).await;
    drop_table(&store).await;
}
