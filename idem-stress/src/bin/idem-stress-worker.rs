//! One application node for the cross-process tests: runs idem's PostgreSQL store and prints
//! what it sees, one line per event, for the test to compare.
//!
//! ```text
//! idem-stress-worker storm --url U --table T --exec-table E --name N --keys 100 --tasks 64
//!                          [--lease-ms 2000] [--work-ms 0] [--deadline-ms 120000] [--engine]
//!     prints `ready`, waits for a line on stdin, then every task calls every key (in its own
//!     shuffled order) until it has that key's response, through the `Store` trait or, with
//!     --engine, through the `Idempotency` engine:
//!       locked <key>               first time a task found the key locked
//!       resp <key> <response>      the response this caller got (fresh or replayed)
//!       error <key> <message>      a store error (the process then exits with status 1)
//!     and `done` at the end.
//! idem-stress-worker hold --url U --table T --exec-table E --name N --keys 16 [--from 0]
//!                         [--lease-ms 2000] [--deadline-ms 120000]
//!     claims keys k<from>..k<from+keys-1>, records an execution for each, prints `holding <key>`, then
//!     keeps renewing the leases as live work does, until killed (or the deadline: status 3).
//! idem-stress-worker claim --url U --table T --exec-table E --name N --key K [--lease-ms 2000]
//!                          [--value V] [--then-wait] [--deadline-ms 120000]
//!     tries to claim K:
//!       locked <retry_after µs>    each time the key is locked (it then waits and retries)
//!       replayed <response>        the key was completed already (the process exits)
//!       started                    it owns the key; an execution is recorded
//!     without --then-wait it completes with V and prints `complete <result>`; with --then-wait
//!     it prints `waiting`, waits for a line on stdin (a stalled node), then tries
//!     `renew <result>`, `complete <result>`, `abort <result>`; result is `ok`, `lease_lost` or
//!     `error:<message>`.
//!
//! idem-stress-worker storm-kv --url U --namespace NS --name N --keys 100 --tasks 64
//!                             [--lease-ms 2000] [--deadline-ms 300000]
//!     the storm against any store, opened by URL (`idem_stress::stores::open`: postgres://,
//!     dynamodb://…); the business function's side effect is a line, not a row:
//!       exec <key> <token>         this process ran the work of <key> (one line per execution)
//!       resp <key> <response>     the response a caller got (fresh or replayed)
//!       lost <key>, locked <key>, error <key> <message> as in `storm`, and `done` at the end.
//! idem-stress-worker charge --url U --table T --provider P --from A --to B [--tasks 16]
//!                           [--lease-ms 2000]
//!     charges orders A..B-1 through the payment provider at P (`idem_stress::charges`), each
//!     once, claimed with `OnLapse::Uncertain`, `--tasks` at a time, and prints
//!       charged <i> <charge id>    order i's charge (fresh or replayed)
//!       failed <i> <message>       order i's call failed (uncertain, a provider error, …)
//!     and `done` at the end.
//! ```
//!
//! Every mode but `storm-kv` and `charge` first prints `clock <local unix µs> <server unix µs>` (how skewed this node is).
//! Business executions go to the exec table (see `idem_stress::create_exec_table`): one row per
//! execution, marked `completed` once `complete` succeeded.

use std::collections::HashMap;
use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::{
    Claim, ClaimOutcome, ClaimRequest, Completion, Error, Fingerprint, Idempotency, OnLocked,
    Outcome, Store, StoreError, StoreErrorKind,
};
use idem_sql::PostgresStore;
use idem_stress::stores;
use idem_stress::{key, key_name};
use tokio::io::{AsyncBufReadExt, BufReader};

const RETENTION: Duration = Duration::from_secs(3600);

struct Opts {
    mode: String,
    flags: HashMap<String, String>,
}

impl Opts {
    fn parse() -> Result<Opts, String> {
        let mut args = std::env::args().skip(1);
        let mode = args
            .next()
            .ok_or("missing mode: storm, storm-kv, hold or claim")?;
        let mut flags = HashMap::new();
        while let Some(flag) = args.next() {
            let name = flag
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {flag}"))?
                .to_owned();
            if name == "then-wait" || name == "engine" {
                flags.insert(name, String::new());
            } else {
                let value = args
                    .next()
                    .ok_or_else(|| format!("--{name} needs a value"))?;
                flags.insert(name, value);
            }
        }
        Ok(Opts { mode, flags })
    }

