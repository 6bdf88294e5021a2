//! idem-bench: idem's stores against the raw sqlx statements a user would write instead, on the
//! same database and pool, in one run. See docs/performance.md; run it with `scripts/bench`.
//!
//! ```text
//! idem-bench [--quick] [--out FILE] [--pg-url URL] [--stores memory,sqlite,postgres,dynamodb,peers,grpc]
//!            [--dynamodb-url URL] [--redis-url URL] [--redis-cluster-urls URL,URL,…]
//!            [--no-scale | --scale-only] [--scale-rows N] [--prune-batch N] [--prune-pause-ms N]
//!            [--prune-share F]
//!            [--sustain [--sustain-rate N] [--sustain-secs N]]
//!            [--callgrind [--save-baseline]]
//! idem-bench --count PATH --iters N     (one in-process path, for callgrind: see counts.rs)
//! idem-bench --versus-diom DIOM_BINARY [--idem-server PATH] [--quick] [--out FILE] [--pg-url URL]
//!            [--stores sqlite,postgres]   (idem-server beside Diom: see versus.rs)
//! ```
//!
//! The PostgreSQL URL defaults to `IDEM_TEST_PG_URL`, the DynamoDB endpoint to
//! `IDEM_TEST_DYNAMODB_URL`, the Redis ones to `IDEM_TEST_REDIS_URL` and
//! `IDEM_TEST_REDIS_CLUSTER_URLS`; DynamoDB, Redis and Redis Cluster (`redis-cluster`) are among
//! the default stores when their servers are known. `peers` (a default) compares idem's HTTP layer
//! and engine with `axum-idempotent` and the `idempotent` crate (see `peers.rs`); `grpc` (a default)
//! idem's gRPC layer with the same tonic service without it (see `grpc.rs`).
#![forbid(unsafe_code)]

mod consumer;
mod counts;
mod cpu;
mod dynamo;
mod encryption;
mod grpc;
mod harness;
mod memory;
mod outbox;
mod peers;
mod raw;
mod redis_rows;
mod report;
mod scale;
mod steps;
mod sustain;
mod versus;
mod workload;

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::store::url::{Scheme, StoreUrl};
use idem::{Idempotency, MemoryStore, PostgresStore, SqliteStore, SqliteSync};

use crate::cpu::Cpu;
use crate::harness::{interleaved, Op, Timing};
use crate::raw::Raw;
use crate::report::{Results, Row, Scale, Workload};
use crate::workload::Subject;

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("a benchmark task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("DynamoDB: {0}")]
    Dynamo(String),
    #[error("Redis: {0}")]
    Redis(String),
    #[error("the benchmark measured the wrong thing: {0}")]
    Unexpected(String),
    /// A server the benchmark runs (`--versus-diom`) that would not start or stopped.
    #[error("{0}")]
    Server(String),
    #[error("{0}\nusage: idem-bench [--quick] [--out FILE] [--pg-url URL] [--stores memory,sqlite,postgres,dynamodb,redis,redis-cluster,peers,grpc] [--dynamodb-url dynamodb://HOST:PORT] [--redis-url redis://HOST:PORT] [--redis-cluster-url redis-cluster://HOST:PORT,…] [--no-scale | --scale-only] [--scale-rows N] [--prune-batch N] [--prune-pause-ms N] [--prune-share F] [--sustain [--sustain-rate N] [--sustain-secs N]] [--consumer] [--encryption] [--outbox] [--callgrind [--save-baseline]] [--versus-diom DIOM_BINARY [--idem-server PATH]]")]
    Usage(String),
}

pub(crate) const CONCURRENCY: [usize; 3] = [1, 8, 32];
const STORM_CONCURRENCY: [usize; 2] = [8, 32];
/// PostgreSQL pool size: enough that 32 tasks never wait for a connection.
const PG_POOL: u32 = 32;

struct Args {
    quick: bool,
    out: Option<String>,
    pg_url: Option<String>,
    dynamodb_url: Option<String>,
    redis_url: Option<String>,
    redis_cluster_urls: Option<Vec<String>>,
    stores: Vec<String>,
    scale: bool,
    main: bool,
    scale_rows: Option<u64>,
    /// Overrides of the library pruner's batch size and pause.
    prune_batch: Option<u32>,
    prune_pause: Option<Duration>,
    /// An override of the pruner's share of the store's time (paced by cost).
    prune_share: Option<f64>,
    /// `--consumer`: only the consumer rows (the batch API against hand-written conditional
    /// writes) on SQLite and, given its URL, PostgreSQL.
    consumer: bool,
    /// `--encryption`: only the cost of sealing on a replay (memory store, 1 KB and 1 MiB).
    encryption: bool,
    /// `--outbox`: only the dispatcher against a hand-written poller (SQLite, PostgreSQL).
    outbox: bool,
    /// `--callgrind`: only the instruction counts (counts.rs); with `--save-baseline`, written
    /// as the checked-in baseline too.
    callgrind: bool,
    save_baseline: bool,
    /// `--sustain`: only the sustained runs, at this rate for this long.
    sustain: bool,
    sustain_rate: u32,
    sustain_secs: u64,
    /// `--versus-diom PATH`: only idem-server beside the Diom binary at PATH (versus.rs), with
    /// `--idem-server PATH` as the idem-server binary (default: the one beside idem-bench).
    versus_diom: Option<std::path::PathBuf>,
    idem_server: Option<std::path::PathBuf>,
    /// The arguments that shape the run (not `--pg-url` and `--out`), for the report.
    shown: Vec<String>,
}

