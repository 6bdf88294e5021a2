//! PostgreSQL-specific behaviour of `PostgresStore` that the shared conformance suite cannot
//! see: migrations under concurrent first connects, table names, the snapshot race of the
//! one-statement claim, typed errors for rows it cannot read and for the server's failures (a
//! killed backend, a full disk, a lost reply), and completions stored after a passing failure.
//!
//! The server comes from `IDEM_TEST_PG_URL`; `a_full_disk_is_a_full_store_error` runs a cluster
//! of its own from `IDEM_PG_BINDIR`. Without them a test prints why and skips, unless
//! `IDEM_REQUIRE_PG=1` (set by `scripts/test`) makes that a failure. What needs several
//! processes, or a server stopped and started under it, is in `idem-stress`.
#![cfg(feature = "postgres")]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Claim, ClaimOutcome, ClaimRequest, Completion, Error, Idempotency, Key, OnLapse, OnLocked,
    Outcome, RecordState, Store, StoreErrorKind, Token,
};
use idem_sql::{PostgresStore, PostgresStoreBuilder, Transactional};
use idem_test_support::postgres::{
    drop_store_tables, drop_tables, fresh_store, pg_bindir, pg_url, TempCluster,
};
use idem_test_support::{current_test, eventually, not_migrated, unique_name, Tmpfs};
use sqlx::{Connection, PgConnection, PgPool};

const LEASE: Duration = Duration::from_secs(30);

/// The `i`-th test key.
fn key(i: usize) -> Key {
    Key::derive("postgres-test", "", &format!("k{i}")).unwrap()
}

/// How long a completed record is kept.
const RETENTION: Duration = Duration::from_secs(3600);

/// The test server's URL, or `None` after printing why the running test skips (a failure under
/// `IDEM_REQUIRE_PG=1`).
fn server() -> Option<String> {
    pg_url(&current_test())
}

/// A builder without the background pruner, for the tests below: they count rows, watch and
/// terminate the pool's backends, and time connections, which the pruner's own statements would
/// disturb.
fn quiet() -> PostgresStoreBuilder {
    PostgresStore::builder().pruner(None)
}

/// A [`quiet`] store on a fresh table of the server at `url`.
async fn fresh(url: &str) -> PostgresStore {
    fresh_store(url, |b| b.pruner(None)).await
}

/// Runs `test` with the server's URL and a [`fresh`] store, then drops the store's tables (a
/// failing test leaves them behind); skips without a server.
async fn on_fresh<Fut: Future<Output = ()>>(test: impl FnOnce(String, PostgresStore) -> Fut) {
    let Some(url) = server() else { return };
    let store = fresh(&url).await;
    test(url, store.clone()).await;
    drop_store_tables(&store).await;
}

async fn pool(url: &str) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .expect("connect to the test server")
}

/// A successful completion answering `body`.
fn done(body: &[u8], retention: Duration) -> Completion<'_> {
    Completion {
        response: Some(body),
        is_error: false,
        retention,
        key_retention: Duration::ZERO,
    }
}

/// Claims `key(i)`, which must be new.
async fn claim(store: &PostgresStore, i: usize) -> Claim {
    match store
        .claim(ClaimRequest::new(&key(i), LEASE))
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("a new key starts, got {other:?}"),
    }
}

/// Claims `key(i)` and completes it with `body`, kept for `retention`.
async fn completed(store: &PostgresStore, i: usize, body: &[u8], retention: Duration) -> Claim {
    let c = claim(store, i).await;
    store.complete(&c, done(body, retention)).await.unwrap();
    c
}

