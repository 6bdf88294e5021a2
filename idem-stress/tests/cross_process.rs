//! Several OS processes (`idem-stress-worker`) sharing one PostgreSQL database: a duplicate
//! storm, a `kill -9` mid-work, a stalled worker whose lease was taken over, and nodes whose
//! clocks are ten minutes off.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use idem_core::{RecordState, Store};
use idem_sql::PostgresStore;
use idem_stress::worker::Worker;
use idem_stress::{create_exec_table, key, key_name};
use idem_test_support::postgres::{drop_tables, faketime_lib, pg_url};
use idem_test_support::unique_name;
use sqlx::PgPool;

const WORKER: &str = env!("CARGO_BIN_EXE_idem-stress-worker");
/// Generous bounds for a loaded 2-core machine; the tests never assert speed.
const STARTUP: Duration = Duration::from_secs(60);
const RUN: Duration = Duration::from_secs(300);

/// The lease of a worker that holds keys and renews them as live work does: 3 s times
/// `IDEM_TEST_TIME_SCALE`. It renews every quarter lease; with the suite's six tests at a time
/// per binary and four worker processes per test on two cores, an unscaled 3 s lease once saw a
/// renewal come later than 2.25 s and the holder lose keys it still held.
fn hold_lease() -> Duration {
    idem_core::conformance::scaled(Duration::from_secs(3))
}

struct Scratch {
    url: String,
    table: String,
    exec: String,
    pool: PgPool,
}

impl Scratch {
    async fn new(url: String) -> Scratch {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .expect("connect to the test server");
        let (table, exec) = (unique_name("idem_xp"), unique_name("idem_exec"));
        create_exec_table(&pool, &exec).await.unwrap();
        Scratch {
            url,
            table,
            exec,
            pool,
        }
    }