    fn str(&self, name: &str) -> Result<&str, String> {
        self.flags
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("--{name} is required"))
    }

    fn num(&self, name: &str, default: u64) -> Result<u64, String> {
        match self.flags.get(name) {
            Some(v) => v.parse().map_err(|e| format!("--{name} {v}: {e}")),
            None => Ok(default),
        }
    }

    fn ms(&self, name: &str, default: u64) -> Result<Duration, String> {
        self.num(name, default).map(Duration::from_millis)
    }
}

/// What every mode shares: the store, the exec table, who we are.
struct Node {
    store: PostgresStore,
    exec_table: String,
    name: String,
    lease: Duration,
    deadline: tokio::time::Instant,
}

impl Node {
    async fn connect(opts: &Opts, pool_size: u32) -> Result<Node, String> {
        let exec_table = opts.str("exec-table")?.to_owned();
        if !exec_table
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(format!("bad exec table name {exec_table}"));
        }
        let store = PostgresStore::builder()
            // No background pruner: the tests read the records as the workers left them.
            .pruner(None)
            .table(opts.str("table")?)
            .max_connections(pool_size)
            .acquire_timeout(Duration::from_secs(30))
            .connect(opts.str("url")?)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        print_clocks(&store).await?;
        Ok(Node {
            store,
            exec_table,
            name: opts.str("name")?.to_owned(),
            lease: opts.ms("lease-ms", 2000)?,
            deadline: tokio::time::Instant::now() + opts.ms("deadline-ms", 120_000)?,
        })
    }

    /// The business function's side effect: one row per execution.
    /// `run` identifies the execution: the claim's token, or a run id when the engine drives.
    async fn record_execution(&self, key: &str, run: &str) -> Result<(), String> {
        sqlx::query(&format!(
            "INSERT INTO \"{}\" (key, worker, token) VALUES ($1, $2, $3)",
            self.exec_table
        ))
        .bind(key)
        .bind(&self.name)
        .bind(run)
        .execute(self.store.pool())
        .await
        .map(drop)
        .map_err(|e| format!("record execution of {key}: {e}"))
    }

    async fn mark_completed(&self, run: &str) -> Result<(), String> {
        sqlx::query(&format!(
            "UPDATE \"{}\" SET completed = true WHERE token = $1",
            self.exec_table
        ))
        .bind(run)
        .execute(self.store.pool())
        .await
        .map(drop)
        .map_err(|e| format!("mark completion: {e}"))
    }

    fn past_deadline(&self) -> bool {
        tokio::time::Instant::now() >= self.deadline
    }
}

/// Prints `clock <local unix µs> <server unix µs>`, so a test sees how skewed this node is.
async fn print_clocks(store: &PostgresStore) -> Result<(), String> {
    let server_us: i64 =
        sqlx::query_scalar("SELECT (extract(epoch from clock_timestamp()) * 1000000)::bigint")
            .fetch_one(store.pool())
            .await
            .map_err(|e| format!("read server clock: {e}"))?;
    let local_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| format!("local clock before 1970: {e}"))?
        .as_micros();
    println!("clock {local_us} {server_us}");
    Ok(())
}