/// Whether `key(i)` starts afresh.
async fn starts(store: &PostgresStore, i: usize) -> bool {
    matches!(
        store
            .claim(ClaimRequest::new(&key(i), LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Claimed(_)
    )
}

/// Whether `key(i)` replays a stored result.
async fn replays(store: &PostgresStore, i: usize) -> bool {
    matches!(
        store
            .claim(ClaimRequest::new(&key(i), LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Completed(_)
    )
}

/// Runs `sql` (one or more statements) on `db`, a connection or a pool.
async fn exec<'e>(db: impl sqlx::PgExecutor<'e>, sql: &'e str) {
    sqlx::raw_sql(sql).execute(db).await.unwrap();
}

/// The number `sql` (a `SELECT count(*)`) counts.
async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// The definition of `table`'s pruner's index (schema version 6), if it has one.
async fn expiry_index(pool: &PgPool, table: &str) -> Option<String> {
    sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = $1")
        .bind(format!("{table}_expires_at_idx"))
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// Connects `n` stores (a connection each) to `table` at once, as nodes starting together do;
/// every connect must succeed (`what` says why).
async fn connect_at_once(url: &str, table: &str, n: usize, what: &str) {
    let connects: Vec<_> = (0..n)
        .map(|_| {
            let (url, table) = (url.to_owned(), table.to_owned());
            tokio::spawn(async move { quiet().table(table).max_connections(1).connect(&url).await })
        })
        .collect();
    for c in connects {
        c.await.unwrap().expect(what);
    }
}

/// The error kind of a store error, `None` for any other result.
fn kind<T: std::fmt::Debug>(result: &Result<T, Error>) -> Option<StoreErrorKind> {
    match result {
        Err(Error::Store(e)) => Some(e.kind()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connects_migrate_once() {
    let Some(url) = server() else { return };
    let table = unique_name("idem_mig");
    connect_at_once(&url, &table, 8, "every concurrent first connect succeeds").await;
    let pool = pool(&url).await;
    let versions: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT version FROM \"{table}_migrations\" ORDER BY version"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        versions,
        vec![1, 2, 3, 4, 5, 6],
        "each migration is recorded exactly once"
    );
    assert!(
        expiry_index(&pool, &table)
            .await
            .is_some_and(|d| d.contains("CASE") && d.contains("result_until")),
        "the pruner's index exists"
    );
    // A second connect to an up-to-date table changes nothing.
    let store = quiet().table(&table).connect(&url).await.unwrap();
    drop_store_tables(&store).await;
}

#[tokio::test]
async fn schema_qualified_table_lives_in_its_schema() {
    let Some(url) = server() else { return };
    let pool = pool(&url).await;
    let schema = unique_name("idem_s");
    exec(&pool, &format!("CREATE SCHEMA \"{schema}\"")).await;
    let store = quiet()
        .table(format!("{schema}.Records"))
        .from_pool(pool.clone())
        .await
        .unwrap();
    assert_eq!(store.table(), format!("{schema}.Records"));
    claim(&store, 1).await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
    )
    .bind(&schema)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        tables,
        vec!["Records", "Records_migrations", "Records_steps"]
    );
    exec(&pool, &format!("DROP SCHEMA \"{schema}\" CASCADE")).await;
}

#[tokio::test]
async fn missing_schema_is_a_typed_store_error() {
    let Some(url) = server() else { return };
    let err = quiet()
        .table(format!("{}.t", unique_name("idem_no_such_schema")))
        .connect(&url)
        .await;
    assert_eq!(kind(&err), Some(StoreErrorKind::Query), "{err:?}");
}

#[tokio::test]
async fn newer_schema_version_is_refused() {
    on_fresh(|url, store| async move {
        let table = store.table();
        sqlx::query(&format!(
            "INSERT INTO \"{table}_migrations\" (version, description) VALUES (99, 'from the future')"
        ))
        .execute(store.pool())
        .await
        .unwrap();
        let err = quiet().table(table).connect(&url).await.unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn corrupt_rows_are_typed_errors() {
    on_fresh(|_, store| async move {
        let table = store.table();
        // Someone dropped the checks and wrote a 3-byte token.
        exec(
            store.pool(),
            &format!("ALTER TABLE \"{table}\" DROP CONSTRAINT \"{table}_token_check\""),
        )
        .await;
        sqlx::query(&format!(
            "INSERT INTO \"{table}\" (key, token, state, expires_at) \
             VALUES ($1, '\\x010203', 0, clock_timestamp() + interval '1 hour')"
        ))
        .bind(&key(1).as_bytes()[..])
        .execute(store.pool())
        .await
        .unwrap();
        let err = store.get(&key(1)).await;
        assert_eq!(kind(&err), Some(StoreErrorKind::Corrupt), "{err:?}");
    })
    .await;
}

/// Whether some backend is blocked on a lock while running a statement on `table`.
async fn someone_waits_on_a_lock(pool: &PgPool, table: &str) -> bool {
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap();
    waiting > 0
}

/// Waits (bounded) until some backend is blocked on a lock while running a statement on
/// `table`: our claim is then parked behind the other transaction.
async fn wait_until_blocked(pool: &PgPool, table: &str) {
    for _ in 0..500 {
        if someone_waits_on_a_lock(pool, table).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the claim never blocked on the other transaction");
}

/// `start` on `key(1)` through the pool (the bare claim) or, with `in_tx`, inside a transaction
/// (the transactional CTE), while another node's transaction `other` holds the row: the claim
/// waits on the row lock; once `other` commits, its answer.
async fn start_behind(
    store: &PostgresStore,
    pool: &PgPool,
    in_tx: bool,
    other: sqlx::Transaction<'_, sqlx::Postgres>,
) -> ClaimOutcome {
    let claim = tokio::spawn({
        let (store, pool) = (store.clone(), pool.clone());
        async move {
            if !in_tx {
                return store.claim(ClaimRequest::new(&key(1), LEASE)).await;
            }
            let mut tx = pool.begin().await.map_err(idem_sql::sql_error)?;
            let start = idem_sql::TransactionalStore::claim_in(
                &store,
                &mut tx,
                ClaimRequest::new(&key(1), LEASE),
            )
            .await;
            tx.commit().await.map_err(idem_sql::sql_error)?;
            start
        }
    });
    wait_until_blocked(pool, store.table()).await;
    other.commit().await.unwrap();
    claim.await.unwrap().unwrap()
}

/// A row committed after the claim statement took its snapshot is invisible to the statement's
/// own read; the store must read it afresh rather than report nothing. Both claim statements:
/// the pool's bare claim and transactional mode's CTE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_sees_rows_committed_after_its_snapshot() {
    let Some(url) = server() else { return };
    for in_tx in [false, true] {
        let store = fresh(&url).await;
        let table = store.table();
        let pool = pool(&url).await;

        // 1. Another node inserts a live in-progress row and has not committed yet.
        let other = Token::random();
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(&format!(
            "INSERT INTO \"{table}\" (key, token, state, expires_at) \
             VALUES ($1, $2, 0, clock_timestamp() + interval '30 seconds')"
        ))
        .bind(&key(1).as_bytes()[..])
        .bind(&other.to_bytes()[..])
        .execute(&mut *tx)
        .await
        .unwrap();
        match start_behind(&store, &pool, in_tx, tx).await {
            ClaimOutcome::Locked { retry_after } => assert!(retry_after > Duration::from_secs(20)),
            other => panic!("in_tx {in_tx}: expected Locked, got {other:?}"),
        }

        // 2. Another node takes over an expired row and has not committed yet: the claim's
        //    snapshot still holds the expired old version.
        sqlx::query(&format!(
            "UPDATE \"{table}\" SET expires_at = clock_timestamp() - interval '1 second' WHERE key = $1"
        ))
        .bind(&key(1).as_bytes()[..])
        .execute(&pool)
        .await
        .unwrap();
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(&format!(
            "UPDATE \"{table}\" SET state = 1, response = 'theirs', \
             expires_at = clock_timestamp() + interval '1 hour' WHERE key = $1"
        ))
        .bind(&key(1).as_bytes()[..])
        .execute(&mut *tx)
        .await
        .unwrap();
        match start_behind(&store, &pool, in_tx, tx).await {
            ClaimOutcome::Completed(cached) => {
                assert_eq!(cached.response.as_deref(), Some(&b"theirs"[..]))
            }
            other => panic!("in_tx {in_tx}: expected the other node's result, got {other:?}"),
        }
        match store.get(&key(1)).await.unwrap().unwrap().state {
            RecordState::Completed(c) => assert_eq!(c.response.as_deref(), Some(&b"theirs"[..])),
            other => panic!("the other node's result stands, got {other:?}"),
        }
        drop_store_tables(&store).await;
    }
}

/// Whether `start` on `key(1)` (completed) answers while another transaction holds the row
/// lock: a read-first `start` answers at once; a claim-first one meets the row and waits on the
/// lock (seen in `pg_stat_activity`), then answers once the lock is released.
async fn replays_without_the_row_lock(store: &PostgresStore, pool: &PgPool, table: &str) -> bool {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM \"{table}\" WHERE key = $1 FOR UPDATE"
    ))
    .bind(&key(1).as_bytes()[..])
    .execute(&mut *tx)
    .await
    .unwrap();
    let start = tokio::spawn({
        let store = store.clone();
        async move { store.claim(ClaimRequest::new(&key(1), LEASE)).await }
    });
    let mut answered = false;
    for _ in 0..500 {
        if start.is_finished() {
            answered = true;
            break;
        }
        if someone_waits_on_a_lock(pool, table).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tx.rollback().await.unwrap();
    match start.await.unwrap() {
        Ok(ClaimOutcome::Completed(_)) => answered,
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// The adaptive claim order reads first after a run of replays and claims first after a run of
/// new keys; pinned orders ignore the traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_order_follows_the_traffic_and_pinned_orders_hold() {
    use idem_sql::ClaimOrder;
    on_fresh(|url, store| async move {
        let table = store.table();
        let open = |order| quiet().table(table).claim_order(order).connect(&url);
        let pool = pool(&url).await;
        let c = claim(&store, 1).await;
        store.complete(&c, done(b"r", RETENTION)).await.unwrap();

        let adaptive = open(ClaimOrder::Adaptive).await.unwrap();
        assert!(!replays_without_the_row_lock(&adaptive, &pool, table).await);
        for _ in 0..32 {
            assert!(replays(&adaptive, 1).await);
        }
        assert!(replays_without_the_row_lock(&adaptive, &pool, table).await);
        for n in 100..132 {
            assert!(starts(&adaptive, n).await);
        }
        assert!(!replays_without_the_row_lock(&adaptive, &pool, table).await);

        let read_first = open(ClaimOrder::ReadFirst).await.unwrap();
        let claim_first = open(ClaimOrder::ClaimFirst).await.unwrap();
        for n in 200..232 {
            assert!(starts(&read_first, n).await);
            assert!(replays(&claim_first, 1).await);
        }
        assert!(replays_without_the_row_lock(&read_first, &pool, table).await);
        assert!(!replays_without_the_row_lock(&claim_first, &pool, table).await);
    })
    .await;
}

/// Server time, not the application's: a lease is as long as asked, measured by the server.
#[tokio::test]
async fn leases_and_retention_use_server_time() {
    on_fresh(|_, store| async move {
        let table = store.table();
        claim(&store, 1).await;
        let (lease_s, now_s): (f64, f64) = sqlx::query_as(&format!(
            "SELECT extract(epoch from expires_at)::float8, extract(epoch from clock_timestamp())::float8 \
             FROM \"{table}\" WHERE key = $1"
        ))
        .bind(&key(1).as_bytes()[..])
        .fetch_one(store.pool())
        .await
        .unwrap();
        let left = lease_s - now_s;
        assert!(left > 20.0 && left <= 30.0, "lease ends {left} s from now");
    })
    .await;
}

/// One delivery of `key(1)` in transactional mode: runs `insert` in the caller's transaction on
/// `conn` and answers 500.
async fn deliver(
    idem: &Transactional<PostgresStore>,
    conn: &mut PgConnection,
    insert: &str,
) -> Outcome<u64> {
    let sql = insert.to_owned();
    idem.call(key(1))
        .run(conn, move |conn| {
            Box::pin(async move {
                sqlx::query(&sql)
                    .execute(&mut *conn)
                    .await
                    .map_err(idem_sql::sql_error)?;
                Ok::<_, Error>(500u64)
            })
        })
        .await
        .unwrap()
}

/// Transactional mode on PostgreSQL: claim, business write and completion commit together, so
/// concurrent duplicates on separate connections apply the effect once, and a transaction rolled
/// back after the work leaves neither the write nor the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_mode_applies_the_effect_once() {
    let Some(url) = server() else { return };
    let table = unique_name("idem_tx");
    let ledger = unique_name("idem_ledger");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .connect(&url)
        .await
        .unwrap();
    let store = quiet().table(&table).from_pool(pool.clone()).await.unwrap();
    exec(
        &pool,
        &format!("CREATE TABLE \"{ledger}\" (request text NOT NULL, cents bigint NOT NULL)"),
    )
    .await;
    let idem = Transactional::new(store);
    let insert = format!("INSERT INTO \"{ledger}\" VALUES ('req-1', 500)");
    let count = format!("SELECT count(*) FROM \"{ledger}\"");

    // A delivery that crashes before committing: rolled back, nothing is left behind.
    let mut tx = pool.begin().await.unwrap();
    let out = deliver(&idem, &mut tx, &insert).await;
    assert!(!out.is_replayed());
    tx.rollback().await.unwrap();
    assert!(idem.store().get(&key(1)).await.unwrap().is_none());

    // Eight concurrent deliveries, each in its own transaction on its own connection.
    let deliveries: Vec<_> = (0..8)
        .map(|_| {
            let (idem, pool, insert) = (idem.clone(), pool.clone(), insert.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let out = deliver(&idem, &mut tx, &insert).await;
                tx.commit().await.unwrap();
                out
            })
        })
        .collect();
    let mut ran = 0;
    for d in deliveries {
        let out = d.await.unwrap();
        ran += usize::from(!out.is_replayed());
        assert_eq!(out.into_inner(), 500);
    }
    assert_eq!(ran, 1, "one delivery ran the work, the others replayed");
    let rows: i64 = sqlx::query_scalar(&count).fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 1, "the effect was applied exactly once");
    drop_tables(&pool, &[&table, &format!("{table}_migrations"), &ledger]).await;
}

/// `keys` keys, each run by two callers at once (the second waits to take over), whose work holds
/// one of the pool's three connections for 5 s, longer than the 3 s lease; returns how often each
/// key's work ran.
async fn run_while_work_holds_the_pool(url: &str, keys: usize) -> Vec<usize> {
    let store = fresh_store(url, |b| {
        b.pruner(None)
            .max_connections(3)
            .acquire_timeout(Duration::from_secs(60))
    })
    .await;
    let engine = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(3))
        .on_locked(OnLocked::Wait {
            timeout: Duration::from_secs(60),
        })
        .build()
        .unwrap();
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..keys).map(|_| AtomicUsize::new(0)).collect());
    let calls: Vec<_> = (0..2 * keys)
        .map(|i| {
            let (engine, store, runs) = (engine.clone(), store.clone(), runs.clone());
            let k = i % keys;
            tokio::spawn(async move {
                engine
                    .call(key(k))
                    .run(async {
                        runs[k].fetch_add(1, Ordering::SeqCst);
                        let conn = store.pool().acquire().await.map_err(idem_sql::sql_error)?;
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        drop(conn);
                        Ok::<_, Error>(k)
                    })
                    .await
            })
        })
        .collect();
    for call in calls {
        // A call that lost its lease fails; the counts below show what that cost.
        let _ = call.await.unwrap();
    }
    drop_store_tables(&store).await;
    runs.iter().map(|r| r.load(Ordering::SeqCst)).collect()
}

/// Renewal cannot be starved by the work's own use of the pool: three keys whose work holds
/// every connection of the pool for longer than the lease, each with a duplicate caller waiting
/// to take over. `renew` runs on the store's small pool of its own, so every lease stays renewed
/// and each key's work runs once. (With the heartbeat queueing on the main pool behind the work,
/// the leases ran out and each duplicate ran the work again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_is_not_starved_by_work_holding_the_pool() {
    let Some(url) = server() else { return };
    let runs = run_while_work_holds_the_pool(&url, 3).await;
    assert_eq!(runs, vec![1; 3], "executions per key");
}

