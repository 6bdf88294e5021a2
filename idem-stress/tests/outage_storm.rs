//! PostgreSQL stops for 10 s in the middle of a storm of engine calls (64 tasks, thousands of
//! keys), then comes back; once with a lease longer than the outage, once with one shorter. What
//! "Never twice" asks of it, in one process:
//!
//! - no key's work runs twice: a call whose completion met the outage hands it to the
//!   background and returns its result, and the completion lands when the server is back. With
//!   the shorter lease the claims run out in the database during the outage; a retry of this
//!   process meets the completion pending here, waits for it and replays, and never claims;
//! - every caller gets its real result, a replay, or a typed error (never `LeaseLost`, never a
//!   "did not run" for work that ran);
//! - nothing completed is lost: every key ends completed with the one result its work produced.
//!
//! The test runs its own throwaway cluster (from `IDEM_PG_BINDIR`) so it may stop it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Error, Idempotency, OnLocked, Outcome, Store};
use idem_sql::PostgresStore;
use idem_stress::key;
use idem_test_support::postgres::{pg_bindir, TempCluster};

const TASKS: usize = 64;
const KEYS_PER_TASK: usize = 150;
const KEYS: usize = TASKS * KEYS_PER_TASK;
const OUTAGE: Duration = Duration::from_secs(10);

/// What the callers saw, per key.
#[derive(Default)]
struct Seen {
    /// How many times each key's work ran.
    runs: Vec<AtomicUsize>,
    /// The value each fresh execution returned to its caller.
    fresh: Mutex<HashMap<usize, u64>>,
    /// Typed errors, by kind, during the storm.
    errors: Mutex<HashMap<String, usize>>,
    serial: AtomicUsize,
}

fn describe(e: &Error) -> String {
    match e {
        Error::Store(s) => format!("store {:?}", s.kind()),
        Error::Locked { .. } => "locked".into(),
        other => panic!("an error no caller should see in this storm: {other}"),
    }
}

/// One call of key `i`; `Ok(true)` when it has an answer (fresh or replayed).
async fn call(engine: &Idempotency, seen: &Seen, i: usize, on_locked: OnLocked) -> bool {
    let out = engine
        .call(key(i))
        .on_locked(on_locked)
        .run(async {
            seen.runs[i].fetch_add(1, Ordering::SeqCst);
            // Work in flight when the server goes away.
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, Error>(seen.serial.fetch_add(1, Ordering::SeqCst) as u64)
        })
        .await;
    match out {
        Ok(Outcome::Fresh(v)) => {
            seen.fresh.lock().unwrap().insert(i, v);
            true
        }
        Ok(Outcome::Replayed(_)) => true,
        Err(e) => {
            *seen.errors.lock().unwrap().entry(describe(&e)).or_default() += 1;
            false
        }
    }
}

/// A lease longer than the outage: no claim held across it runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_mid_storm_runs_nothing_twice_and_loses_nothing() {
    storm(
        "outage_mid_storm_runs_nothing_twice_and_loses_nothing",
        Duration::from_secs(15),
    )
    .await;
}

/// A lease half the outage: every claim held across it runs out in the database, and the one
/// process's own retries must not take the keys whose results it is still storing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_longer_than_the_lease_runs_nothing_twice_in_one_process() {
    storm(
        "outage_longer_than_the_lease_runs_nothing_twice_in_one_process",
        Duration::from_secs(5),
    )
    .await;
}

async fn storm(test: &str, lease: Duration) {
    let Some(bindir) = pg_bindir(test) else {
        return;
    };
    let cluster = TempCluster::init(&bindir);
    cluster.start();
    let store = PostgresStore::builder()
        // No background pruner: the test stops the server under the store and counts rows.
        .pruner(None)
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(1))
        .connect(&cluster.url())
        .await
        .unwrap();
    let engine = Idempotency::builder(store.clone())
        .lease(lease)
        .build()
        .unwrap();
    let seen = Arc::new(Seen {
        runs: (0..KEYS).map(|_| AtomicUsize::new(0)).collect(),
        ..Seen::default()
    });
    let done = Arc::new(AtomicUsize::new(0));

    // The storm: each task calls its keys once, fail fast, and keeps the ones that failed.
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (engine, seen, done) = (engine.clone(), seen.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let fail_fast = OnLocked::FailFast;
            let mut failed = Vec::new();
            for j in 0..KEYS_PER_TASK {
                let i = t + TASKS * j;
                if !call(&engine, &seen, i, fail_fast).await {
                    failed.push(i);
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            failed
        }));
    }

    // Stop the server a third of the way in, keep it down for the outage, start it again.
    tokio::time::timeout(Duration::from_secs(120), async {
        while done.load(Ordering::SeqCst) < KEYS / 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the storm did not get a third of the way in two minutes");
    cluster.stop("fast");
    tokio::time::sleep(OUTAGE).await;
    cluster.start();

    let mut failed = Vec::new();
    for task in tasks {
        failed.extend(task.await.unwrap());
    }
    eprintln!(
        "{} of {KEYS} calls failed during the storm: {:?}",
        failed.len(),
        seen.errors.lock().unwrap()
    );
    assert!(
        !failed.is_empty(),
        "the outage hit no call: the test proves nothing"
    );

    // The clients retry what failed, waiting on keys still held (a claim whose completion is
    // still being retried, or one whose reply the outage swallowed, which frees within a lease).
    let wait = OnLocked::Wait { timeout: lease * 2 };
    for i in failed {
        let answered = call(&engine, &seen, i, wait).await;
        assert!(answered, "k{i}: the retry got no answer");
    }

    // Never twice: every key's work ran exactly once.
    let twice: Vec<usize> = (0..KEYS)
        .filter(|&i| seen.runs[i].load(Ordering::SeqCst) > 1)
        .collect();
    assert!(
        twice.is_empty(),
        "{} keys ran twice: {twice:?}",
        twice.len()
    );
    let never: Vec<usize> = (0..KEYS)
        .filter(|&i| seen.runs[i].load(Ordering::SeqCst) == 0)
        .collect();
    assert!(
        never.is_empty(),
        "{} keys never ran: {never:?}",
        never.len()
    );

    // Nothing completed is lost: every key replays the value its one execution returned.
    let fresh = seen.fresh.lock().unwrap().clone();
    let probe = OnLocked::Wait { timeout: lease * 2 };
    for i in 0..KEYS {
        let replay = engine
            .call(key(i))
            .on_locked(probe)
            .run(async { Ok::<_, Error>(u64::MAX) })
            .await
            .unwrap_or_else(|e| panic!("k{i}: {e}"));
        match (replay, fresh.get(&i)) {
            (Outcome::Replayed(v), Some(&expected)) => assert_eq!(v, expected, "k{i}"),
            (Outcome::Replayed(_), None) => {}
            (Outcome::Fresh(_), _) => panic!("k{i}: its completed record was lost"),
        }
    }
    let records: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records WHERE state = 1")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(records, KEYS as i64);
    assert!(store.get(&key(0)).await.unwrap().is_some());
}
