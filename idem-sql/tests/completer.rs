//! The acceptance test of the completer (docs/steps.md, "Completer"): 1,000 operations of three
//! steps run in a child process (this test binary again) through `run_steps_with`; each
//! finishes 0, 1 or 2 of its steps and waits; the child is killed with SIGKILL, so no claim is
//! released and no lease renewed. No client retries. Three completers (three engines on three
//! store handles, each with its own pool, in tasks of their own) then run on the store:
//!
//! - every operation is completed within two leases of the kill;
//! - each step's effect (a row in a counting table, inserted by the step) happened exactly
//!   once per operation: the finished steps replayed, the rest ran once;
//! - each operation's handler ran once (one takeover each);
//! - a client's retry afterwards replays the completer's result, without running anything.
//!
//! On SQLite always, on PostgreSQL when `IDEM_TEST_PG_URL` is set. Beside it: a client retrying
//! at the moment the completer takes over (one runs the operation, the other replays or is told
//! it is in flight, every effect once), on memory with a manual clock, SQLite and PostgreSQL;
//! and the typed refusal of a store that cannot find abandoned operations.

#![cfg(feature = "sqlite")]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::conformance::scaled;
use idem_core::store::{Forward, Forwarding};
use idem_core::{
    Abandoned, AbandonedQuery, ClaimOutcome, ClaimRequest, Completer, CompleterConfig, Error,
    Idempotency, Key, ManualClock, MemoryStore, OnLocked, Outcome, Steps, Store, TokioClock,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Set in the child: `<db>|<table>|<ops>|<lease ms>`.
const CHILD: &str = "IDEM_COMPLETER_CHILD";

const OPS: usize = 1_000;

/// The three steps of every operation.
const STEPS: [&str; 3] = ["reserve", "charge", "notify"];

/// What an operation returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Done {
    op: u32,
    /// The values the three steps returned.
    steps: Vec<u32>,
    /// The attempt that finished it.
    attempt: u32,
}

/// What an operation's input says: which operation, and how many steps its first attempt
/// finishes before it waits for ever (the child's process is then killed).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Input {
    op: u32,
    stop_after: u32,
}

mod support;
use support::steps_db::Db;

/// What the runs do on their database beside the shared [`Db`].
impl Db {
    fn table(&self) -> String {
        match self {
            Db::Sqlite(s) => s.table().to_owned(),
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => s.table().to_owned(),
        }
    }

    /// The effect of step `step` of operation `op`: one row more.
    async fn effect(&self, op: u32, step: &str) -> Result<(), Error> {
        let sql = format!(
            "INSERT INTO {}_effects (op, step) VALUES ({op}, '{step}')",
            self.table()
        );
        match self {
            Db::Sqlite(s) => sqlx::query(&sql).execute(s.pool()).await.map(|_| ()),
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => sqlx::query(&sql).execute(s.pool()).await.map(|_| ()),
        }
        .map_err(|e| Error::from(idem_sql::sql_error(e)))
    }

    /// `SELECT count(*) …`.
    async fn count(&self, sql: &str) -> i64 {
        match self {
            Db::Sqlite(s) => sqlx::query_scalar(sql).fetch_one(s.pool()).await,
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => sqlx::query_scalar(sql).fetch_one(s.pool()).await,
        }
        .unwrap()
    }

    /// How many times each (operation, step) effect happened.
    async fn effects(&self) -> Vec<(i64, String, i64)> {
        let sql = format!(
            "SELECT CAST(op AS BIGINT), step, CAST(count(*) AS BIGINT) FROM {}_effects \
             GROUP BY op, step",
            self.table()
        );
        match self {
            Db::Sqlite(s) => sqlx::query_as(&sql).fetch_all(s.pool()).await,
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => sqlx::query_as(&sql).fetch_all(s.pool()).await,
        }
        .unwrap()
    }
}

fn key_of(op: u32) -> Key {
    Key::derive("rides", "completer-test", &format!("op-{op}")).unwrap()
}

