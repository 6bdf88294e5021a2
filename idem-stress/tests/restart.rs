//! PostgreSQL stops in the middle of a run and comes back: calls in flight get typed
//! `Unavailable` store errors, calls after the restart succeed, and no completed record is lost.
//! The test runs its own throwaway cluster (from `IDEM_PG_BINDIR`) so it may stop it.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Claim, ClaimOutcome, ClaimRequest, Completion, Error, RecordState, Store, StoreErrorKind,
};
use idem_sql::PostgresStore;
use idem_stress::key;
use idem_test_support::postgres::{pg_bindir, TempCluster};
use sqlx::Connection;
use tokio::sync::Barrier;

const LEASE: Duration = Duration::from_secs(1);
const RETENTION: Duration = Duration::from_secs(3600);
/// Calls held mid-work (claimed, not yet completed) when the server stops.
const IN_FLIGHT: usize = 8;

fn done(response: &[u8], retention: Duration) -> Completion<'_> {
    Completion {
        response: Some(response),
        is_error: false,
        retention,
        key_retention: Duration::ZERO,
    }
}

fn assert_unavailable(what: &str, r: Result<impl std::fmt::Debug, Error>) {
    match r {
        Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unavailable => {
            eprintln!("{what}: {e}")
        }
        other => panic!("{what}: expected a store error of kind Unavailable, got {other:?}"),
    }
}

async fn claim(store: &PostgresStore, i: usize) -> Claim {
    match store.claim(ClaimRequest::new(&key(i), LEASE)).await {
        Ok(ClaimOutcome::Claimed(claim)) => claim,
        other => panic!("k{i}: expected Claimed, got {other:?}"),
    }
}

/// Runs `i` to completion after a restart: a claim left behind by a failed call blocks it for at
/// most one lease, or its completion had committed after all and replays.
async fn run_to_completion(store: &PostgresStore, i: usize, response: &[u8]) {
    for _ in 0..200 {
        match store
            .claim(ClaimRequest::new(&key(i), LEASE))
            .await
            .unwrap()
        {
            ClaimOutcome::Claimed(claim) => {
                store
                    .complete(&claim, done(response, RETENTION))
                    .await
                    .unwrap();
                return;
            }
            ClaimOutcome::Completed(_) => return,
            other @ (ClaimOutcome::Uncertain { .. } | ClaimOutcome::Expired { .. }) => {
                panic!("no claim here is uncertain or tombstoned, yet got {other:?}")
            }
            ClaimOutcome::Locked { retry_after } => {
                tokio::time::sleep(retry_after.max(Duration::from_millis(10))).await
            }
        }
    }
    panic!("k{i} stayed locked after the restart");
}

async fn assert_completed(store: &PostgresStore, i: usize, response: &[u8]) {
    match store.get(&key(i)).await.unwrap().map(|r| r.state) {
        Some(RecordState::Completed(c)) => assert_eq!(c.response.as_deref(), Some(response)),
        other => panic!("k{i}: completed record lost, found {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_run_gives_typed_errors_and_loses_nothing() {
    let Some(bindir) = pg_bindir("restart_mid_run_gives_typed_errors_and_loses_nothing") else {
        return;
    };
    let cluster = TempCluster::init(&bindir);
    cluster.start();
    let url = cluster.url();
    // A short acquire timeout: calls made while the server is down fail fast instead of
    // waiting for it.
    let store = PostgresStore::builder()
        // No background pruner: the test counts the claims waiting on locks.
        .pruner(None)
        .max_connections(IN_FLIGHT as u32 + 4)
        .acquire_timeout(Duration::from_secs(1))
        .connect(&url)
        .await
        .unwrap();

    for (cycle, mode) in ["fast", "immediate"].into_iter().enumerate() {
        let base = cycle * 1000;
        // Completed before the stop: these must survive it.
        for i in base..base + 50 {
            let c = claim(&store, i).await;
            store
                .complete(&c, done(format!("before {i}").as_bytes(), RETENTION))
                .await
                .unwrap();
        }

        // Calls mid-work: claimed, completing only after the server is gone.
        let barrier = Arc::new(Barrier::new(IN_FLIGHT + 1));
        let mut working = Vec::new();
        for n in 0..IN_FLIGHT {
            let i = base + 100 + n;
            let c = claim(&store, i).await;
            let (store, barrier) = (store.clone(), barrier.clone());
            working.push(tokio::spawn(async move {
                barrier.wait().await;
                store
                    .complete(&c, done(format!("during {i}").as_bytes(), RETENTION))
                    .await
            }));
        }

        // A statement executing inside the server: a claim parked on a row lock. The lock is
        // held by a prepared transaction, which no shutdown ends, so the claim is still waiting
        // when its session is terminated. (A lock held by an ordinary session could be released
        // by that session's own termination a moment before the claim's, letting the claim
        // commit first.)
        let blocked_key = base + 200;
        let gid = format!("idem_restart_{cycle}");
        let mut locker = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut locker).await.unwrap();
        sqlx::query(
            "INSERT INTO idem_records (key, token, state, expires_at) \
             VALUES ($1, '\\x00000000000000000000000000000000', 0, clock_timestamp() - interval '1 second')",
        )
        .bind(&key(blocked_key).as_bytes()[..])
        .execute(&mut locker)
        .await
        .unwrap();
        sqlx::raw_sql(&format!("PREPARE TRANSACTION '{gid}'"))
            .execute(&mut locker)
            .await
            .unwrap();
        locker.close().await.unwrap();
        let parked = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .claim(ClaimRequest::new(&key(blocked_key), LEASE))
                    .await
            }
        });
        let mut parked_seen = false;
        for _ in 0..500 {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE '%ON CONFLICT (key) DO UPDATE%'",
            )
            .fetch_one(store.pool())
            .await
            .unwrap();
            if waiting > 0 {
                parked_seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(parked_seen, "the claim never waited on the row lock");

        cluster.stop(mode);

        assert_unavailable(
            &format!("claim executing during `pg_ctl stop -m {mode}`"),
            parked.await.unwrap(),
        );
        barrier.wait().await;
        for w in working {
            assert_unavailable(
                &format!("complete after `stop -m {mode}`"),
                w.await.unwrap(),
            );
        }
        assert_unavailable(
            "start while the server is down",
            store
                .claim(ClaimRequest::new(&key(base + 300), LEASE))
                .await,
        );
        assert_unavailable("get while the server is down", store.get(&key(base)).await);

        cluster.start();
        // The prepared transaction survived the restart and still holds the row lock.
        let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(&format!("ROLLBACK PREPARED '{gid}'"))
            .execute(&mut admin)
            .await
            .unwrap();
        admin.close().await.unwrap();

        // New calls succeed at once: the pool drops its dead connections and opens new ones.
        let c = claim(&store, base + 400).await;
        store.complete(&c, done(b"after", RETENTION)).await.unwrap();
        // The interrupted calls are retried and finish (their claims block for one lease).
        for n in 0..IN_FLIGHT {
            let i = base + 100 + n;
            run_to_completion(&store, i, format!("during {i}").as_bytes()).await;
        }
        run_to_completion(&store, blocked_key, b"parked").await;
        // Nothing completed before the stop was lost.
        for i in base..base + 50 {
            assert_completed(&store, i, format!("before {i}").as_bytes()).await;
        }
        assert_completed(&store, base + 400, b"after").await;
    }
}