impl Args {
    fn parse() -> Result<Args, BenchError> {
        let mut args = Args {
            quick: false,
            out: None,
            // The test servers' settings, in the forms scripts/test exports them (an endpoint,
            // a list of node URLs) where they are not store URLs.
            pg_url: env_url("IDEM_TEST_PG_URL", Scheme::Postgres)?,
            dynamodb_url: std::env::var("IDEM_TEST_DYNAMODB_URL").ok(),
            redis_url: env_url("IDEM_TEST_REDIS_URL", Scheme::Redis)?,
            redis_cluster_urls: std::env::var("IDEM_TEST_REDIS_CLUSTER_URLS")
                .ok()
                .map(|v| v.split(',').map(str::to_owned).collect()),
            stores: vec![
                "memory".into(),
                "sqlite".into(),
                "postgres".into(),
                "peers".into(),
                "grpc".into(),
            ],
            scale: true,
            main: true,
            scale_rows: None,
            prune_batch: None,
            prune_pause: None,
            prune_share: None,
            consumer: false,
            encryption: false,
            outbox: false,
            callgrind: false,
            save_baseline: false,
            sustain: false,
            sustain_rate: 3_000,
            sustain_secs: 300,
            versus_diom: None,
            idem_server: None,
            shown: Vec::new(),
        };
        let argv: Vec<String> = std::env::args().skip(1).collect();
        let mut skip = false;
        for a in &argv {
            if std::mem::take(&mut skip) {
                continue;
            }
            skip = matches!(
                a.as_str(),
                "--pg-url" | "--out" | "--dynamodb-url" | "--redis-url" | "--redis-cluster-url"
            );
            if !skip {
                args.shown.push(a.clone());
            }
        }
        let mut stores_given = false;
        let mut it = argv.into_iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .ok_or_else(|| BenchError::Usage(format!("{name} needs a value")))
            };
            match arg.as_str() {
                "--quick" => args.quick = true,
                "--no-scale" => args.scale = false,
                "--sustain" => args.sustain = true,
                "--consumer" => args.consumer = true,
                "--encryption" => args.encryption = true,
                "--outbox" => args.outbox = true,
                "--callgrind" => args.callgrind = true,
                "--save-baseline" => args.save_baseline = true,
                "--sustain-rate" => {
                    args.sustain_rate = number("--sustain-rate", value("--sustain-rate")?)?
                }
                "--sustain-secs" => {
                    args.sustain_secs = number("--sustain-secs", value("--sustain-secs")?)?
                }
                "--scale-only" => args.main = false,
                "--versus-diom" => args.versus_diom = Some(value("--versus-diom")?.into()),
                "--idem-server" => args.idem_server = Some(value("--idem-server")?.into()),
                "--out" => args.out = Some(value("--out")?),
                "--pg-url" | "--dynamodb-url" | "--redis-url" | "--redis-cluster-url" => {
                    match store_url(&arg, &value(&arg)?)? {
                        StoreUrl::Postgres(url) if arg == "--pg-url" => args.pg_url = Some(url),
                        StoreUrl::DynamoDb { endpoint } if arg == "--dynamodb-url" => {
                            args.dynamodb_url = Some(endpoint)
                        }
                        StoreUrl::Redis(url) if arg == "--redis-url" => args.redis_url = Some(url),
                        StoreUrl::RedisCluster(nodes) if arg == "--redis-cluster-url" => {
                            args.redis_cluster_urls = Some(nodes)
                        }
                        other => {
                            return Err(BenchError::Usage(format!(
                                "{arg} takes a URL of its own store, not a {} URL",
                                other.scheme().prefixes()[0]
                            )))
                        }
                    }
                }
                "--scale-rows" => {
                    args.scale_rows = Some(number("--scale-rows", value("--scale-rows")?)?)
                }
                "--prune-batch" => {
                    args.prune_batch = Some(number("--prune-batch", value("--prune-batch")?)?);
                }
                "--prune-pause-ms" => {
                    let ms = number("--prune-pause-ms", value("--prune-pause-ms")?)?;
                    args.prune_pause = Some(Duration::from_millis(ms));
                }
                "--prune-share" => {
                    args.prune_share = Some(number("--prune-share", value("--prune-share")?)?);
                }
                "--stores" => {
                    stores_given = true;
                    args.stores = value("--stores")?.split(',').map(str::to_owned).collect();
                    if let Some(bad) = args.stores.iter().find(|s| {
                        ![
                            "memory",
                            "sqlite",
                            "postgres",
                            "dynamodb",
                            "redis",
                            "redis-cluster",
                            "peers",
                            "grpc",
                        ]
                        .contains(&s.as_str())
                    }) {
                        return Err(BenchError::Usage(format!("unknown store {bad:?}")));
                    }
                }
                other => return Err(BenchError::Usage(format!("unknown argument {other:?}"))),
            }
        }
        if args.sustain_rate == 0 || args.sustain_secs == 0 {
            return Err(BenchError::Usage(
                "--sustain-rate and --sustain-secs must be at least 1".into(),
            ));
        }
        if args.prune_batch == Some(0) {
            return Err(BenchError::Usage("--prune-batch must be at least 1".into()));
        }
        if args.wants("postgres")
            && args.pg_url.is_none()
            && !args.encryption
            && !args.outbox
            && !args.callgrind
            && args.versus_diom.is_none()
        {
            return Err(BenchError::Usage(
                "no PostgreSQL URL: pass --pg-url, set IDEM_TEST_PG_URL, or run scripts/bench"
                    .into(),
            ));
        }
        // DynamoDB joins the default stores when an endpoint is known (scripts/bench starts one).
        if !stores_given && args.dynamodb_url.is_some() {
            args.stores.push("dynamodb".into());
        }
        if !stores_given && args.redis_url.is_some() {
            args.stores.push("redis".into());
        }
        if !stores_given && args.redis_cluster_urls.is_some() {
            args.stores.push("redis-cluster".into());
        }
        if args.wants("redis") && args.redis_url.is_none()
            || args.wants("redis-cluster") && args.redis_cluster_urls.is_none()
        {
            return Err(BenchError::Usage(
                "no Redis server: pass --redis-url / --redis-cluster-urls, set IDEM_TEST_REDIS_URL / IDEM_TEST_REDIS_CLUSTER_URLS, or run scripts/bench"
                    .into(),
            ));
        }
        if args.wants("dynamodb") && args.dynamodb_url.is_none() {
            return Err(BenchError::Usage(
                "no DynamoDB endpoint: pass --dynamodb-url, set IDEM_TEST_DYNAMODB_URL, or run scripts/bench"
                    .into(),
            ));
        }
        Ok(args)
    }

    fn scale_plan(&self, plan: &Plan, cpu: Cpu) -> scale::ScalePlan {
        scale::ScalePlan {
            rows: self.scale_rows.unwrap_or(plan.scale_rows),
            timing: plan.scale_timing,
            prune_cap: plan.prune_cap,
            prune_batch: self.prune_batch,
            prune_pause: self.prune_pause,
            prune_share: self.prune_share,
            cpu,
        }
    }

    fn wants(&self, store: &str) -> bool {
        self.stores.iter().any(|s| s == store)
    }
}