fn token_hex(claim: &Claim) -> String {
    claim
        .token()
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn fingerprint(key: &str) -> Fingerprint {
    Fingerprint::of_bytes(key.as_bytes())
}

fn outcome(r: Result<(), Error>) -> String {
    match r {
        Ok(()) => "ok".to_owned(),
        Err(Error::LeaseLost) => "lease_lost".to_owned(),
        Err(e) => format!("error:{e}"),
    }
}

/// How long to wait before asking a locked key again: the lease's rest, kept between 5 ms and
/// 100 ms so a freed key is noticed soon without hammering the server.
fn backoff(retry_after: Duration) -> Duration {
    retry_after.clamp(Duration::from_millis(5), Duration::from_millis(100))
        + Duration::from_millis(fastrand::u64(0..5))
}

async fn wait_for_stdin_line() -> Result<(), String> {
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
        .map_err(|e| format!("read stdin: {e}"))?;
    Ok(())
}

/// Calls `key` until this caller has its response; returns it.
async fn call(node: &Node, i: usize, work: Duration) -> Result<String, String> {
    let run = |name: String, token: String| async move {
        node.record_execution(&name, &token).await?;
        if !work.is_zero() {
            tokio::time::sleep(work).await;
        }
        Ok(format!("{name}|{}|{token}", node.name))
    };
    let landed = |token: String| async move { node.mark_completed(&token).await };
    claim_or_wait(&node.store, node.lease, node.deadline, i, run, landed).await
}

/// One caller of `key(i)` on `store`: claims the key, or waits until it has the key's response,
/// and returns that. Having claimed it, it runs `run` with the key's name and the claim's token
/// (`run` gives the response), completes the claim, and calls `landed` with the token once the
/// completion is stored; a claim lost meanwhile is said (`lost <key>`) and the key asked again.
async fn claim_or_wait<Run, Landed>(
    store: &dyn Store,
    lease: Duration,
    deadline: tokio::time::Instant,
    i: usize,
    run: impl Fn(String, String) -> Run,
    landed: impl Fn(String) -> Landed,
) -> Result<String, String>
where
    Run: Future<Output = Result<String, String>>,
    Landed: Future<Output = Result<(), String>>,
{
    let name = key_name(i);
    let (k, fp) = (key(i), fingerprint(&name));
    let mut said_locked = false;
    loop {
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("deadline passed while {name} stayed locked"));
        }
        match store
            .claim(ClaimRequest::new(&k, lease).fingerprint(Some(&fp)))
            .await
        {
            Ok(ClaimOutcome::Claimed(claim)) => {
                let token = token_hex(&claim);
                let response = run(name.clone(), token.clone()).await?;
                let done = Completion {
                    response: Some(response.as_bytes()),
                    is_error: false,
                    retention: RETENTION,
                    key_retention: Duration::ZERO,
                };
                match store.complete(&claim, done).await {
                    Ok(()) => {
                        landed(token).await?;
                        return Ok(response);
                    }
                    // Our lease ran out and another node took the key: ask again for its result.
                    Err(Error::LeaseLost) => println!("lost {name}"),
                    Err(e) => return Err(format!("complete {name}: {e}")),
                }
            }
            Ok(other) => {
                if let Some(answer) = not_claimed(other, &name, &mut said_locked).await {
                    return answer;
                }
            }
            Err(e) => return Err(format!("start {name}: {e}")),
        }
    }
}

/// Like [`call`], through the engine: it claims, runs the work (which records its execution),
/// completes or replays. Runs are told apart by a run id, as the engine keeps the claim's token
/// to itself.
async fn call_engine(
    node: &Node,
    engine: &Idempotency,
    runs: &AtomicU64,
    i: usize,
    work: Duration,
) -> Result<String, String> {
    let name = key_name(i);
    let mut said_locked = false;
    loop {
        if node.past_deadline() {
            return Err(format!("deadline passed while {name} stayed locked"));
        }
        let run = format!("{}-{}", node.name, runs.fetch_add(1, Ordering::SeqCst));
        let business = async {
            node.record_execution(&name, &run)
                .await
                .map_err(|e| Error::Store(StoreError::new(StoreErrorKind::Query, e)))?;
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            Ok::<_, Error>(format!("{name}|{}|{run}", node.name))
        };
        match engine
            .call(key(i))
            .fingerprint(fingerprint(&name))
            .lease(node.lease)
            .retention(RETENTION)
            .on_locked(OnLocked::FailFast)
            .run(business)
            .await
        {
            Ok(Outcome::Fresh(response)) => {
                node.mark_completed(&run).await?;
                return Ok(response);
            }
            Ok(Outcome::Replayed(response)) => return Ok(response),
            Err(Error::Locked { retry_after }) => {
                if !said_locked {
                    println!("locked {name}");
                    said_locked = true;
                }
                tokio::time::sleep(backoff(retry_after)).await;
            }
            Err(Error::LeaseLost) => println!("lost {name}"),
            Err(e) => return Err(format!("{name}: {e}")),
        }
    }
}

async fn storm(opts: &Opts) -> Result<(), String> {
    let keys = opts.num("keys", 100)? as usize;
    let tasks = opts.num("tasks", 64)?;
    let work = opts.ms("work-ms", 0)?;
    let node = Arc::new(Node::connect(opts, tasks.min(16) as u32).await?);
    let engine = opts
        .flags
        .contains_key("engine")
        .then(|| Arc::new(Idempotency::new(node.store.clone())));
    let runs = Arc::new(AtomicU64::new(0));
    println!("ready");
    wait_for_stdin_line().await?;
    storm_tasks(tasks, keys, move |i| {
        let (node, engine, runs) = (node.clone(), engine.clone(), runs.clone());
        async move {
            match &engine {
                Some(engine) => call_engine(&node, engine, &runs, i, work).await,
                None => call(&node, i, work).await,
            }
        }
    })
    .await
}