/// Twice as many keys as connections (pool 3, lease 3 s, work holding a connection 5 s): the
/// second wave's work takes the connections that the first wave's completions wait for, longer
/// than the lease. Renewal on its own pool is not enough here: the engine also keeps renewing
/// until the completion has landed, or the duplicates would take the keys over and run them
/// again (11 executions for 6 keys before either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_queued_behind_work_keep_their_leases() {
    let Some(url) = server() else { return };
    let runs = run_while_work_holds_the_pool(&url, 6).await;
    assert_eq!(runs, vec![1; 6], "executions per key");
}

/// The store error a sqlx error becomes, for checking the mapping with real server errors.
fn kind_of(e: sqlx::Error) -> StoreErrorKind {
    idem_sql::sql_error(e).kind()
}

/// Runs `sql` on `conn`, which must fail; the error.
async fn fails(conn: &mut PgConnection, sql: &str) -> sqlx::Error {
    sqlx::raw_sql(sql).execute(conn).await.unwrap_err()
}

/// SQLSTATEs that pass map to `Transient`, a read-only transaction to `ReadOnly`, a lost session
/// to `Unavailable`: each produced for real on the test server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_map_to_typed_kinds() {
    let Some(url) = server() else { return };
    let pool = pool(&url).await;
    let table = unique_name("idem_kinds");
    exec(
        &pool,
        &format!(
            "CREATE TABLE \"{table}\" (id int PRIMARY KEY, n int NOT NULL); \
         INSERT INTO \"{table}\" VALUES (1, 0), (2, 0)"
        ),
    )
    .await;
    let mut a = PgConnection::connect(&url).await.unwrap();
    let mut b = PgConnection::connect(&url).await.unwrap();
    let lock_row = |id: i32| format!("SELECT n FROM \"{table}\" WHERE id = {id} FOR UPDATE");
    let add_one = format!("UPDATE \"{table}\" SET n = n + 1 WHERE id = 1");

    // 57014: statement timeout.
    exec(&mut a, "SET statement_timeout = '50ms'").await;
    let e = sqlx::query("SELECT pg_sleep(5)")
        .execute(&mut a)
        .await
        .unwrap_err();
    assert_eq!(kind_of(e), StoreErrorKind::Transient);
    exec(&mut a, "RESET statement_timeout").await;

    // 55P03: lock not available.
    exec(&mut a, &format!("BEGIN; {}", lock_row(1))).await;
    let e = fails(
        &mut b,
        &format!("BEGIN; SET LOCAL lock_timeout = '50ms'; {}", lock_row(1)),
    )
    .await;
    assert_eq!(kind_of(e), StoreErrorKind::Transient);
    exec(&mut a, "ROLLBACK").await;
    exec(&mut b, "ROLLBACK").await;

    // 40001: serialization failure (a concurrent update under REPEATABLE READ).
    exec(
        &mut a,
        &format!("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT n FROM \"{table}\" WHERE id = 1"),
    )
    .await;
    exec(&mut b, &add_one).await;
    let e = fails(&mut a, &add_one).await;
    assert_eq!(kind_of(e), StoreErrorKind::Transient);
    exec(&mut a, "ROLLBACK").await;

    // 40P01: deadlock. Each session locks one row, then asks for the other's.
    exec(&mut a, &format!("BEGIN; {}", lock_row(1))).await;
    exec(&mut b, &format!("BEGIN; {}", lock_row(2))).await;
    let (second_a, second_b) = (lock_row(2), lock_row(1));
    let (ra, rb) = tokio::join!(
        sqlx::raw_sql(&second_a).execute(&mut a),
        sqlx::raw_sql(&second_b).execute(&mut b),
    );
    let e = match (ra, rb) {
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => e,
        other => panic!("expected one deadlock victim, got {other:?}"),
    };
    assert_eq!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("40P01")
    );
    assert_eq!(kind_of(e), StoreErrorKind::Transient);
    exec(&mut a, "ROLLBACK").await;
    exec(&mut b, "ROLLBACK").await;

    // 25006: a read-only transaction, as on a standby; here through the store.
    let store = fresh_store(&url, |b| b.pruner(None).max_connections(1)).await;
    let mut only = store.pool().acquire().await.unwrap();
    exec(&mut *only, "SET default_transaction_read_only = on").await;
    drop(only);
    let err = store.claim(ClaimRequest::new(&key(1), LEASE)).await;
    assert_eq!(kind(&err), Some(StoreErrorKind::ReadOnly), "{err:?}");
    assert!(err.unwrap_err().is_retryable());

    // 57P01: the server ended the session (an administrator, a failover).
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut b)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&mut a)
        .await
        .unwrap();
    let e = sqlx::query("SELECT 1").execute(&mut b).await.unwrap_err();
    assert_eq!(kind_of(e), StoreErrorKind::Unavailable);

    // Through the test's pool: the store's one connection is read-only.
    let t = store.table();
    drop_tables(&pool, &[&table, t, &format!("{t}_migrations")]).await;
}