/// A store URL given to `flag`, through idem's one parser.
fn store_url(flag: &str, value: &str) -> Result<StoreUrl, BenchError> {
    StoreUrl::parse(value).map_err(|e| BenchError::Usage(format!("{flag}: {e}")))
}

/// The store URL in the environment variable `var`, which must be of `scheme` (PostgreSQL or
/// Redis: the URL as given is what their clients take).
fn env_url(var: &str, scheme: Scheme) -> Result<Option<String>, BenchError> {
    let Ok(value) = std::env::var(var) else {
        return Ok(None);
    };
    if store_url(var, &value)?.scheme() != scheme {
        return Err(BenchError::Usage(format!(
            "{var} is {value:?}, not a {} URL",
            scheme.form()
        )));
    }
    Ok(Some(value))
}

fn number<T: std::str::FromStr>(flag: &str, value: String) -> Result<T, BenchError> {
    value
        .parse()
        .map_err(|_| BenchError::Usage(format!("{flag} takes a number, not {value:?}")))
}

/// `--sustain`: the sustained runs on SQLite and PostgreSQL (as `--stores` asks), printed and
/// written to `--out`.
async fn sustained(args: &Args) -> Result<(), BenchError> {
    if std::env::var_os("IDEM_BENCH_LOG").is_some() {
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_writer(std::io::stderr)
                .finish(),
        );
    }
    let plan = sustain::SustainPlan {
        rate: args.sustain_rate,
        secs: args.sustain_secs,
        // The run without the pruner: a fifth as long, at least a minute (or the whole run).
        baseline_secs: (args.sustain_secs / 5).max(60).min(args.sustain_secs),
        retention: Duration::from_secs(5),
    };
    let mut runs = Vec::new();
    if args.wants("sqlite") {
        runs.extend(sustain::sqlite(plan).await?);
    }
    if let (true, Some(url)) = (args.wants("postgres"), &args.pg_url) {
        let pool = pg_pool(url).await?;
        runs.extend(sustain::postgres(&pool, plan).await?);
    }
    let table = sustain::markdown(plan, &runs);
    println!("{table}");
    if let Some(path) = &args.out {
        let command = format!("`scripts/bench {}`", args.shown.join(" "));
        std::fs::write(
            path,
            format!(
                "# idem-bench sustained run\n\n- machine: {}\n- command: {command}\n\n{table}",
                machine()
            ),
        )?;
        eprintln!("idem-bench: wrote {path}");
    }
    Ok(())
}

