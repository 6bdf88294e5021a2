//! The statements each path sends, counted as sqlx reports them (one `sqlx::query` tracing event
//! per statement executed), so the round trips docs/performance.md states are pinned: a change
//! that adds a statement to a path fails here.
//!
//! One test in this binary, with a process-wide subscriber: SQLite runs its statements on a
//! worker thread of its own, which a thread-local subscriber would not see, and another test
//! running beside it would add its statements to the count. Each store has a pool of one
//! connection: sqlx hands a connection back to its pool on a task of its own, and on a loaded
//! machine the next statement could find it not yet back and open a second connection, whose
//! set-up statements (SQLite's pragmas) would count as the path's.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    ClaimOutcome, ClaimRequest, Completion, Error, Idempotency, Key, StepWrite, Store,
};
use idem_sql::{PostgresStore, SqliteStore};
use idem_test_support::postgres::{drop_store_tables, fresh_store, pg_url};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

static STATEMENTS: AtomicUsize = AtomicUsize::new(0);

/// Counts sqlx's statement events; records nothing else.
struct CountStatements;

impl Subscriber for CountStatements {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if event.metadata().target() == "sqlx::query" {
            STATEMENTS.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The statements `f` sends.
async fn counted<T>(f: impl std::future::Future<Output = T>) -> (T, usize) {
    let before = STATEMENTS.load(Ordering::SeqCst);
    let out = f.await;
    (out, STATEMENTS.load(Ordering::SeqCst) - before)
}

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

/// What one store's paths cost, in statements.
#[derive(Debug, PartialEq)]
struct Costs {
    claim: usize,
    begin_steps: usize,
    write_step: usize,
    complete: usize,
    replay: usize,
    /// `claim_steps` of a new key: whether the log came back beside the claim, and its
    /// statements.
    claim_steps: (bool, usize),
    /// `claim_steps` of a key whose earlier attempt stored a step and released its claim: the
    /// claim, then the steps' begin.
    resumed_claim_steps: usize,
    /// A whole operation of three steps through the engine, each step one `INSERT` of its own.
    three_steps: usize,
}

async fn costs(store: &dyn Store) -> Costs {
    let key = Key::derive("round-trips", "", "k-1").unwrap();
    let (claimed, claim) = counted(store.claim(ClaimRequest::new(&key, LEASE))).await;
    let ClaimOutcome::Claimed(claimed) = claimed.unwrap() else {
        panic!("a new key is claimed")
    };
    let (log, begin_steps) = counted(store.begin_steps(&claimed, RETENTION)).await;
    assert!(log.unwrap().steps.is_empty());
    let (written, write_step) =
        counted(store.write_step(&claimed, StepWrite::new("a", 0, Some(b"1"), RETENTION))).await;
    written.unwrap();
    let done = Completion {
        response: Some(b"ok"),
        is_error: false,
        retention: RETENTION,
        key_retention: Duration::ZERO,
    };
    let (completed, complete) = counted(store.complete(&claimed, done)).await;
    completed.unwrap();
    let (replayed, replay) = counted(store.claim(ClaimRequest::new(&key, LEASE))).await;
    assert!(matches!(replayed.unwrap(), ClaimOutcome::Completed(_)));
    let other = Key::derive("round-trips", "", "k-2").unwrap();
    let (both, claim_steps) =
        counted(store.claim_steps(ClaimRequest::new(&other, LEASE), RETENTION)).await;
    let (claimed, log) = both.unwrap();
    let ClaimOutcome::Claimed(first) = claimed else {
        panic!("a new key is claimed: {claimed:?}")
    };
    store
        .write_step(&first, StepWrite::new("a", 0, Some(b"1"), RETENTION))
        .await
        .unwrap();
    store.abort(&first).await.unwrap();
    let (resumed, resumed_claim_steps) =
        counted(store.claim_steps(ClaimRequest::new(&other, LEASE), RETENTION)).await;
    let (_, resumed) = resumed.unwrap();
    assert_eq!(
        resumed.map(|log| (log.attempt, log.steps.len())),
        Some((2, 1))
    );

    Costs {
        claim,
        begin_steps,
        write_step,
        complete,
        replay,
        claim_steps: (log.is_some(), claim_steps),
        resumed_claim_steps,
        three_steps: 0,
    }
}

/// An operation of three steps, each an `INSERT` run by `insert` (one statement), through the
/// engine over `store`: its statements.
async fn three_steps<F, Fut>(store: impl Store, insert: F) -> usize
where
    F: Fn(u32) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), Error>> + Send,
{
    let engine = Idempotency::new(store);
    let key = Key::derive("round-trips", "", "three").unwrap();
    let (out, n) = counted(engine.call(key).run_steps(|steps| async move {
        for i in 0..3u32 {
            let insert = insert.clone();
            steps.run(&format!("step {i}"), move || insert(i)).await?;
        }
        Ok::<_, Error>(3u32)
    }))
    .await;
    assert_eq!(out.unwrap().into_inner(), 3);
    n
}

/// A step's work: `sql` (an `INSERT` binding the step's number) on `pool`, one statement.
macro_rules! inserting {
    ($pool:expr, $sql:expr) => {{
        let (pool, sql) = ($pool.clone(), $sql);
        move |i: u32| {
            let (pool, sql) = (pool.clone(), sql.clone());
            async move {
                sqlx::query(&sql)
                    .bind(i64::from(i))
                    .execute(&pool)
                    .await
                    .map_err(idem_sql::sql_error)?;
                Ok(())
            }
        }
    }};
}

#[test]
fn each_path_sends_the_statements_the_docs_state() {
    tracing::subscriber::set_global_default(CountStatements).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = SqliteStore::builder()
            .pruner(None)
            .max_connections(1)
            .open(dir.path().join("idem.db"))
            .await
            .unwrap();
        let mut found = costs(&sqlite).await;
        sqlx::query("CREATE TABLE effects (n INTEGER NOT NULL)")
            .execute(sqlite.pool())
            .await
            .unwrap();
        found.three_steps = three_steps(
            sqlite.clone(),
            inserting!(
                sqlite.pool(),
                "INSERT INTO effects (n) VALUES ($1)".to_owned()
            ),
        )
        .await;
        // SQLite has no data-modifying CTE: its claim is three statements (a read, the claim,
        // a read), sent as one query (one hand-over to the connection's thread).
        assert_eq!(
            found,
            Costs {
                claim: 1,
                begin_steps: 1,
                write_step: 1,
                complete: 1,
                // Claiming first (the last claim found a new key): the claim, then the read.
                replay: 2,
                // The claim's query: the log beside the claim.
                claim_steps: (true, 1),
                // The claim's query, then the begin.
                resumed_claim_steps: 2,
                // claim and begin 1 + 3 × (the step's own 1 + its record 1) + completion 1
                three_steps: 8,
            },
            "SQLite"
        );

        let Some(url) = pg_url("each_path_sends_the_statements_the_docs_state") else {
            return;
        };
        let pg: PostgresStore = fresh_store(&url, |b| b.pruner(None).max_connections(1)).await;
        let mut found = costs(&pg).await;
        let effects = idem_test_support::unique_name("effects");
        sqlx::query(&format!("CREATE TABLE \"{effects}\" (n BIGINT NOT NULL)"))
            .execute(pg.pool())
            .await
            .unwrap();
        found.three_steps = three_steps(
            pg.clone(),
            inserting!(
                pg.pool(),
                format!("INSERT INTO \"{effects}\" (n) VALUES ($1)")
            ),
        )
        .await;
        sqlx::query(&format!("DROP TABLE \"{effects}\""))
            .execute(pg.pool())
            .await
            .unwrap();
        drop_store_tables(&pg).await;
        assert_eq!(
            found,
            Costs {
                claim: 1,
                begin_steps: 1,
                write_step: 1,
                complete: 1,
                replay: 2,
                // One statement: the claim, and whether there is anything to resume.
                claim_steps: (true, 1),
                // The claim's statement, then the begin.
                resumed_claim_steps: 2,
                // the claim that begins the steps 1 + 3 × (the step's own 1 + its record 1)
                // + completion 1: the 8 statements of recovery points written by hand
                three_steps: 8,
            },
            "PostgreSQL"
        );
    });
}