/// A statement's commit can fail after its rows came back (here a deferred constraint trigger
/// fails at COMMIT with SQLSTATE 53100, as a full disk would): the claim and the completion
/// must then fail with that error, never report a write that was rolled back.
#[tokio::test]
async fn a_commit_that_fails_after_the_rows_fails_the_call() {
    let Some(url) = server() else { return };
    let store = fresh(&url).await;
    let table = store.table();
    let kept = claim(&store, 1).await;
    exec(
        store.pool(),
        &format!(
            "CREATE FUNCTION \"{table}_full\"() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'no room at commit' USING ERRCODE = 'disk_full'; END $$; \
         CREATE CONSTRAINT TRIGGER \"{table}_full\" AFTER INSERT OR UPDATE ON \"{table}\" \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION \"{table}_full\"()"
        ),
    )
    .await;

    let err = store.claim(ClaimRequest::new(&key(2), LEASE)).await;
    assert_eq!(kind(&err), Some(StoreErrorKind::Full), "{err:?}");
    assert!(
        store.get(&key(2)).await.unwrap().is_none(),
        "nothing claimed"
    );
    let err = store.complete(&kept, done(b"r", RETENTION)).await;
    assert_eq!(kind(&err), Some(StoreErrorKind::Full), "{err:?}");
    assert!(matches!(
        store.get(&key(1)).await.unwrap().unwrap().state,
        RecordState::InProgress { .. }
    ));

    exec(
        store.pool(),
        &format!(
            "DROP TABLE \"{table}\", \"{table}_migrations\"; DROP FUNCTION \"{table}_full\"()"
        ),
    )
    .await;
}

/// A records table dropped under running nodes is created again by the next connect (the
/// ledger still lists the migration), also when several nodes connect at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_records_table_is_created_again_on_connect() {
    on_fresh(|url, store| async move {
        let table = store.table();
        claim(&store, 1).await;
        exec(store.pool(), &format!("DROP TABLE \"{table}\"")).await;
        let err = store.claim(ClaimRequest::new(&key(2), LEASE)).await;
        assert_eq!(kind(&err), Some(StoreErrorKind::Query), "{err:?}");

        connect_at_once(&url, table, 4, "connect re-creates the table").await;
        // The running store works again too: same table name, same statements; the key starts
        // afresh, its record went with the table.
        let c = claim(&store, 1).await;
        store.complete(&c, done(b"back", RETENTION)).await.unwrap();
        assert!(
            expiry_index(store.pool(), table).await.is_some(),
            "the pruner's index is back too"
        );
    })
    .await;
}

/// A full disk (SQLSTATE 53100, from a real ENOSPC) is a `Full` store error: the records table
/// lives in a tablespace on a tiny tmpfs that another table has filled. Runs its own cluster, so
/// the shared server gets no tablespace.
#[tokio::test]
async fn a_full_disk_is_a_full_store_error() {
    let Some(bindir) = pg_bindir("a_full_disk_is_a_full_store_error") else {
        return;
    };
    // Dropped after the cluster (declared before it), which must stop using the files first.
    // A tmpfs the `postgres` user owns, for a tablespace that can fill up.
    let fs = match Tmpfs::mount(1 << 20, Some("postgres")) {
        Ok(fs) => fs,
        Err(why) => {
            // Mounting needs root, which IDEM_REQUIRE_PG does not promise; the mapping of 53100
            // is still checked by `a_commit_that_fails_after_the_rows_fails_the_call`.
            eprintln!("skipping a_full_disk_is_a_full_store_error: cannot mount a tmpfs ({why})");
            return;
        }
    };
    let cluster = TempCluster::init(&bindir);
    cluster.start();
    let store = quiet().connect(&cluster.url()).await.unwrap();
    // One statement at a time: CREATE TABLESPACE refuses to run in a transaction block.
    for sql in [
        format!("CREATE TABLESPACE tiny LOCATION '{}'", fs.path().display()),
        "ALTER TABLE idem_records SET TABLESPACE tiny".to_owned(),
        "CREATE TABLE filler (b text) TABLESPACE tiny".to_owned(),
    ] {
        exec(store.pool(), &sql).await;
    }
    let e = sqlx::query(
        "INSERT INTO filler SELECT repeat(md5(g::text), 30) FROM generate_series(1, 100000) g",
    )
    .execute(store.pool())
    .await
    .unwrap_err();
    assert_eq!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("53100"),
        "{e}"
    );
    let err = store
        .claim(ClaimRequest::new(&key(1), LEASE))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Store(e) if e.kind() == StoreErrorKind::Full),
        "{err:?}"
    );
    assert!(err.is_retryable());
    store.pool().close().await;
    drop(cluster);
}

/// A loopback TCP proxy in front of the test server that can lose one reply: told to, it
/// passes the next statement the client sends to the server, swallows the server's whole reply
/// to it, up to and including the `ReadyForQuery` that ends it (so the statement has committed),
/// and then cuts that connection.
struct LossyProxy {
    addr: std::net::SocketAddr,
    state: std::sync::Arc<LossState>,
    accept: tokio::task::JoinHandle<()>,
}

/// What the proxy's relays share.
#[derive(Default)]
struct LossState {
    /// Set by the test: lose the reply to the next statement.
    armed: std::sync::atomic::AtomicBool,
    /// Set by the client-to-server relay as it passes that statement on.
    swallowing: std::sync::atomic::AtomicBool,
    /// Set once a reply was swallowed and its connection cut.
    lost: std::sync::atomic::AtomicBool,
}