/// How long and how big, per mode.
struct Plan {
    timing: Timing,
    replay_keys: usize,
    scale_rows: u64,
    scale_timing: Timing,
    prune_cap: Duration,
    memory_calls: u64,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        let secs = Duration::from_secs_f64;
        if quick {
            Plan {
                timing: Timing {
                    warmup: secs(0.1),
                    slice: secs(0.1),
                    rounds: 4,
                },
                replay_keys: 1_000,
                scale_rows: 100_000,
                scale_timing: Timing {
                    warmup: secs(0.1),
                    slice: secs(0.25),
                    rounds: 2,
                },
                prune_cap: secs(10.0),
                memory_calls: 100_000,
            }
        } else {
            Plan {
                timing: Timing {
                    warmup: secs(0.5),
                    slice: secs(0.3),
                    rounds: 10,
                },
                replay_keys: 10_000,
                scale_rows: 1_000_000,
                scale_timing: Timing {
                    warmup: secs(0.3),
                    slice: secs(0.5),
                    rounds: 6,
                },
                prune_cap: secs(300.0),
                memory_calls: 1_000_000,
            }
        }
    }
}

fn main() -> ExitCode {
    // `--count PATH --iters N`: one path's calls, for callgrind to count (counts.rs); nothing
    // else starts, so two runs differ only in their calls.
    if let Some(count) = counts::from_args() {
        return match count.and_then(|(path, iters)| counts::run(path, iters)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("idem-bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("idem-bench: a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A SQLite store at `path` as every SQLite row sets it up (the main rows, the scale and
/// sustained runs, the consumer's and the instruction counts' steps): no background pruner
/// (its statements would be measured too) and no fsync per commit (`synchronous=NORMAL`; the
/// store's default is `FULL`): the figures are CPU and round trips, as PostgreSQL's, which runs
/// with fsync off.
pub(crate) async fn sqlite_store(path: &std::path::Path) -> Result<SqliteStore, BenchError> {
    Ok(SqliteStore::builder()
        .pruner(None)
        .synchronous(SqliteSync::Normal)
        .open(path)
        .await?)
}

/// The hand-written baseline on SQLite: a table of the store's schema at version 1
/// ([`raw::version_1`]) beside the store's own, on its pool.
pub(crate) async fn sqlite_raw(pool: sqlx::SqlitePool) -> Result<Raw, BenchError> {
    let script = SqliteStore::builder().table("raw_records").schema_sql()?;
    sqlx::raw_sql(raw::version_1(&script)?)
        .execute(&pool)
        .await?;
    Ok(Raw::Sqlite {
        pool,
        sql: raw::Statements::sqlite("raw_records"),
    })
}

/// The hand-written baseline's table on PostgreSQL: the store's schema at version 1
/// ([`raw::version_1`]) under `table`.
async fn postgres_raw_table(pool: &sqlx::PgPool, table: &str) -> Result<(), BenchError> {
    let script = PostgresStore::builder().table(table).schema_sql()?;
    sqlx::raw_sql(raw::version_1(&script)?)
        .execute(pool)
        .await?;
    Ok(())
}

/// `--consumer`: the batch API against hand-written conditional writes, on SQLite and (with a
/// URL) PostgreSQL and DynamoDB, each on a fresh table of its own; prints one line per store.
async fn consumer_rows(args: &Args) -> Result<(), BenchError> {
    let (messages, rounds) = if args.quick { (500, 3) } else { (2_000, 5) };
    let dir = tempfile::tempdir()?;
    let mut rows = Vec::new();
    if args.wants("sqlite") {
        let store = sqlite_store(&dir.path().join("consumer.db")).await?;
        let pool = store.pool().clone();
        let raw = sqlite_raw(pool).await?;
        let engine = Idempotency::new(store);
        rows.push(consumer::run("SQLite", engine, &raw, messages, rounds).await?);
    }
    if let (true, Some(url)) = (args.wants("postgres"), &args.pg_url) {
        let tag = format!("{}", fastrand::u32(..));
        let (idem_table, raw_table) = (format!("bench_cidem_{tag}"), format!("bench_craw_{tag}"));
        let pool = pg_pool(url).await?;
        let store = PostgresStore::builder()
            .pruner(None)
            .table(&idem_table)
            .from_pool(pool.clone())
            .await?;
        postgres_raw_table(&pool, &raw_table).await?;
        let raw = Raw::Postgres {
            pool: pool.clone(),
            sql: raw::Statements::postgres(&raw_table),
        };
        let row = consumer::run(
            "PostgreSQL",
            Idempotency::new(store),
            &raw,
            messages,
            rounds,
        )
        .await;
        for t in [&idem_table, &raw_table] {
            sqlx::query(&format!("DROP TABLE IF EXISTS \"{t}\""))
                .execute(&pool)
                .await?;
        }
        rows.push(row?);
    }
    if let (true, Some(url)) = (args.wants("dynamodb"), &args.dynamodb_url) {
        rows.push(dynamo::consumer_row(url, messages, rounds).await?);
    }
    for row in rows {
        println!(
            "{}: batch API {:.0} msg/s, hand-written conditional writes {:.0} msg/s, ratio {:.2}",
            row.store,
            row.idem_per_sec,
            row.raw_per_sec,
            row.ratio()
        );
    }
    let row = consumer::run_loop(messages, rounds).await?;
    println!(
        "run loop (in-process queue, 10 a receive, concurrency 16, handlers 2 ms and one in ten \
         40 ms, memory store): overlapping batches {:.0} msg/s, one batch at a time {:.0} msg/s, \
         ratio {:.2}",
        row.overlapping_per_sec,
        row.one_at_a_time_per_sec,
        row.ratio()
    );
    Ok(())
}

async fn bench() -> Result<(), BenchError> {
    let args = Args::parse()?;
    if args.sustain {
        return sustained(&args).await;
    }
    if args.consumer {
        return consumer_rows(&args).await;
    }
    if let Some(diom) = args.versus_diom.clone() {
        let report = versus::run(versus::Versus {
            diom,
            idem_server: args.idem_server.clone(),
            quick: args.quick,
            pg_url: args.pg_url.clone(),
            sqlite: args.wants("sqlite"),
            postgres: args.wants("postgres"),
        })
        .await?;
        println!("{report}");
        if let Some(path) = &args.out {
            std::fs::write(path, report)?;
        }
        return Ok(());
    }
    if args.callgrind {
        if !counts::valgrind_found() {
            return Err(BenchError::Usage(
                "--callgrind needs valgrind on the PATH (Debian: apt-get install valgrind)".into(),
            ));
        }
        let report =
            tokio::task::spawn_blocking(move || counts::measure(args.save_baseline)).await??;
        println!("{}", report.markdown());
        return Ok(());
    }
    if args.outbox {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!("| store | dispatcher msg/s | hand-written poller msg/s | ratio | lag p50 / p99, dispatcher | lag p50 / p99, poller |");
        println!("|---|---|---|---|---|---|");
        for r in outbox::run(args.pg_url.as_deref(), args.quick).await? {
            println!(
                "| {} | {:.0} | {:.0} | {:.2} | {:.1} / {:.1} ms | {:.1} / {:.1} ms |",
                r.store,
                r.dispatcher_rate,
                r.poller_rate,
                r.dispatcher_rate / r.poller_rate,
                ms(r.dispatcher_lag.0),
                ms(r.dispatcher_lag.1),
                ms(r.poller_lag.0),
                ms(r.poller_lag.1),
            );
        }
        return Ok(());
    }
    if args.encryption {
        println!("| replay of | plain | encrypted | encrypted ÷ plain (median of slices) |");
        println!("|---|---|---|---|");
        for row in encryption::run(args.quick).await? {
            println!(
                "| {} bytes | {:.1} µs | {:.1} µs | {:.2} |",
                row.bytes,
                row.plain.as_secs_f64() * 1e6,
                row.encrypted.as_secs_f64() * 1e6,
                row.ratio
            );
        }
        return Ok(());
    }
    let plan = Plan::new(args.quick);
    let started = std::time::Instant::now();
    let mut results = Results {
        rows: Vec::new(),
        memory: None,
        scale: Vec::new(),
        same_key: Vec::new(),
        counts: None,
    };
    let mut versions = Vec::new();

    if args.wants("memory") {
        let mut subject = Subject::new(
            "memory",
            Cpu::default(),
            Idempotency::new(MemoryStore::new()),
            None,
        );
        subject.effects = Some(steps::Effects::memory());
        if args.main {
            run_subject(subject, &plan, &mut results.rows, &SQL).await?;
            eprintln!("memory: ns per call");
            results.memory = Some(memory::run(plan.memory_calls).await?);
            // A full run counts instructions too, where valgrind is found (scripts/bench
            // installs it); a quick one does not (a minute under valgrind).
            if !args.quick {
                if counts::valgrind_found() {
                    eprintln!("memory: instructions per call (callgrind)");
                    results.counts =
                        Some(tokio::task::spawn_blocking(|| counts::measure(false)).await??);
                } else {
                    eprintln!("idem-bench: valgrind not found, so no instruction counts");
                }
            }
        }
    }

    if args.wants("sqlite") {
        let dir = tempfile::tempdir()?;
        let store = sqlite_store(&dir.path().join("bench.db")).await?;
        let pool = store.pool().clone();
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&pool)
            .await?;
        versions.push(format!(
            "SQLite {version} (temp file, WAL, synchronous=NORMAL)"
        ));
        let effects = steps::Effects::sqlite(pool.clone(), "bench_effects").await?;
        let raw = sqlite_raw(pool).await?;
        let mut subject =
            Subject::new("SQLite", Cpu::default(), Idempotency::new(store), Some(raw));
        subject.effects = Some(effects);
        if args.main {
            run_subject(subject, &plan, &mut results.rows, &SQL).await?;
        }
        if args.scale {
            let scale_plan = args.scale_plan(&plan, Cpu::default());
            eprintln!("SQLite: scale run with {} rows", scale_plan.rows);
            let scale_store = sqlite_store(&dir.path().join("scale.db")).await?;
            let backend = scale::Backend::Sqlite(scale_store.pool().clone());
            let report = scale::run(&backend, scale_plan).await?;
            results.scale.push(Scale {
                store: "SQLite",
                report,
            });
        }
    }

    if let (true, Some(url)) = (args.wants("postgres"), &args.pg_url) {
        let pool = pg_pool(url).await?;
        let version: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&pool)
            .await?;
        versions.push(format!(
            "PostgreSQL {version} (pool of {PG_POOL}, `PostgresStore` pool options: a connection idle over 1 s is pinged before use, others not)"
        ));
        let tag = format!("{:08x}", fastrand::u32(..));
        let (idem_table, raw_table) = (format!("bench_idem_{tag}"), format!("bench_raw_{tag}"));
        let effects_table = format!("bench_effects_{tag}");
        let backend_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await?;
        let cpu = Cpu {
            postmaster: u32::try_from(backend_pid).ok().and_then(cpu::postmaster_of),
        };
        let outcome = if args.main {
            let tables = PgTables {
                idem: &idem_table,
                raw: &raw_table,
                effects: &effects_table,
            };
            run_postgres(&pool, tables, &plan, cpu, &mut results).await
        } else {
            Ok(())
        };
        for t in [&idem_table, &raw_table, &effects_table] {
            for name in [t.clone(), format!("{t}_steps"), format!("{t}_migrations")] {
                sqlx::query(&format!("DROP TABLE IF EXISTS \"{name}\""))
                    .execute(&pool)
                    .await?;
            }
        }
        outcome?;
        if args.scale {
            let scale_plan = args.scale_plan(&plan, cpu);
            eprintln!("PostgreSQL: scale run with {} rows", scale_plan.rows);
            // A pool of its own, as when the scale run runs alone: the rows above leave this
            // one with all its connections open, through which one task's claims would go in
            // turn, and the claim p99 during a prune came out twice as long (4.4-5.3 × against
            // 2.2-2.5 ×: docs/performance.md, "A million expired rows").
            pool.close().await;
            let backend = scale::Backend::Postgres(pg_pool(url).await?);
            let report = scale::run(&backend, scale_plan).await?;
            results.scale.push(Scale {
                store: "PostgreSQL",
                report,
            });
        }
    }

    if let (true, true, Some(url)) = (args.main, args.wants("dynamodb"), &args.dynamodb_url) {
        dynamo::run(url, &plan, &mut results.rows, &mut versions).await?;
    }
    if args.main && (args.wants("redis") || args.wants("redis-cluster")) {
        let url = args.redis_url.as_deref().filter(|_| args.wants("redis"));
        let cluster = args
            .redis_cluster_urls
            .as_deref()
            .filter(|_| args.wants("redis-cluster"));
        redis_rows::run(url, cluster, &plan, &mut results.rows, &mut versions).await?;
    }

    if args.main && args.wants("peers") {
        versions.push(
            "peers: axum-idempotent 0.6.0 over ruts 0.13 MokaStore, idempotent 0.3.0 memory store, axum 0.8".into(),
        );
        results.same_key = peers::run(&plan, &mut results.rows).await?;
    }

    if args.main && args.wants("grpc") {
        versions.push("grpc: tonic 0.14 (HTTP/2, one connection per server), memory store".into());
        let found = grpc::run(&plan, &mut results.rows).await?;
        results.same_key.extend(found);
    }

    let table = results.markdown();
    println!("{table}");
    let took = started.elapsed();
    eprintln!("idem-bench: finished in {:.1} s", took.as_secs_f64());
    if let Some(path) = &args.out {
        let header = header(&args, &plan, &versions, took);
        std::fs::write(path, format!("{header}\n{table}"))?;
        eprintln!("idem-bench: wrote {path}");
    }
    Ok(())
}

/// The PostgreSQL run's tables: idem's, the raw baseline's, the steps rows' effects.
struct PgTables<'a> {
    idem: &'a str,
    raw: &'a str,
    effects: &'a str,
}

async fn run_postgres(
    pool: &sqlx::PgPool,
    tables: PgTables<'_>,
    plan: &Plan,
    cpu: Cpu,
    results: &mut Results,
) -> Result<(), BenchError> {
    // No background pruner in any bench store: its statements would be measured too.
    let store = PostgresStore::builder()
        .pruner(None)
        .table(tables.idem)
        .from_pool(pool.clone())
        .await?;
    postgres_raw_table(pool, tables.raw).await?;
    let raw = Raw::Postgres {
        pool: pool.clone(),
        sql: raw::Statements::postgres(tables.raw),
    };
    let mut subject = Subject::new("PostgreSQL", cpu, Idempotency::new(store), Some(raw));
    subject.effects = Some(steps::Effects::postgres(pool.clone(), tables.effects).await?);
    run_subject(subject, plan, &mut results.rows, &SQL).await
}

/// The baselines of one store's rows: the labels of its hand-written fresh and replay paths,
/// and the task counts of its storm rows.
pub(crate) struct Baselines {
    pub(crate) fresh: &'static str,
    pub replay: &'static str,
    pub storm_concurrency: &'static [usize],
    /// At most this many keys are completed ahead of the replay rows.
    pub max_replay_keys: usize,
    /// Each comparison runs this many times the plan's slices: a slow, noisy server (moto
    /// answers a few hundred requests a second) needs more of them for a stable ratio.
    pub rounds_factor: u32,
}

/// The SQL stores' baselines.
const SQL: Baselines = Baselines {
    fresh: "raw INSERT+UPDATE",
    replay: "raw SELECT",
    storm_concurrency: &STORM_CONCURRENCY,
    max_replay_keys: usize::MAX,
    rounds_factor: 1,
};

/// Every workload of the main table on one store: fresh and replay at 1, 8 and 32 tasks, then
/// the storm, idem's variants and the baseline interleaved.
pub(crate) async fn run_subject(
    mut s: Subject,
    plan: &Plan,
    rows: &mut Vec<Row>,
    baselines: &Baselines,
) -> Result<(), BenchError> {
    s.seed_replays(plan.replay_keys.min(baselines.max_replay_keys))
        .await?;
    let timing = Timing {
        rounds: plan.timing.rounds * baselines.rounds_factor.max(1),
        ..plan.timing
    };
    for c in CONCURRENCY {
        eprintln!("{}: fresh and replay, {c} tasks", s.name);
        let fresh = [
            ("engine", s.fresh_engine()),
            ("#[idempotent]", s.fresh_attribute()),
        ];
        let baseline = (baselines.fresh, s.fresh_raw());
        compare(&s, Workload::Fresh, &fresh, baseline, c, timing, rows).await?;
        let replay = [
            ("engine", s.replay_engine()),
            ("engine+cache", s.replay_cached()),
        ];
        let baseline = (baselines.replay, s.replay_raw());
        compare(&s, Workload::Replay, &replay, baseline, c, timing, rows).await?;
    }
    for &c in baselines.storm_concurrency {
        eprintln!("{}: storm, {c} tasks", s.name);
        let storm = [("engine", s.storm_engine())];
        let baseline = ("raw", s.storm_raw());
        compare(&s, Workload::Storm, &storm, baseline, c, timing, rows).await?;
    }
    if let Some(effects) = &s.effects {
        for c in CONCURRENCY {
            eprintln!("{}: 3 steps, {c} tasks", s.name);
            steps_rows(&s, effects, c, timing, rows).await?;
        }
    }
    Ok(())
}

/// The steps rows at `concurrency` tasks: idem's three steps, the recovery points by hand (SQL
/// stores) and the three writes by hand, interleaved; both idem's and the recovery points'
/// ratios are to the three writes.
async fn steps_rows(
    s: &Subject,
    effects: &steps::Effects,
    concurrency: usize,
    timing: Timing,
    rows: &mut Vec<Row>,
) -> Result<(), BenchError> {
    let sql = s.raw.is_some();
    let mut variants = vec![(
        steps::IDEM,
        steps::idem_steps(&s.engine, effects),
        if s.name.starts_with("PostgreSQL") {
            "claim and begin 1 + 3 × (write 1 + step record 1) + complete 1 = 8 statements"
        } else {
            "claim and begin 1 query + 3 × (write 1 + step record 1) + complete 1 = 8 statements"
        },
    )];
    if let Some(raw) = &s.raw {
        variants.push((
            steps::RECOVERY_POINTS,
            steps::recovery_points(raw, effects),
            "claim 1 + 3 × (write 1 + recovery point 1) + result 1 = 8 statements",
        ));
    }
    variants.push((steps::BY_HAND, steps::by_hand(effects), "3 statements"));
    let ops: Vec<&Op> = variants.iter().map(|(_, op, _)| op).collect();
    let mut samples = interleaved(&ops, concurrency, timing, s.cpu).await?;
    let Some(mut base) = samples.pop() else {
        return Err(BenchError::Unexpected("no steps baseline sample".into()));
    };
    for ((variant, _, note), sample) in variants.iter().zip(&mut samples) {
        let mut row = Row::new(
            s.name,
            Workload::Steps,
            variant,
            concurrency,
            sample,
            Some(&base),
        );
        row.note = if sql { (*note).into() } else { String::new() };
        rows.push(row);
    }
    let mut row = Row::new(
        s.name,
        Workload::Steps,
        steps::BY_HAND,
        concurrency,
        &mut base,
        None,
    );
    row.note = if sql {
        "3 statements".into()
    } else {
        String::new()
    };
    rows.push(row);
    Ok(())
}

/// Runs idem's variants and the baseline interleaved, and adds their rows.
async fn compare(
    s: &Subject,
    workload: Workload,
    idem: &[(&'static str, Op)],
    baseline: (&'static str, Option<Op>),
    concurrency: usize,
    timing: Timing,
    rows: &mut Vec<Row>,
) -> Result<(), BenchError> {
    let mut ops: Vec<&Op> = idem.iter().map(|(_, op)| op).collect();
    if let Some(raw) = &baseline.1 {
        ops.push(raw);
    }
    let mut samples = interleaved(&ops, concurrency, timing, s.cpu).await?;
    let mut base = baseline.1.as_ref().and_then(|_| samples.pop());
    for ((variant, _), sample) in idem.iter().zip(&mut samples) {
        rows.push(Row::new(
            s.name,
            workload,
            variant,
            concurrency,
            sample,
            base.as_ref(),
        ));
    }
    if let Some(b) = &mut base {
        rows.push(Row::new(s.name, workload, baseline.0, concurrency, b, None));
    }
    Ok(())
}

/// The machine, as the reports name it: cores and CPU model.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}

fn header(args: &Args, plan: &Plan, versions: &[String], took: Duration) -> String {
    let t = plan.timing;
    format!(
        "# idem-bench {mode} run, {date}\n\n\
         - machine: {machine}\n\
         - databases: {dbs}\n\
         - command: `scripts/bench{flags}` (stores: {stores}); took {took:.0} s\n\
         - each variant: {warm:.1} s warm-up, then {rounds} slices of {slice:.1} s interleaved with \
           the variants it is compared with; ratios are throughput (ops/s) ratios measured in the same run\n",
        mode = if args.quick { "quick" } else { "full" },
        machine = machine(),
        date = utc_date(),
        dbs = versions.join("; "),
        flags = args.shown.iter().map(|a| format!(" {a}")).collect::<String>(),
        stores = args.stores.join(", "),
        took = took.as_secs_f64(),
        warm = t.warmup.as_secs_f64(),
        rounds = t.rounds,
        slice = t.slice.as_secs_f64(),
    )
}

/// Today's date (UTC) as YYYY-MM-DD.
fn utc_date() -> String {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// A pool to PostgreSQL at `url` with the store's pool options and the benchmark's size.
async fn pg_pool(url: &str) -> Result<sqlx::PgPool, BenchError> {
    Ok(PostgresStore::builder()
        .max_connections(PG_POOL)
        .pool_options()
        .connect(url)
        .await?)
}