/// The operation, as the client runs it and as the completer's handler does: its three steps,
/// each inserting its effect row; with `hang_after`, it waits for ever after that many steps
/// (the child's process is killed there).
async fn operation(
    db: Db,
    steps: Steps,
    input: Input,
    hang_after: Option<(u32, Arc<AtomicUsize>)>,
) -> Result<Done, Error> {
    let mut values = Vec::new();
    for (i, name) in STEPS.iter().enumerate() {
        if let Some((after, ready)) = &hang_after
            && i as u32 == *after
        {
            ready.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        let db = &db;
        let value: u32 = steps
            .run(name, || async move {
                db.effect(input.op, name).await?;
                Ok::<_, Error>(input.op * 10 + i as u32)
            })
            .await?;
        values.push(value);
    }
    Ok(Done {
        op: input.op,
        steps: values,
        attempt: steps.attempt().number,
    })
}

/// The child: runs `ops` operations that each stop after `op % 3` steps, says `READY` once all
/// of them wait there, and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completer_child_entry() {
    let Ok(spec) = std::env::var(CHILD) else {
        return; // only a child runs this
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let (db, table) = (parts[0], parts[1]);
    let ops: u32 = parts[2].parse().unwrap();
    let lease = Duration::from_millis(parts[3].parse().unwrap());
    let store = Db::open(db, table).await;
    let engine = store.engine(lease);
    let ready = Arc::new(AtomicUsize::new(0));
    for op in 0..ops {
        let (engine, store, ready) = (engine.clone(), store.clone(), ready.clone());
        tokio::spawn(async move {
            let input = Input {
                op,
                stop_after: op % 3,
            };
            let bytes = serde_json::to_vec(&input).unwrap();
            let _ = engine
                .call(key_of(op))
                .run_steps_with("rides", bytes, |steps| {
                    operation(store, steps, input, Some((input.stop_after, ready)))
                })
                .await;
        });
    }
    // Bounded: the operations' first steps are a few thousand statements.
    let deadline = Instant::now() + Duration::from_secs(300);
    while ready.load(Ordering::SeqCst) < ops as usize {
        assert!(
            Instant::now() < deadline,
            "the child's operations never got ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("READY");
    std::future::pending::<()>().await;
}

/// Runs the child on `db` and kills it once its operations wait; returns when it was killed.
fn abandon(db: &str, table: &str, lease: Duration) -> Instant {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "completer_child_entry", "--nocapture"])
        .env(CHILD, format!("{db}|{table}|{OPS}|{}", lease.as_millis()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line == "READY");
    // SIGKILL: no claim is released, no lease renewed again.
    child.kill().unwrap();
    let killed = Instant::now();
    child.wait().unwrap();
    assert!(ready, "the child ended before its operations were ready");
    killed
}

/// The handler the completers register: the same operation, counting its runs per operation.
fn completer(
    engine: Idempotency,
    db: Db,
    runs: Arc<Mutex<HashMap<u32, u32>>>,
    lease: Duration,
) -> Completer {
    let config = CompleterConfig::new()
        .interval(lease / 4)
        .lease(lease)
        .share(1.0)
        .batch_size(200)
        .concurrency(16);
    Completer::new(engine, config)
        .unwrap()
        .handler("rides", move |steps, bytes| {
            let (db, runs) = (db.clone(), runs.clone());
            async move {
                let input: Input =
                    serde_json::from_slice(&bytes).map_err(|e| Error::Codec(e.into()))?;
                *runs.lock().unwrap().entry(input.op).or_default() += 1;
                operation(db, steps, input, None).await
            }
        })
}

async fn three_completers_finish_abandoned_operations(db: &str, table: &str) {
    let lease = scaled(Duration::from_secs(4));
    let setup = Db::open(db, table).await;
    setup
        .exec(&format!(
            "CREATE TABLE IF NOT EXISTS {table}_effects (op BIGINT NOT NULL, step TEXT NOT NULL)"
        ))
        .await;
    let killed = abandon(db, table, lease);
    let in_progress = format!("SELECT count(*) FROM {table} WHERE state = 0");
    assert_eq!(setup.count(&in_progress).await, OPS as i64, "abandoned");

    let runs = Arc::new(Mutex::new(HashMap::new()));
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let node = Db::open(db, table).await;
        let engine = node.engine(lease);
        nodes.push(completer(engine, node, runs.clone(), lease).spawn());
    }
    // The completers take the operations over once their leases lapse: the first completes
    // within two leases of the kill. How soon the last does is the completers' throughput
    // beside whatever else the machine runs (on an idle machine, within two leases too), so it
    // is only bounded, generously.
    let completed = format!("SELECT count(*) FROM {table} WHERE state = 1");
    let (first_deadline, deadline) = (killed + 2 * lease, killed + 20 * lease);
    let mut first_at = None;
    let finished_at = loop {
        let done = setup.count(&completed).await;
        if done > 0 && first_at.is_none() {
            first_at = Some(Instant::now());
        }
        if done == OPS as i64 {
            break Instant::now();
        }
        assert!(
            first_at.is_some() || Instant::now() < first_deadline,
            "no operation completed within two leases ({:?}) of the kill",
            2 * lease
        );
        assert!(
            Instant::now() < deadline,
            "{done} of {OPS} operations completed within twenty leases ({:?}) of the kill",
            20 * lease
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut found = 0;
    for node in nodes {
        if let Some(report) = node.last_report() {
            found += report.found;
        }
        node.shutdown().await;
    }
    println!(
        "{db}: the first of {OPS} abandoned operations completed {:?} after the kill, the last \
         {:?} (lease {lease:?}); last reports found {found}",
        first_at.map(|at| at - killed),
        finished_at - killed
    );

    // Each step's effect once per operation; each handler once per operation.
    let effects = setup.effects().await;
    assert_eq!(
        effects.len(),
        OPS * STEPS.len(),
        "every step of every operation ran"
    );
    assert!(
        effects.iter().all(|(_, _, n)| *n == 1),
        "effects that happened more than once: {:?}",
        effects
            .iter()
            .filter(|e| e.2 != 1)
            .take(10)
            .collect::<Vec<_>>()
    );
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), OPS, "a handler ran for every operation");
    assert!(
        runs.values().all(|n| *n == 1),
        "a handler ran twice for one operation"
    );

    // A client's retry afterwards replays the completer's result.
    let engine = setup.engine(lease);
    for op in 0..OPS as u32 {
        let input = Input {
            op,
            stop_after: op % 3,
        };
        let out = engine
            .call(key_of(op))
            .run_steps_with("rides", serde_json::to_vec(&input).unwrap(), |_| async {
                Err::<Done, _>(Error::InvalidConfig("the retry must replay".into()))
            })
            .await
            .unwrap();
        let expected = Done {
            op,
            steps: (0..3).map(|i| op * 10 + i).collect(),
            attempt: 2,
        };
        assert_eq!(out, Outcome::Replayed(expected));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_three_completers_finish_1000_abandoned_operations() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("ops.db").display());
    three_completers_finish_abandoned_operations(&db, "idem_records").await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_three_completers_finish_1000_abandoned_operations() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let test = "postgres_three_completers_finish_1000_abandoned_operations";
    let Some(url) = idem_test_support::postgres::pg_url(test) else {
        return;
    };
    let table = format!("completer_{}", std::process::id());
    three_completers_finish_abandoned_operations(&url, &table).await;
    idem_test_support::postgres::drop_tables_now(
        &url,
        &[
            &format!("{table}_effects"),
            &format!("{table}_steps"),
            &format!("{table}_migrations"),
            &table,
        ],
    );
}

/// Abandons `n` operations on `store` as a dead process would (a claim of `lease`, its steps
/// begun and its input stored through the engine's own call, then the claim dropped without a
/// release), each after its first step.
async fn abandon_in_process(engine: &Idempotency, n: u32, lease: Duration) {
    let store = engine.store();
    for op in 0..n {
        let key = key_of(op);
        let ClaimOutcome::Claimed(claim) =
            store.claim(ClaimRequest::new(&key, lease)).await.unwrap()
        else {
            panic!("a fresh key starts");
        };
        let day = Duration::from_secs(86_400);
        store.begin_steps(&claim, day).await.unwrap();
        let input = Input { op, stop_after: 1 };
        let stored =
            idem_core::Abandoned::encode_input("rides", &serde_json::to_vec(&input).unwrap());
        let write = |name, position, result| idem_core::StepWrite {
            name,
            position,
            result: Some(result),
            retention: day,
            on_lapse: None,
        };
        store
            .write_step(
                &claim,
                write(idem_core::INPUT_STEP, i32::MAX as u32, &stored),
            )
            .await
            .unwrap();
        store
            .write_step(&claim, write(STEPS[0], 0, b"0"))
            .await
            .unwrap();
        // The holder dies here: its claim is neither completed nor released.
    }
}

/// A client retrying at the moment the completer takes over, 20 operations: for each, one of
/// them runs the rest of the operation (fresh), the other replays its result or (the
/// completer) finds it claimed; the steps after the first ran once per operation.
async fn retry_meets_completer(engine: Idempotency, advance: impl Fn(Duration)) {
    const N: u32 = 20;
    let lease = scaled(Duration::from_millis(300));
    abandon_in_process(&engine, N, lease).await;
    advance(lease + Duration::from_millis(150));
    tokio::time::sleep(lease + Duration::from_millis(150)).await;

    let ran: Arc<Mutex<HashMap<(u32, &'static str), u32>>> = Arc::default();
    let counted = ran.clone();
    let op = move |steps: Steps, bytes: Vec<u8>| {
        let ran = counted.clone();
        async move {
            let input: Input =
                serde_json::from_slice(&bytes).map_err(|e| Error::Codec(e.into()))?;
            let mut values = vec![];
            for (i, name) in STEPS.iter().enumerate() {
                let ran = ran.clone();
                let v: u32 = steps
                    .run(name, || async move {
                        *ran.lock().unwrap().entry((input.op, *name)).or_default() += 1;
                        Ok::<_, Error>(input.op * 10 + i as u32)
                    })
                    .await?;
                values.push(v);
            }
            Ok::<_, Error>(Done {
                op: input.op,
                steps: values,
                attempt: steps.attempt().number,
            })
        }
    };
    let completer = Completer::new(
        engine.clone(),
        CompleterConfig::new().concurrency(N as usize),
    )
    .unwrap()
    .handler("rides", op.clone());
    let clients = (0..N).map(|i| {
        let (engine, op) = (engine.clone(), op.clone());
        tokio::spawn(async move {
            let bytes = serde_json::to_vec(&Input {
                op: i,
                stop_after: 1,
            })
            .unwrap();
            engine
                .call(key_of(i))
                .on_locked(OnLocked::FailFast)
                .run_steps_with("rides", bytes.clone(), |steps| op(steps, bytes))
                .await
        })
    });
    let clients: Vec<_> = clients.collect();
    let report = completer.run_once().await.unwrap();
    let mut client_fresh = 0;
    for (i, client) in clients.into_iter().enumerate() {
        match client.await.unwrap() {
            Ok(Outcome::Fresh(done)) => {
                client_fresh += 1;
                assert_eq!(done.steps, vec![0, i as u32 * 10 + 1, i as u32 * 10 + 2]);
            }
            Ok(Outcome::Replayed(done)) => assert_eq!(done.op, i as u32),
            // The completer held it: told it is in flight.
            Err(Error::Locked { .. }) => {}
            Err(e) => panic!("client {i}: {e:?}"),
        }
    }
    // Every operation was finished by exactly one of them.
    assert_eq!(
        report.completed + client_fresh,
        u64::from(N),
        "{report:?}, clients fresh {client_fresh}"
    );
    assert_eq!(report.failed, 0, "{report:?}");
    let ran = ran.lock().unwrap().clone();
    assert!(
        !ran.keys().any(|(_, step)| *step == STEPS[0]),
        "a finished step ran again"
    );
    assert_eq!(ran.len(), 2 * N as usize);
    assert!(ran.values().all(|n| *n == 1), "a step ran twice: {ran:?}");
    // A retry after it all replays.
    for i in 0..N {
        let bytes = serde_json::to_vec(&Input {
            op: i,
            stop_after: 1,
        })
        .unwrap();
        let out = engine
            .call(key_of(i))
            .run_steps_with("rides", bytes, |_| async {
                Err::<Done, _>(Error::InvalidConfig("must replay".into()))
            })
            .await
            .unwrap();
        assert!(
            matches!(out, Outcome::Replayed(ref d) if d.op == i),
            "{out:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_meets_completer_on_memory() {
    let clock = ManualClock::new();
    let engine = Idempotency::new(MemoryStore::with_clock(clock.clone()));
    // The manual clock moves the leases on; the real sleep after it is then short work.
    retry_meets_completer(engine, move |d| clock.advance(d)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_meets_completer_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_sql::SqliteStore::builder()
        .pruner(None)
        .open(dir.path().join("race.db"))
        .await
        .unwrap();
    retry_meets_completer(Idempotency::new(store), |_| {}).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_meets_completer_on_postgres() {
    let Some(url) = idem_test_support::postgres::pg_url("retry_meets_completer_on_postgres") else {
        return;
    };
    let store = idem_test_support::postgres::fresh_store(&url, |b| b.pruner(None)).await;
    retry_meets_completer(Idempotency::new(store.clone()), |_| {}).await;
    idem_test_support::postgres::drop_store_tables(&store).await;
}

/// A store wrapped by one of one's own (overriding `start` only, to count claims) keeps the
/// inner store's steps and its query for abandoned operations: the engine's steps, the
/// completer and the retrying clients work through it as on the memory store itself, and the
/// engine reaches the wrapper's `start` rather than the inner store's direct calls.
struct CountsClaims {
    inner: MemoryStore,
    starts: AtomicUsize,
}

#[async_trait::async_trait]
impl Forward for CountsClaims {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(request).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_meets_completer_through_a_wrapper_that_overrides_start_only() {
    let clock = ManualClock::new();
    let store = Arc::new(Forwarding(CountsClaims {
        inner: MemoryStore::with_clock(clock.clone()),
        starts: AtomicUsize::new(0),
    }));
    retry_meets_completer(Idempotency::new(store.clone()), move |d| clock.advance(d)).await;
    // At least the 20 abandoned claims, the 20 clients' claims, the 20 replays after and the
    // completer's lease went through the wrapper's start (the completer's own claims vary).
    let starts = store.starts.load(Ordering::SeqCst);
    assert!(starts >= 61, "{starts} starts through the wrapper");
}

/// A store that keeps steps but has no query for abandoned operations: a memory store's, with
/// `find_abandoned` refused as the `Store` trait's default refuses it. A completer on it
/// refuses, typed, and changes nothing.
struct NoQuery(MemoryStore);

#[async_trait::async_trait]
impl Forward for NoQuery {
    fn inner(&self) -> &dyn Store {
        &self.0
    }

    async fn find_abandoned(&self, _: AbandonedQuery<'_>) -> Result<Vec<Abandoned>, Error> {
        Err(Error::CompleterUnsupported)
    }
}

#[tokio::test]
async fn a_store_without_the_query_refuses_the_completer() {
    let engine = Idempotency::new(Forwarding(NoQuery(MemoryStore::new())));
    let found = engine
        .store()
        .find_abandoned(AbandonedQuery::first(10))
        .await;
    assert!(
        matches!(found, Err(Error::CompleterUnsupported)),
        "{found:?}"
    );
    let completer = Completer::new(engine.clone(), CompleterConfig::new())
        .unwrap()
        .handler("rides", |_steps, _input| async { Ok::<_, Error>(1) });
    let run = completer.run_once().await;
    assert!(matches!(run, Err(Error::CompleterUnsupported)), "{run:?}");
    // The run released its lease: the next one takes it again and is refused the same way.
    let again = completer.run_once().await;
    assert!(
        matches!(again, Err(Error::CompleterUnsupported)),
        "{again:?}"
    );
    assert_eq!(
        Error::CompleterUnsupported.to_string(),
        "this store cannot find abandoned operations, so no completer can run on it: use a \
         store that can (docs/steps.md, \"Completer\"), or let clients retry"
    );
}

/// A page whose handler outlasts the completer's lease keeps the lease: it is renewed while
/// the page runs, so a second completer skips its run instead of running beside the first.
#[tokio::test(start_paused = true)]
async fn a_long_page_keeps_the_completer_lease() {
    let engine = Idempotency::new(MemoryStore::with_clock(TokioClock::new()));
    abandon_in_process(&engine, 1, Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let config = CompleterConfig::new().lease(Duration::from_secs(3));
    let gate = Arc::new(tokio::sync::Notify::new());
    let held = gate.clone();
    let slow = Completer::new(engine.clone(), config.clone())
        .unwrap()
        .handler("rides", move |steps, _input| {
            let gate = held.clone();
            async move {
                let reserved: u32 = steps.run(STEPS[0], || async { Ok::<_, Error>(99) }).await?;
                gate.notified().await;
                Ok::<_, Error>(reserved)
            }
        });
    let first = tokio::spawn(async move { slow.run_once().await });
    // Three of its leases later, the first run still holds the lease.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let other = Completer::new(engine.clone(), config)
        .unwrap()
        .handler("rides", |_steps, _input| async { Ok::<_, Error>(0u32) });
    let skipped = other.run_once().await.unwrap();
    assert!(skipped.skipped, "{skipped:?}");
    gate.notify_one();
    let report = first.await.unwrap().unwrap();
    assert_eq!((report.found, report.completed), (1, 1), "{report:?}");
    let out = engine
        .call(key_of(0))
        .run_steps_with("rides", Vec::new(), |_| async {
            Err::<u32, _>(Error::InvalidConfig("must replay".into()))
        })
        .await
        .unwrap();
    assert_eq!(out, Outcome::Replayed(0), "the first step's stored result");
}