impl LossyProxy {
    async fn start(server: std::net::SocketAddr) -> LossyProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = std::sync::Arc::new(LossState::default());
        let accept = tokio::spawn({
            let state = state.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(upstream) = tokio::net::TcpStream::connect(server).await else {
                        continue;
                    };
                    tokio::spawn(relay(client, upstream, state.clone()));
                }
            }
        });
        LossyProxy {
            addr,
            state,
            accept,
        }
    }

    fn lose_next_reply(&self) {
        use std::sync::atomic::Ordering;
        self.state.armed.store(true, Ordering::SeqCst);
    }

    fn lost_a_reply(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.state.lost.load(Ordering::SeqCst)
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies bytes both ways between a client and the server until either side closes, or until
/// the reply it was told to lose has been swallowed.
async fn relay(
    client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    state: std::sync::Arc<LossState>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = upstream.into_split();
    let to_server = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // A statement starts with Bind ('B') or Parse ('P'). A lone Sync ('S') is the
            // pool's check of a released connection, whose reply is not the one to lose.
            if buf[0] != b'S' && state.armed.swap(false, Ordering::SeqCst) {
                state.swallowing.store(true, Ordering::SeqCst);
            }
            if server_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let to_client = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut swallowed: Vec<u8> = Vec::new();
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if state.swallowing.load(Ordering::SeqCst) {
                swallowed.extend_from_slice(&buf[..n]);
                // A reply ends with ReadyForQuery: 'Z', length 5, transaction status. The server
                // sends it once the statement's implicit transaction has committed.
                let end = swallowed.len().saturating_sub(6);
                if swallowed[end..].starts_with(b"Z\0\0\0\x05") {
                    state.swallowing.store(false, Ordering::SeqCst);
                    state.lost.store(true, Ordering::SeqCst);
                    return;
                }
                continue;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever direction ends first ends the connection: dropping both halves closes both
    // sockets, so the client sees its connection cut.
    tokio::select! {
        () = to_server => {}
        () = to_client => {}
    }
}

/// A completion whose commit landed but whose reply was lost (the connection cut right after the
/// server answered) fails with `Unavailable`; completing again is `Ok`, and the record holds the
/// first completion's result. (Before completion was idempotent per claim, the retry found its
/// own completed record and reported `LeaseLost`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_reply_was_lost_is_completed_again_ok() {
    use std::str::FromStr;

    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    let Some(url) = server() else { return };
    let options = PgConnectOptions::from_str(&url).unwrap();
    let addr = tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = LossyProxy::start(addr).await;
    // One connection, so that the proxy relays every statement of the store. (The pool also
    // checks a connection with a lone Sync as it is released; the proxy tells that apart.)
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(
            options
                .clone()
                .host(&proxy.addr.ip().to_string())
                .port(proxy.addr.port()),
        )
        .await
        .unwrap();
    let store = quiet()
        .table(unique_name("idem_lost"))
        .from_pool(pool)
        .await
        .unwrap();
    // Warm up: the completion statement is prepared on the connection, so the next completion
    // is one exchange (Bind, Execute, Sync) whose whole reply the proxy swallows.
    completed(&store, 0, b"warm", RETENTION).await;

    let c = claim(&store, 1).await;
    proxy.lose_next_reply();
    let err = store.complete(&c, done(b"first", RETENTION)).await;
    assert!(proxy.lost_a_reply(), "the proxy lost no reply");
    assert_eq!(kind(&err), Some(StoreErrorKind::Unavailable), "{err:?}");
    store
        .complete(&c, done(b"retried", RETENTION))
        .await
        .expect("completing the same claim again is Ok");
    match store.get(&key(1)).await.unwrap().map(|r| r.state) {
        Some(RecordState::Completed(cached)) => {
            assert_eq!(cached.response.as_deref(), Some(&b"first"[..]))
        }
        other => panic!("expected the first completion's record, got {other:?}"),
    }
    drop_store_tables(&store).await;
}

/// The backend pid of the store's one pooled connection, once it is back in the pool (sqlx
/// returns a connection on a task of its own, pinging it first).
async fn idle_backend(store: &PostgresStore) -> i32 {
    let mut conn = store.pool().acquire().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    for _ in 0..5_000 {
        if store.pool().num_idle() == 1 {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the connection never went back to the pool");
}

/// Ends the session `pid` and waits until the server has let it go.
async fn terminate(pool: &PgPool, pid: i32) {
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(pool)
        .await
        .unwrap();
    for _ in 0..5_000 {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(pool)
            .await
            .unwrap();
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("backend {pid} outlived its termination");
}

/// `ping_idle_after`: a connection used within it is handed out unpinged (no round trip before
/// the statement), so one whose session ended meanwhile fails the call that gets it, as an
/// `Unavailable` store error that claims nothing, and is then replaced; a connection idle for
/// longer (here `ZERO`: every one) is pinged, found dead and replaced before the call uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_pinged_only_after_ping_idle_after() {
    let Some(url) = server() else { return };
    let admin = pool(&url).await;
    let one_connection = |ping_idle_after| {
        fresh_store(&url, move |b| {
            b.pruner(None)
                .max_connections(1)
                .ping_idle_after(ping_idle_after)
        })
    };
    let unpinged = one_connection(Duration::from_secs(3600)).await;
    assert!(!unpinged.pool().options().get_test_before_acquire());
    terminate(&admin, idle_backend(&unpinged).await).await;
    let err = unpinged.claim(ClaimRequest::new(&key(1), LEASE)).await;
    assert_eq!(kind(&err), Some(StoreErrorKind::Unavailable), "{err:?}");
    assert!(err.unwrap_err().is_retryable());
    // Nothing was claimed, and the next call gets a new connection.
    assert!(starts(&unpinged, 1).await);

    let pinged = one_connection(Duration::ZERO).await;
    assert!(pinged.pool().options().get_test_before_acquire());
    terminate(&admin, idle_backend(&pinged).await).await;
    assert!(starts(&pinged, 2).await);

    drop_store_tables(&unpinged).await;
    drop_store_tables(&pinged).await;
}

/// Expired records go with no pruner spawned by the user: the store runs one while it lives.
/// A store without a pruner writes 1,500 records whose retention ends at once (expiry is the
/// server's clock: the test polls, bounded, until they have expired) and one kept for an hour;
/// a store connected to the table with the defaults then deletes the 1,500 (a batch of 1,000 and
/// one of 500) and keeps the one.
#[tokio::test]
async fn expired_records_are_deleted_with_no_pruner_spawned() {
    let Some(url) = server() else { return };
    let writer = fresh(&url).await;
    let table = writer.table();
    for n in 0..1_500 {
        completed(&writer, n, b"short", Duration::from_millis(1)).await;
    }
    completed(&writer, 9_999, b"kept", RETENTION).await;
    let expired = format!("SELECT count(*) FROM \"{table}\" WHERE expires_at <= clock_timestamp()");
    assert!(eventually(|| async { count(writer.pool(), &expired).await == 1_500 }).await);

    let store = PostgresStore::builder()
        .table(table)
        .connect(&url)
        .await
        .unwrap();
    assert!(store.prunes_in_background());
    let completed = format!("SELECT count(*) FROM \"{table}\" WHERE state = 1");
    assert!(
        eventually(|| async { count(store.pool(), &completed).await == 1 }).await,
        "{} completed records left",
        count(store.pool(), &completed).await
    );
    assert!(replays(&store, 9_999).await);
    drop(store);
    drop_store_tables(&writer).await;
}

/// Runs `sql` (several statements) in one transaction on `conn`, with `search_path` set to
/// `schema` for it, as `psql --single-transaction` after `SET search_path` would.
async fn apply_in(conn: &mut sqlx::PgConnection, schema: &str, sql: &str) {
    let mut tx = conn.begin().await.unwrap();
    exec(&mut *tx, &format!("SET LOCAL search_path TO \"{schema}\"")).await;
    exec(&mut *tx, sql).await;
    tx.commit().await.unwrap();
}

/// The columns, constraints and indexes of the tables of `schema`, as PostgreSQL describes
/// them (names without the schema).
async fn described(pool: &PgPool, schema: &str) -> Vec<String> {
    let sql = "SELECT format('%s.%s %s %s %s', table_name, column_name, data_type, is_nullable, \
                   coalesce(column_default, '')) \
               FROM information_schema.columns WHERE table_schema = $1 \
               UNION ALL \
               SELECT format('%s %s', conrelid::regclass::text, pg_get_constraintdef(oid)) \
               FROM pg_constraint WHERE connamespace = $1::regnamespace \
               UNION ALL \
               SELECT format('%s %s', indexname, indexdef) FROM pg_indexes WHERE schemaname = $1 \
               ORDER BY 1";
    let rows: Vec<String> = sqlx::query_scalar(sql)
        .bind(schema)
        .fetch_all(pool)
        .await
        .unwrap();
    rows.into_iter()
        .map(|r| {
            r.replace(&format!("{schema}."), "")
                .replace(schema, "SCHEMA")
        })
        .collect()
}

/// The out-of-band path on PostgreSQL. The owner applies the shipped `.sql` file (twice: the
/// second time changes nothing) and it makes exactly what `migrate()` makes; an application role
/// without `CREATE` on the schema cannot connect with a migrating connect, gets
/// `SchemaNotMigrated` before the schema exists, and claims, completes and replays with a
/// non-migrating connect once it does.
#[tokio::test]
async fn a_role_without_create_uses_the_store_after_an_out_of_band_migration() {
    let Some(url) = server() else { return };
    let owner = pool(&url).await;
    let (schema, by_migrate, role) = (
        unique_name("idem_oob"),
        unique_name("idem_oob_m"),
        unique_name("idem_app"),
    );
    exec(
        &owner,
        &format!(
        "CREATE SCHEMA \"{schema}\"; CREATE SCHEMA \"{by_migrate}\"; CREATE ROLE \"{role}\" LOGIN; \
         GRANT USAGE ON SCHEMA \"{schema}\" TO \"{role}\""
    ),
    )
    .await;
    let table = format!("{schema}.idem_records");
    let app_options = url
        .parse::<sqlx::postgres::PgConnectOptions>()
        .unwrap()
        .username(&role);
    let app_pool = || {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect_with(app_options.clone())
    };
    let checking = || {
        PostgresStore::builder()
            .table(&table)
            .migrate_on_connect(false)
    };

    // Before the migration: a typed error naming what to do, and nothing created.
    let err = checking()
        .from_pool(app_pool().await.unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::SchemaNotMigrated { table: t, found: None, needed: 6 } if *t == table),
        "{err:?}"
    );
    assert!(err.to_string().contains("migrate"), "{err}");
    assert_eq!(described(&owner, &schema).await, Vec::<String>::new());
    // A migrating connect needs CREATE, which the role lacks.
    let err = PostgresStore::builder()
        .table(&table)
        .from_pool(app_pool().await.unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Store(e) if e.kind() == StoreErrorKind::Query),
        "{err:?}"
    );

    // The owner migrates out of band: the shipped file, twice, under the schema's search path;
    // and `migrate()` in a second schema, to compare.
    let file = include_str!("../sql/postgres/idem_records.sql");
    assert_eq!(file, PostgresStore::builder().schema_sql().unwrap());
    let mut conn = owner.acquire().await.unwrap();
    apply_in(&mut conn, &schema, file).await;
    apply_in(&mut conn, &schema, file).await;
    PostgresStore::builder()
        .table(format!("{by_migrate}.idem_records"))
        .migrate(&mut conn)
        .await
        .unwrap();
    drop(conn);
    let applied = described(&owner, &schema).await;
    assert!(!applied.is_empty());
    assert_eq!(applied, described(&owner, &by_migrate).await);
    let ledger =
        |s: &str| format!("SELECT version, description FROM \"{s}\".idem_records_migrations");
    let listed: Vec<(i64, String)> = sqlx::query_as(&ledger(&schema))
        .fetch_all(&owner)
        .await
        .unwrap();
    let by_migrate_listed: Vec<(i64, String)> = sqlx::query_as(&ledger(&by_migrate))
        .fetch_all(&owner)
        .await
        .unwrap();
    assert_eq!(listed.len(), 6);
    assert_eq!(listed, by_migrate_listed);

    // The application role: the rights to read and write rows, and nothing more.
    exec(
        &owner,
        &format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" TO \"{role}\""
    ),
    )
    .await;
    let store = checking()
        .from_pool(app_pool().await.unwrap())
        .await
        .unwrap();
    let c = claim(&store, 1).await;
    store.complete(&c, done(b"paid", RETENTION)).await.unwrap();
    let ClaimOutcome::Completed(replayed) = store
        .claim(ClaimRequest::new(&key(1), LEASE))
        .await
        .unwrap()
    else {
        panic!("a completed key replays");
    };
    assert_eq!(replayed.response.as_deref(), Some(&b"paid"[..]));
    // Its background pruner needs no more than these rights either.
    completed(&store, 2, b"paid", Duration::from_millis(1)).await;
    let gone = format!("SELECT count(*) FROM \"{schema}\".idem_records WHERE state = 1");
    assert!(eventually(|| async { count(&owner, &gone).await == 1 }).await);

    // A ledger that lists no version is a schema older than this idem needs.
    exec(
        &owner,
        &format!("DELETE FROM \"{schema}\".idem_records_migrations"),
    )
    .await;
    let err = checking()
        .from_pool(app_pool().await.unwrap())
        .await
        .unwrap_err();
    assert!(not_migrated(&err, Some(0), 6), "{err:?}");

    let pool = store.pool().clone();
    drop(store);
    pool.close().await;
    exec(
        &owner,
        &format!(
            "DROP SCHEMA \"{schema}\" CASCADE; DROP SCHEMA \"{by_migrate}\" CASCADE; \
         DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""
        ),
    )
    .await;
}