/// `tasks` tasks, each calling every one of `keys` keys in its own shuffled order through
/// `call`, printing `resp <key> <response>` or `error <key> <message>` (which stops that task
/// and fails the run), then `done`.
async fn storm_tasks<F, Fut>(tasks: u64, keys: usize, call: F) -> Result<(), String>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<String, String>> + Send,
{
    let failed = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (call, failed) = (call.clone(), failed.clone());
        handles.push(tokio::spawn(async move {
            let mut order: Vec<usize> = (0..keys).collect();
            fastrand::shuffle(&mut order);
            for i in order {
                match call(i).await {
                    Ok(response) => println!("resp {} {response}", key_name(i)),
                    Err(e) => {
                        println!("error {} {e}", key_name(i));
                        failed.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            }
        }));
    }
    for h in handles {
        h.await.map_err(|e| format!("task panicked: {e}"))?;
    }
    if failed.load(Ordering::SeqCst) {
        return Err("some calls failed".to_owned());
    }
    println!("done");
    Ok(())
}

/// One caller of `key(i)` against any store: claims or waits until it has the key's response.
/// The work is printing `exec <key> <token>`.
async fn call_kv(
    store: &dyn Store,
    node: &str,
    lease: Duration,
    deadline: tokio::time::Instant,
    i: usize,
) -> Result<String, String> {
    let run = |name: String, token: String| async move {
        println!("exec {name} {token}");
        Ok(format!("{name}|{node}|{token}"))
    };
    claim_or_wait(store, lease, deadline, i, run, |_| async { Ok(()) }).await
}

async fn storm_kv(opts: &Opts) -> Result<(), String> {
    let keys = opts.num("keys", 100)? as usize;
    let tasks = opts.num("tasks", 64)?;
    let lease = opts.ms("lease-ms", 2000)?;
    let node: Arc<str> = opts.str("name")?.into();
    let store = stores::open(opts.str("url")?, opts.str("namespace")?).await;
    println!("ready");
    wait_for_stdin_line().await?;
    let deadline = tokio::time::Instant::now() + opts.ms("deadline-ms", 300_000)?;
    storm_tasks(tasks, keys, move |i| {
        let (store, node) = (store.clone(), node.clone());
        async move { call_kv(&*store, &node, lease, deadline, i).await }
    })
    .await
}

async fn hold(opts: &Opts) -> Result<ExitCode, String> {
    let keys = opts.num("keys", 16)? as usize;
    let from = opts.num("from", 0)? as usize;
    let node = Arc::new(Node::connect(opts, keys.clamp(1, 16) as u32).await?);
    let mut handles = Vec::new();
    for i in from..from + keys {
        let node = node.clone();
        handles.push(tokio::spawn(async move {
            let name = key_name(i);
            let claim = match node
                .store
                .claim(
                    ClaimRequest::new(&key(i), node.lease).fingerprint(Some(&fingerprint(&name))),
                )
                .await
            {
                Ok(ClaimOutcome::Claimed(claim)) => claim,
                other => return Err(format!("could not claim {name}: {other:?}")),
            };
            node.record_execution(&name, &token_hex(&claim)).await?;
            println!("holding {name}");
            // Live work that never ends: keep the lease alive like the engine's heartbeat.
            loop {
                tokio::time::sleep(node.lease / 4).await;
                if let Err(e) = node.store.renew(&claim, node.lease).await {
                    return Err(format!("renew {name}: {e}"));
                }
            }
        }));
    }
    tokio::select! {
        _ = tokio::time::sleep_until(node.deadline) => {
            println!("never killed");
            Ok(ExitCode::from(3))
        }
        r = async {
            if let Some(h) = handles.into_iter().next() {
                h.await.map_err(|e| format!("task panicked: {e}"))??;
            }
            Ok::<(), String>(())
        } => r.map(|()| ExitCode::SUCCESS),
    }
}

async fn claim(opts: &Opts) -> Result<(), String> {
    let node = Node::connect(opts, 2).await?;
    let i: usize = opts.num("key", 0)? as usize;
    let name = key_name(i);
    let value = opts.str("value").unwrap_or("value").to_owned();

    let claim = loop {
        if node.past_deadline() {
            return Err(format!("deadline passed while {name} stayed locked"));
        }
        match node
            .store
            .claim(ClaimRequest::new(&key(i), node.lease).fingerprint(Some(&fingerprint(&name))))
            .await
        {
            Ok(ClaimOutcome::Claimed(claim)) => break claim,
            Ok(ClaimOutcome::Completed(cached)) => {
                let r = String::from_utf8_lossy(&cached.response.unwrap_or_default()).into_owned();
                println!("replayed {r}");
                return Ok(());
            }
            Ok(ClaimOutcome::Locked { retry_after }) => {
                println!("locked {}", retry_after.as_micros());
                tokio::time::sleep(backoff(retry_after)).await;
            }
            Ok(other @ (ClaimOutcome::Uncertain { .. } | ClaimOutcome::Expired { .. })) => {
                return Err(format!(
                    "start {name}: no claim here lapses uncertain, got {other:?}"
                ))
            }
            Err(e) => return Err(format!("start {name}: {e}")),
        }
    };
    node.record_execution(&name, &token_hex(&claim)).await?;
    println!("started");
    let done = Completion {
        response: Some(value.as_bytes()),
        is_error: false,
        retention: RETENTION,
        key_retention: Duration::ZERO,
    };
    if opts.flags.contains_key("then-wait") {
        println!("waiting");
        wait_for_stdin_line().await?;
        println!(
            "renew {}",
            outcome(node.store.renew(&claim, node.lease).await)
        );
        println!(
            "complete {}",
            outcome(node.store.complete(&claim, done).await)
        );
        println!("abort {}", outcome(node.store.abort(&claim).await));
    } else {
        let r = node.store.complete(&claim, done).await;
        if r.is_ok() {
            node.mark_completed(&token_hex(&claim)).await?;
        }
        println!("complete {}", outcome(r));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Opts::parse() {
        Err(e) => Err(e),
        Ok(opts) => match opts.mode.as_str() {
            "storm" => storm(&opts).await.map(|()| ExitCode::SUCCESS),
            "storm-kv" => storm_kv(&opts).await.map(|()| ExitCode::SUCCESS),
            "hold" => hold(&opts).await,
            "claim" => claim(&opts).await.map(|()| ExitCode::SUCCESS),
            "charge" => charge(&opts).await.map(|()| ExitCode::SUCCESS),
            other => Err(format!(
                "unknown mode {other}: storm, storm-kv, hold, claim or charge"
            )),
        },
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idem-stress-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `charge`: orders `--from`..`--to` through the provider, `--tasks` at a time.
async fn charge(opts: &Opts) -> Result<(), String> {
    let store = PostgresStore::builder()
        .pruner(None)
        .table(opts.str("table")?)
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(30))
        .connect(opts.str("url")?)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let engine = Idempotency::new(store);
    let provider = idem_stress::charges::Client::new(opts.str("provider")?);
    let (from, to) = (opts.num("from", 0)?, opts.num("to", 0)?);
    let lease = opts.ms("lease-ms", 2000)?;
    let tasks = opts.num("tasks", 16)?.max(1);
    let next = Arc::new(AtomicU64::new(from));
    println!("ready");
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (engine, provider, next) = (engine.clone(), provider.clone(), next.clone());
        workers.spawn(async move {
            // Bounded: each pass takes the next order, until `to`.
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= to {
                    return;
                }
                let i = usize::try_from(i).unwrap_or(usize::MAX);
                match idem_stress::charges::charge(&engine, &provider, i, lease).await {
                    Ok(id) => println!("charged {i} {}", id.into_inner()),
                    Err(e) => println!("failed {i} {e}"),
                }
            }
        });
    }
    while workers.join_next().await.is_some() {}
    println!("done");
    Ok(())
}

/// A start that did not claim the key: the stored response of a completed one, or, for a live
/// claim, a pause before the caller asks again (`None`; "locked" is printed once per key).
async fn not_claimed(
    start: ClaimOutcome,
    name: &str,
    said_locked: &mut bool,
) -> Option<Result<String, String>> {
    match start {
        ClaimOutcome::Completed(cached) => {
            let bytes = cached.response.unwrap_or_default();
            Some(String::from_utf8(bytes).map_err(|e| format!("response of {name}: {e}")))
        }
        ClaimOutcome::Locked { retry_after } => {
            if !*said_locked {
                println!("locked {name}");
                *said_locked = true;
            }
            tokio::time::sleep(backoff(retry_after)).await;
            None
        }
        ClaimOutcome::Claimed(_) => Some(Err(format!("start {name}: claimed where it should not"))),
        other @ (ClaimOutcome::Uncertain { .. } | ClaimOutcome::Expired { .. }) => Some(Err(
            format!("start {name}: got {other:?} where nothing lapses uncertain"),
        )),
    }
}