    /// The arguments every worker mode takes.
    fn args(&self, mode: &str, name: &str, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            mode,
            "--url",
            &self.url,
            "--table",
            &self.table,
            "--exec-table",
            &self.exec,
            "--name",
            name,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    fn spawn(&self, mode: &str, name: &str, extra: &[&str]) -> Worker {
        Worker::spawn(name, WORKER, &self.args(mode, name, extra), &[])
    }

    /// Executions per key: (worker, token, server time it started in µs, completed).
    async fn executions(&self) -> BTreeMap<String, Vec<(String, String, i64, bool)>> {
        let rows: Vec<(String, String, String, i64, bool)> = sqlx::query_as(&format!(
            "SELECT key, worker, token, (extract(epoch from started_at) * 1000000)::bigint, \
             completed FROM \"{}\" ORDER BY id",
            self.exec
        ))
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let mut by_key: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for (k, worker, token, started, completed) in rows {
            by_key
                .entry(k)
                .or_default()
                .push((worker, token, started, completed));
        }
        by_key
    }

    /// The lease end (server µs) of each record still carrying one of `worker`'s tokens.
    async fn lease_ends_of(&self, worker: &str) -> HashMap<String, i64> {
        sqlx::query_as(&format!(
            "SELECT e.key, (extract(epoch from r.expires_at) * 1000000)::bigint \
             FROM \"{}\" r JOIN \"{}\" e ON r.token = decode(e.token, 'hex') \
             WHERE e.worker = $1 AND r.state = 0",
            self.table, self.exec
        ))
        .bind(worker)
        .fetch_all(&self.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
    }

    async fn store(&self) -> PostgresStore {
        PostgresStore::builder()
            // No background pruner: the test reads the records as the workers left them.
            .pruner(None)
            .table(&self.table)
            .from_pool(self.pool.clone())
            .await
            .unwrap()
    }

    async fn cleanup(self) {
        let migrations = format!("{}_migrations", self.table);
        drop_tables(&self.pool, &[&self.table, &migrations, &self.exec]).await;
    }
}

/// `resp <key> <response>` lines of all workers, grouped by key.
fn responses(lines: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lines {
        if let Some(rest) = line.strip_prefix("resp ") {
            let (k, response) = rest.split_once(' ').expect("resp <key> <response>");
            by_key
                .entry(k.to_owned())
                .or_default()
                .push(response.to_owned());
        }
    }
    by_key
}

/// The stored response of every key, which must be completed: as the engine wrote it (in its
/// checksummed envelope) when `engine`, else as the worker wrote it through the raw store API.
async fn stored_responses(
    store: &PostgresStore,
    keys: usize,
    engine: bool,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for i in 0..keys {
        let record = store.get(&key(i)).await.unwrap();
        let Some(RecordState::Completed(cached)) = record.map(|r| r.state) else {
            panic!("{} is not completed in the store", key_name(i));
        };
        let bytes = match engine {
            true => cached.result().unwrap().to_vec(),
            false => cached.response.unwrap(),
        };
        let response = String::from_utf8(bytes).unwrap();
        out.insert(key_name(i), response);
    }
    out
}

/// 4 processes × 64 tasks call the same 100 keys at once: each key's work runs exactly once and
/// every caller of a key gets the same response, the one that execution produced.
async fn duplicate_storm(test: &str, engine: bool) {
    let Some(url) = pg_url(test) else {
        return;
    };
    const PROCESSES: usize = 4;
    const TASKS: usize = 64;
    const KEYS: usize = 100;
    let s = Scratch::new(url).await;
    // A lease far longer than any call: the storm is about concurrent claims, not expiry.
    let mut extra: Vec<&str> = "--keys 100 --tasks 64 --lease-ms 60000 --work-ms 5"
        .split(' ')
        .collect();
    if engine {
        extra.push("--engine");
    }
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|n| s.spawn("storm", &format!("w{n}"), &extra))
        .collect();
    for w in &mut workers {
        w.wait_for("ready", STARTUP).await;
    }
    // Release them together so the processes collide on every key.
    for w in &mut workers {
        w.send("go").await;
    }
    let mut lines = Vec::new();
    for w in workers {
        lines.extend(w.finish(RUN).await);
    }

    let executions = s.executions().await;
    let total: usize = executions.values().map(Vec::len).sum();
    assert_eq!(
        total, KEYS,
        "the business function ran exactly once per key"
    );
    assert_eq!(executions.len(), KEYS);

    let by_key = responses(&lines);
    assert_eq!(by_key.len(), KEYS);
    let stored = stored_responses(&s.store().await, KEYS, engine).await;
    for (k, got) in &by_key {
        assert_eq!(got.len(), PROCESSES * TASKS, "every caller of {k} answered");
        let first = &got[0];
        assert!(
            got.iter().all(|r| r == first),
            "callers of {k} got different responses"
        );
        let (worker, run, _, completed) = &executions[k][0];
        assert!(*completed);
        assert_eq!(
            first,
            &format!("{k}|{worker}|{run}"),
            "{k}: the response is the one execution's"
        );
        // The engine stores the response JSON-encoded; the store-level workers store it raw.
        let expected = if engine {
            serde_json::to_string(first).unwrap()
        } else {
            first.clone()
        };
        assert_eq!(stored[k], expected, "{k}: callers got the stored response");
    }
    let contended = lines.iter().filter(|l| l.starts_with("locked ")).count();
    eprintln!(
        "{test}: {} calls, {contended} times a task first found a key locked",
        PROCESSES * TASKS * KEYS
    );
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_storm_across_four_processes() {
    duplicate_storm("duplicate_storm_across_four_processes", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_storm_through_the_engine() {
    duplicate_storm("duplicate_storm_through_the_engine", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_work_frees_keys_after_one_lease() {
    let Some(url) = pg_url("kill_9_mid_work_frees_keys_after_one_lease") else {
        return;
    };
    const KEYS: usize = 100;
    const HELD: usize = 16;
    let s = Scratch::new(url).await;

    // The victim claims k0..k15 with a 3 s lease (scaled), renews it like live work, and never
    // finishes.
    let lease_ms = hold_lease().as_millis().to_string();
    let mut victim = s.spawn("hold", "victim", &["--keys", "16", "--lease-ms", &lease_ms]);
    for _ in 0..HELD {
        victim.wait_for("holding ", STARTUP).await;
    }
    // Three survivors call every key through the engine, with leases far longer than their
    // calls.
    let extra: Vec<&str> = "--keys 100 --tasks 32 --lease-ms 60000 --work-ms 2 --engine"
        .split(' ')
        .collect();
    let mut survivors: Vec<Worker> = (0..3)
        .map(|n| s.spawn("storm", &format!("s{n}"), &extra))
        .collect();
    for w in &mut survivors {
        w.wait_for("ready", STARTUP).await;
    }
    for w in &mut survivors {
        w.send("go").await;
    }
    // Kill once a survivor is actually waiting on a key the victim holds.
    let is_held = |line: &str| {
        line.strip_prefix("locked k")
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n < HELD)
    };
    survivors[0]
        .wait_until("locked <held key>", is_held, RUN)
        .await;
    victim.kill9().await;
    // The victim renewed until it died; its records' lease ends are final now.
    let lease_ends = s.lease_ends_of("victim").await;
    assert_eq!(
        lease_ends.len(),
        HELD,
        "no live lease was taken while the victim lived"
    );

    let mut lines = Vec::new();
    for w in survivors {
        lines.extend(w.finish(RUN).await);
    }
    let executions = s.executions().await;
    assert_eq!(executions.len(), KEYS);
    for (k, runs) in &executions {
        let completed: Vec<_> = runs.iter().filter(|r| r.3).collect();
        assert_eq!(completed.len(), 1, "{k} completed exactly once: {runs:?}");
        assert_ne!(completed[0].0, "victim");
        match lease_ends.get(k) {
            Some(&lease_end) => {
                assert_eq!(runs.len(), 2, "{k}: the victim's run and one takeover");
                assert_eq!(runs[0].0, "victim");
                assert!(
                    runs[1].2 >= lease_end,
                    "{k} was taken over before the victim's lease ended"
                );
            }
            None => assert_eq!(runs.len(), 1, "{k} ran once"),
        }
    }
    let by_key = responses(&lines);
    let stored = stored_responses(&s.store().await, KEYS, true).await;
    assert_eq!(by_key.len(), KEYS);
    for (k, got) in &by_key {
        assert_eq!(got.len(), 3 * 32, "every survivor caller of {k} answered");
        let done = executions[k].iter().find(|r| r.3).unwrap();
        let response = format!("{k}|{}|{}", done.0, done.1);
        assert!(
            got.iter().all(|r| r == &response),
            "{k}: every caller got the completed execution's response"
        );
        // The engine stores the response JSON-encoded.
        assert_eq!(
            stored[k],
            serde_json::to_string(&response).unwrap(),
            "{k}: stored"
        );
    }
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_worker_cannot_complete_abort_or_renew() {
    let Some(url) = pg_url("stale_worker_cannot_complete_abort_or_renew") else {
        return;
    };
    let s = Scratch::new(url).await;
    // The stale worker claims k0 for 1 s and then stalls (waits on stdin) past its lease.
    let mut stale = s.spawn(
        "claim",
        "stale",
        &[
            "--key",
            "0",
            "--lease-ms",
            "1000",
            "--value",
            "stale",
            "--then-wait",
        ],
    );
    stale.wait_for("waiting", STARTUP).await;
    let stale_lease_end = s.lease_ends_of("stale").await["k0"];

    // The new owner takes k0 over once that lease has ended (real server time), and stalls too
    // while still in progress.
    let mut owner = s.spawn(
        "claim",
        "owner",
        &[
            "--key",
            "0",
            "--lease-ms",
            "60000",
            "--value",
            "fresh",
            "--then-wait",
        ],
    );
    owner.wait_for("waiting", STARTUP).await;
    let runs = s.executions().await;
    let owner_run = &runs["k0"][1];
    assert_eq!(owner_run.0, "owner");
    assert!(
        owner_run.2 >= stale_lease_end,
        "the owner claimed before the stale lease ended"
    );

    // The stale worker wakes up while the new owner is mid-work: every call is refused.
    stale.send("go").await;
    let lines = stale.finish(RUN).await;
    for op in ["renew", "complete", "abort"] {
        assert!(
            lines.contains(&format!("{op} lease_lost")),
            "stale {op} must get LeaseLost: {lines:?}"
        );
    }
    let store = s.store().await;
    match store.get(&key(0)).await.unwrap().map(|r| r.state) {
        Some(RecordState::InProgress { lease_until, .. }) => {
            let left = lease_until
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            assert!(
                left > Duration::from_secs(30),
                "the owner's lease is intact"
            );
        }
        other => panic!("the owner's claim must be untouched, got {other:?}"),
    }

    // The owner finishes: its result stands (and a completed record cannot be aborted).
    owner.send("go").await;
    let lines = owner.finish(RUN).await;
    for expected in ["renew ok", "complete ok", "abort lease_lost"] {
        assert!(lines.iter().any(|l| l == expected), "owner: {lines:?}");
    }
    match store.get(&key(0)).await.unwrap().map(|r| r.state) {
        Some(RecordState::Completed(c)) => {
            assert_eq!(c.response.as_deref(), Some(&b"fresh"[..]))
        }
        other => panic!("the owner's result must stand, got {other:?}"),
    }
    s.cleanup().await;
}

/// The skew a worker reported on its `clock` line, in seconds (local minus server).
fn skew_secs(line: &str) -> f64 {
    let mut parts = line.split(' ').skip(1);
    let local: f64 = parts.next().unwrap().parse().unwrap();
    let server: f64 = parts.next().unwrap().parse().unwrap();
    (local - server) / 1e6
}

/// One node holds a live lease while a node whose clock differs by twenty minutes asks for the
/// same key: it must wait exactly one lease of server time, neither stealing the live lease nor
/// waiting out the clock difference.
async fn skewed_pair(
    s: &Scratch,
    lib: &str,
    key_index: usize,
    holder_skew: &str,
    asker_skew: &str,
) {
    let skewed = |offset: &str| {
        vec![
            ("LD_PRELOAD".to_owned(), lib.to_owned()),
            ("FAKETIME".to_owned(), offset.to_owned()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        ]
    };
    let k = key_index.to_string();
    let lease_ms = hold_lease().as_millis().to_string();
    let holder_name = format!("holder{key_index}");
    let mut holder = Worker::spawn(
        &holder_name,
        WORKER,
        &s.args(
            "hold",
            &holder_name,
            &["--keys", "1", "--from", &k, "--lease-ms", &lease_ms],
        ),
        &skewed(holder_skew),
    );
    let clock = holder.wait_for("clock ", STARTUP).await;
    let expected: f64 = if holder_skew.starts_with('-') {
        -600.0
    } else {
        600.0
    };
    assert!(
        (skew_secs(&clock) - expected).abs() < 60.0,
        "the holder's clock is {holder_skew} off: {clock}"
    );
    holder.wait_for("holding ", STARTUP).await;

    let asker_name = format!("asker{key_index}");
    let mut asker = Worker::spawn(
        &asker_name,
        WORKER,
        &s.args(
            "claim",
            &asker_name,
            &["--key", &k, "--lease-ms", "60000", "--value", "asker"],
        ),
        &skewed(asker_skew),
    );
    let clock = asker.wait_for("clock ", STARTUP).await;
    let expected = -expected;
    assert!(
        (skew_secs(&clock) - expected).abs() < 60.0,
        "the asker's clock is {asker_skew} off: {clock}"
    );
    // While the holder lives and renews, the asker keeps finding the key locked, each time for
    // at most one lease of server time.
    for _ in 0..5 {
        let line = asker.wait_for("locked ", STARTUP).await;
        let retry_after_us: u128 = line["locked ".len()..].parse().unwrap();
        assert!(
            retry_after_us <= hold_lease().as_micros(),
            "retry_after of {retry_after_us} µs exceeds the holder's lease of {lease_ms} ms"
        );
    }
    assert!(
        !asker.seen().iter().any(|l| l == "started"),
        "the live lease was stolen"
    );
    holder.kill9().await;
    let lease_end = s.lease_ends_of(&holder_name).await[&key_name(key_index)];
    asker.wait_for("started", RUN).await;
    let lines = asker.finish(RUN).await;
    assert!(lines.iter().any(|l| l == "complete ok"), "{lines:?}");
    let runs = &s.executions().await[&key_name(key_index)];
    assert_eq!(runs.len(), 2);
    assert!(
        runs[1].2 >= lease_end,
        "the asker took the key before the holder's lease ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_clocks_agree_on_leases() {
    let test = "skewed_clocks_agree_on_leases";
    let Some(url) = pg_url(test) else {
        return;
    };
    let Some(lib) = faketime_lib(test) else {
        return;
    };
    let lib = lib.to_str().expect("utf-8 path").to_owned();
    let s = Scratch::new(url).await;
    // A node 10 minutes behind holds; a node 10 minutes ahead asks. A store trusting the asker's
    // clock would see the lease as long expired and steal it.
    skewed_pair(&s, &lib, 0, "-10m", "+10m").await;
    // The other way round: trusting the asker's clock would make it wait twenty minutes.
    skewed_pair(&s, &lib, 1, "+10m", "-10m").await;
    s.cleanup().await;
}