// Storing a result when the statement fails for a passing reason: the backend killed under it
// three times, or a `statement_timeout` hit. The work ran, so the engine hands the completion to
// the background and returns the result; the completion lands once the obstacle is gone, and a
// retry replays it. The work runs once.

/// The lease of the completion tests: the retry below waits for it at most.
const COMPLETION_LEASE: Duration = Duration::from_secs(20);

/// A store on a fresh table of the server at `url` (without the background pruner: the tests
/// find and terminate the store's backends) and an engine on it with [`COMPLETION_LEASE`].
async fn engine_on(url: &str) -> (PostgresStore, Idempotency) {
    let store = fresh(url).await;
    let engine = Idempotency::builder(store.clone())
        .lease(COMPLETION_LEASE)
        .build()
        .unwrap();
    (store, engine)
}

/// Locks the key's row from another connection, so the completion's `UPDATE` waits on it.
async fn lock_row(url: &str, store: &PostgresStore, i: usize) -> PgConnection {
    let mut locker = PgConnection::connect(url).await.unwrap();
    exec(&mut locker, "BEGIN").await;
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
    let wait = OnLocked::Wait {
        timeout: COMPLETION_LEASE,
    };
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
    let Some(url) = server() else { return };
    let (store, engine) = engine_on(&url).await;
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
    exec(&mut locker, "ROLLBACK").await;
    completes_once(&engine, &store, 1, &runs).await;
    drop_store_tables(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_during_complete() {
    let Some(url) = server() else { return };
    // Every statement of the store's pool may take at most 300 ms.
    let sep = if url.contains('?') { '&' } else { '?' };
    let timed = format!("{url}{sep}options=-c%20statement_timeout%3D300");
    let (store, engine) = engine_on(&timed).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let (call, mut locker) = run_with_completion_blocked(&url, &store, &engine, 2, &runs).await;
    // The completion times out on the lock after 300 ms: the caller gets its result anyway.
    let out = call.await.unwrap().unwrap();
    assert_eq!(out, Outcome::Fresh("charged 2".to_string()));
    assert!(matches!(
        store.get(&key(2)).await.unwrap().unwrap().state,
        RecordState::InProgress { .. }
    ));
    exec(&mut locker, "ROLLBACK").await;
    completes_once(&engine, &store, 2, &runs).await;
    drop_store_tables(&store).await;
}

/// How many rows of `store`'s table hold `key`, whatever their state.
async fn rows_of(pool: &PgPool, store: &PostgresStore, key: &Key) -> i64 {
    let sql = format!("SELECT count(*) FROM {} WHERE key = $1", store.table());
    sqlx::query_scalar(&sql)
        .bind(key.as_bytes().as_slice())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The reliability harness's case on the store with its background pruner running: a claim with
/// a 2 s lease, completed 3 s later with nobody having claimed the key meanwhile, completes and
/// replays. The pruner demonstrably ran after the lease ended (a record whose retention ended
/// later is gone, polled, bounded) and left the lapsed claim (`LAPSED_CLAIMS_KEPT`). Then a
/// claim whose lease ended longer ago than that (its expiry moved back in the table) is pruned.
#[tokio::test]
async fn a_lapsed_holder_completes_with_the_pruner_running() {
    let Some(url) = server() else { return };
    let pruner = idem_core::PrunerConfig::new().interval(Duration::from_millis(50));
    let store = fresh_store(&url, |b| b.pruner(pruner)).await;
    let pool = pool(&url).await;
    let late = match store
        .claim(ClaimRequest::new(&key(1), Duration::from_secs(2)))
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("a new key starts, got {other:?}"),
    };
    // Waits out the 2 s lease on the server's clock.
    tokio::time::sleep(Duration::from_secs(3)).await;
    completed(&store, 2, b"gone", Duration::from_millis(1)).await;
    assert!(
        eventually(|| async { rows_of(&pool, &store, &key(2)).await == 0 }).await,
        "the pruner never ran"
    );
    assert_eq!(
        rows_of(&pool, &store, &key(1)).await,
        1,
        "the lapsed claim was pruned"
    );
    store
        .complete(&late, done(b"late", RETENTION))
        .await
        .unwrap();
    assert!(replays(&store, 1).await);

    let stale = claim(&store, 3).await;
    sqlx::query(&format!(
        "UPDATE {} SET expires_at = clock_timestamp() - $1 * interval '1 millisecond' - interval '1 second' WHERE key = $2",
        store.table()
    ))
    .bind(i64::try_from(idem_core::LAPSED_CLAIMS_KEPT.as_millis()).unwrap())
    .bind(key(3).as_bytes().as_slice())
    .execute(&pool)
    .await
    .unwrap();
    assert!(
        eventually(|| async { rows_of(&pool, &store, &key(3)).await == 0 }).await,
        "a claim lapsed past the window was never pruned"
    );
    assert!(matches!(
        store.complete(&stale, done(b"too late", RETENTION)).await,
        Err(Error::LeaseLost)
    ));
    drop_store_tables(&store).await;
}

/// The relations PostgreSQL holds in `schema` (tables `r`, indexes `i`), as `kind name`, less
/// the primary keys' indexes, which PostgreSQL names itself.
async fn relations(pool: &PgPool, schema: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relkind::text || ' ' || c.relname::text FROM pg_class c \
         WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'i') \
           AND c.relname::text NOT LIKE '%pkey' ORDER BY 1",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The longest table name the docs allow (63 bytes, PostgreSQL's identifier limit) works, with
/// a connect that migrates and with one that only checks: every derived name (ledger, steps
/// table, the two expiry indexes, the records table's partial index of uncertain claims) fits whole, so PostgreSQL keeps what the store names, and the
/// store claims, keeps steps and completes. One byte more is refused before connecting.
#[tokio::test]
async fn a_table_name_of_the_longest_allowed_length_works() {
    let Some(url) = server() else { return };
    let pool = pool(&url).await;
    let schema = unique_name("idem_long");
    exec(&pool, &format!("CREATE SCHEMA \"{schema}\"")).await;
    let table = format!("t{}", "x".repeat(62));
    let store = quiet()
        .table(format!("{schema}.{table}"))
        .from_pool(pool.clone())
        .await
        .unwrap();
    idem_test_support::claim_steps_and_complete(&store, &key(1)).await;
    let names = relations(&pool, &schema).await;
    assert_eq!(names.len(), 6, "{names:?}");
    assert!(names.contains(&format!("r {table}")), "{names:?}");
    let indexes: Vec<&String> = names.iter().filter(|n| n.starts_with("i ")).collect();
    assert_eq!(indexes.len(), 3, "{names:?}");
    // Not cut by PostgreSQL: the suffix the store gave is whole.
    let suffixes = ["_expires_at_idx", "_uncertain_idx"];
    assert!(
        indexes
            .iter()
            .all(|n| suffixes.iter().any(|s| n.ends_with(s))),
        "{names:?}"
    );
    let checking = quiet()
        .table(format!("{schema}.{table}"))
        .migrate_on_connect(false)
        .from_pool(pool.clone())
        .await
        .unwrap();
    idem_test_support::claim_steps_and_complete(&checking, &key(2)).await;
    assert_eq!(relations(&pool, &schema).await, names);

    let err = quiet()
        .table(format!("{schema}.{table}x"))
        .connect("postgres://nobody@127.0.0.1:1/none")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    exec(&pool, &format!("DROP SCHEMA \"{schema}\" CASCADE")).await;
}

/// A deployment migrated to version 1 with a 48-byte table name (the longest version 1
/// allowed) is upgraded: a connect that only checks says it is at version 1, a migrating one
/// brings it to the current version with its records kept, and the store works.
#[tokio::test]
async fn a_v1_schema_with_a_48_byte_table_name_is_upgraded() {
    let Some(url) = server() else { return };
    let pool = pool(&url).await;
    let schema = unique_name("idem_v1");
    exec(&pool, &format!("CREATE SCHEMA \"{schema}\"")).await;
    let table = format!("{schema}.v{}", "1".repeat(47));
    let script = quiet().table(&table).schema_sql().unwrap();
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    exec(&mut *tx, idem_test_support::script_up_to(&script, 1)).await;
    tx.commit().await.unwrap();
    // A record the v1 store completed.
    let kept = key(7);
    let quoted = format!("\"{schema}\".\"v{}\"", "1".repeat(47));
    sqlx::query(&format!(
        "INSERT INTO {quoted} (key, token, state, expires_at, response) \
         VALUES ($1, $2, 1, clock_timestamp() + interval '1 hour', $3)"
    ))
    .bind(kept.as_bytes().as_slice())
    .bind(&[0u8; 16][..])
    .bind(&b"v1 receipt"[..])
    .execute(&pool)
    .await
    .unwrap();

    let err = quiet()
        .table(&table)
        .migrate_on_connect(false)
        .from_pool(pool.clone())
        .await
        .unwrap_err();
    assert!(not_migrated(&err, Some(1), 6), "{err:?}");
    let store = quiet().table(&table).from_pool(pool.clone()).await.unwrap();
    idem_test_support::upgraded_and_working(&store, &kept, &key(8)).await;
    exec(&pool, &format!("DROP SCHEMA \"{schema}\" CASCADE")).await;
}

/// A lease or retention short enough to wait out in a test, and a wait past it (the server's
/// clock is the host's).
const SHORT: Duration = Duration::from_millis(300);
const PAST_SHORT: Duration = Duration::from_millis(600);

/// A completion with a tombstone keeps its result for its retention; then `prune_expired`
/// drops the response's bytes (counting the row) and keeps the row, which a claim meets as
/// `Expired` (since the retention's end) and `get` reads as such; a completion without one is
/// deleted at the same moment. The row left holds no response: 113 bytes as
/// `pg_column_size` counts it (145 with a fingerprint; docs/postgres.md has what that makes
/// with the page's item pointer and the index entries), and it is out of the partial index of
/// responses to drop.
#[tokio::test]
async fn a_tombstone_keeps_no_response_bytes_after_prune() {
    on_fresh(|url, store| async move {
        let pool = pool(&url).await;
        let table = store.table().to_owned();
        let body = vec![7u8; 4096];
        let c = claim(&store, 1).await;
        let tombstone = Completion {
            key_retention: Duration::from_secs(3600),
            ..done(&body, SHORT)
        };
        store.complete(&c, tombstone).await.unwrap();
        let c = claim(&store, 2).await;
        store.complete(&c, done(b"gone", SHORT)).await.unwrap();
        let (kept, gone) = (key(1), key(2));
        let (gap, result_us): (i64, i64) = sqlx::query_as(&format!(
            "SELECT extract(epoch from expires_at - result_until)::bigint, \
               (extract(epoch from result_until) * 1000000)::bigint \
             FROM \"{table}\" WHERE key = $1"
        ))
        .bind(kept.as_bytes().as_slice())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(gap, 3600, "whole seconds after the result");
        let in_index = format!(
            "SELECT count(*) FROM \"{table}\" WHERE response IS NOT NULL \
               AND expires_at > result_until"
        );
        assert_eq!(count(&pool, &in_index).await, 1);
        tokio::time::sleep(PAST_SHORT).await;

        // One record deleted, one response dropped; then nothing left to do.
        assert_eq!(store.prune_expired(1000).await.unwrap(), 2);
        assert_eq!(store.prune_expired(1000).await.unwrap(), 0);
        assert_eq!(rows_of(&pool, &store, &gone).await, 0);
        assert_eq!(count(&pool, &in_index).await, 0);
        let (stripped, bytes): (bool, i32) = sqlx::query_as(&format!(
            "SELECT response IS NULL, pg_column_size(r.*) FROM \"{table}\" AS r WHERE key = $1"
        ))
        .bind(kept.as_bytes().as_slice())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!((stripped, bytes), (true, 113));
        let since =
            std::time::UNIX_EPOCH + Duration::from_micros(u64::try_from(result_us).unwrap());
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
    })
    .await;
}

/// A table at schema version 2 (before uncertain claims and tombstones), holding what a
/// version-2 store wrote, is upgraded: a connect that only checks says it is at version 2, a
/// migrating one brings it to version 3; its rows read as before (no `result_until`: a
/// completed record's retention ends with its `expires_at`), a running claim still locks its
/// key, an ended record is pruned, and the store then keeps tombstones and uncertain claims on
/// the upgraded table.
#[tokio::test]
async fn a_v2_schema_is_upgraded_and_its_records_read_as_before() {
    let Some(url) = server() else { return };
    let pool = pool(&url).await;
    let table = unique_name("idem_v2");
    let script = quiet().table(&table).schema_sql().unwrap();
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    exec(&mut *tx, idem_test_support::script_up_to(&script, 2)).await;
    tx.commit().await.unwrap();
    let (completed, running, ended) = (key(1), key(2), key(3));
    for (k, state, expires, response) in [
        (
            &completed,
            1i16,
            "interval '1 hour'",
            Some(&b"v2 receipt"[..]),
        ),
        (&running, 0, "interval '1 hour'", None),
        (&ended, 1, "interval '-1 second'", Some(&b"old"[..])),
    ] {
        sqlx::query(&format!(
            "INSERT INTO \"{table}\" (key, token, state, expires_at, response) \
             VALUES ($1, $2, $3, clock_timestamp() + {expires}, $4)"
        ))
        .bind(k.as_bytes().as_slice())
        .bind(&[0u8; 16][..])
        .bind(state)
        .bind(response)
        .execute(&pool)
        .await
        .unwrap();
    }
    let expires_us: i64 = sqlx::query_scalar(&format!(
        "SELECT (extract(epoch from expires_at) * 1000000)::bigint FROM \"{table}\" WHERE key = $1"
    ))
    .bind(completed.as_bytes().as_slice())
    .fetch_one(&pool)
    .await
    .unwrap();

    let err = quiet()
        .table(&table)
        .migrate_on_connect(false)
        .from_pool(pool.clone())
        .await
        .unwrap_err();
    assert!(not_migrated(&err, Some(2), 6), "{err:?}");
    let store = quiet().table(&table).from_pool(pool.clone()).await.unwrap();
    idem_test_support::upgraded_and_working(&store, &completed, &key(8)).await;
    match store
        .claim(ClaimRequest::new(&completed, LEASE))
        .await
        .unwrap()
    {
        ClaimOutcome::Completed(r) => {
            assert_eq!(r.response.as_deref(), Some(&b"v2 receipt"[..]));
            let us = u64::try_from(expires_us).unwrap();
            assert_eq!(
                r.expires_at,
                std::time::UNIX_EPOCH + Duration::from_micros(us)
            );
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
    assert_eq!(store.prune_expired(1000).await.unwrap(), 1);
    assert_eq!(rows_of(&pool, &store, &ended).await, 0);

    // The new columns work on the upgraded table.
    let c = claim(&store, 4).await;
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
            .claim(ClaimRequest::new(&uncertain, LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Uncertain { .. }
    ));
    drop_store_tables(&store).await;
}

/// A table at schema version 5 takes version 6 out of band by the recipe docs/postgres.md gives
/// for large tables (the pruner's index built `CONCURRENTLY` under another name, then swapped
/// in and the version recorded, in one transaction): a migrating connect then changes nothing
/// (the index is the one `migrate` makes, the partial index gone), and the pruner strips the
/// version-5 tombstone's response and deletes the ended record (its response kept past its
/// retention: stripped, then deleted, in one pass) through it, leaving the live one.
#[tokio::test]
async fn a_v5_table_takes_version_6_by_the_documented_recipe() {
    let Some(url) = server() else { return };
    let pool = pool(&url).await;
    let table = unique_name("idem_v5");
    let script = quiet().table(&table).schema_sql().unwrap();
    exec(&pool, idem_test_support::script_up_to(&script, 5)).await;
    let (tombstone, ended, live) = (key(1), key(2), key(3));
    for (k, result_until, expires_at) in [
        (&tombstone, "- interval '1 second'", "+ interval '1 hour'"),
        (&ended, "- interval '2 seconds'", "- interval '1 second'"),
        (&live, "+ interval '1 hour'", "+ interval '2 hours'"),
    ] {
        sqlx::query(&format!(
            "INSERT INTO \"{table}\" (key, token, state, expires_at, response, result_until) \
             VALUES ($1, $2, 1, clock_timestamp() {expires_at}, $3, \
               clock_timestamp() {result_until})"
        ))
        .bind(k.as_bytes().as_slice())
        .bind(&[0u8; 16][..])
        .bind(&b"v5 receipt"[..])
        .execute(&pool)
        .await
        .unwrap();
    }

    let docs = include_str!("../../docs/postgres.md");
    let section = docs
        .split("**Upgrading a large table to version 6.**")
        .nth(1)
        .unwrap();
    let recipe = section.split("```sql\n").nth(1).unwrap();
    let recipe = recipe
        .split("```")
        .next()
        .unwrap()
        .replace("idem_records", &table);
    let (concurrently, swap) = recipe.split_once("BEGIN;").unwrap();
    exec(&pool, concurrently).await;
    exec(&pool, &format!("BEGIN;{swap}")).await;

    let store = quiet().table(&table).from_pool(pool.clone()).await.unwrap();
    let indexes = |t: String| {
        let pool = pool.clone();
        async move {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "SELECT indexname::text, indexdef FROM pg_indexes WHERE tablename = $1 \
                 ORDER BY indexname",
            )
            .bind(&t)
            .fetch_all(&pool)
            .await
            .unwrap();
            rows.into_iter()
                .map(|(name, def)| (name.replace(&t, "T"), def.replace(&t, "T")))
                .collect::<Vec<_>>()
        }
    };
    let fresh = quiet()
        .table(unique_name("idem_v6"))
        .from_pool(pool.clone())
        .await
        .unwrap();
    let upgraded = indexes(table.clone()).await;
    assert_eq!(upgraded, indexes(fresh.table().to_owned()).await);
    assert!(
        upgraded
            .iter()
            .all(|(name, _)| name != "T_result_until_idx"),
        "{upgraded:?}"
    );
    let versions = count(
        &pool,
        &format!("SELECT count(*) FROM \"{table}_migrations\""),
    )
    .await;
    assert_eq!(versions, 6);

    // The ended record's response is stripped, then the record deleted, in one pass.
    assert_eq!(store.prune_expired(1000).await.unwrap(), 3);
    assert_eq!(rows_of(&pool, &store, &ended).await, 0);
    let kept = format!("SELECT count(*) FROM \"{table}\" WHERE key = $1 AND response IS NOT NULL");
    for (k, response_kept) in [(&tombstone, 0), (&live, 1)] {
        let n: i64 = sqlx::query_scalar(&kept)
            .bind(k.as_bytes().as_slice())
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, response_kept);
    }
    assert_eq!(store.prune_expired(1000).await.unwrap(), 0);
    drop_store_tables(&store).await;
    drop_store_tables(&fresh).await;
}
