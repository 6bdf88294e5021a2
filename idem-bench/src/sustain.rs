//! The sustained run: new keys at a steady rate with a short retention, for minutes, on SQLite
//! and PostgreSQL, once with the library's `Pruner` (its defaults, so the store's batch size)
//! and once without it. Every few seconds it counts the records, the expired ones and the
//! table's bytes, and it keeps every claim's latency: does the pruner keep pace (expired rows
//! bounded, the table no longer growing), and what does it cost the claims (p99 against the run
//! without it)?

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem::{
    ClaimOutcome, ClaimRequest, Completion, Key, PostgresStore, Pruner, PrunerConfig, Store,
};
use sqlx::{PgPool, SqlitePool};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use crate::workload::{random_key, LEASE};
use crate::BenchError;

/// Calls in flight at most; past it the offered rate waits (and the achieved rate shows it).
const IN_FLIGHT: usize = 256;

/// How often the table is counted.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// The stored result of every call, kept for `retention`.
fn done(retention: Duration) -> Completion<'static> {
    Completion {
        response: Some(br#"{"account":7,"cents":4200}"#),
        is_error: false,
        retention,
        key_retention: Duration::ZERO,
    }
}

/// How hard and how long.
#[derive(Debug, Clone, Copy)]
pub struct SustainPlan {
    /// New keys per second offered.
    pub rate: u32,
    /// Length of the run with the pruner.
    pub secs: u64,
    /// Length of the run without it (its claim latencies are the baseline).
    pub baseline_secs: u64,
    /// Retention of the completed records.
    pub retention: Duration,
}

/// One count of the table.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub at: Duration,
    pub rows: i64,
    pub expired: i64,
    pub bytes: i64,
}

/// One run on one store.
#[derive(Debug, Clone)]
pub struct SustainRun {
    pub store: &'static str,
    /// The pruner's batch size, or `None` when it was stopped.
    pub pruner: Option<u32>,
    pub wall: Duration,
    pub calls: u64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub points: Vec<Point>,
}

impl SustainRun {
    /// The most expired rows counted after the first retention (before it, nothing can have
    /// expired for long).
    pub fn worst_expired(&self, retention: Duration) -> i64 {
        self.points
            .iter()
            .filter(|p| p.at > retention * 2)
            .map(|p| p.expired)
            .max()
            .unwrap_or(0)
    }

    /// The table's bytes at the end over its bytes a minute earlier (1.0: stopped growing).
    pub fn growth_last_minute(&self) -> Option<f64> {
        let last = self.points.last()?;
        let earlier = self
            .points
            .iter()
            .rev()
            .find(|p| last.at.saturating_sub(p.at) >= Duration::from_secs(60))?;
        (earlier.bytes > 0).then(|| last.bytes as f64 / earlier.bytes as f64)
    }
}

/// Where the records live, for counting them.
pub enum Table {
    Sqlite(SqlitePool),
    Postgres(PgPool, String),
}

impl Table {
    async fn count(&self) -> Result<(i64, i64, i64), BenchError> {
        Ok(match self {
            Table::Sqlite(pool) => {
                let (rows, expired): (i64, Option<i64>) = sqlx::query_as(
                    "SELECT count(*), sum(expires_at <= CAST(round(unixepoch('subsec') * 1000) \
                     AS INTEGER)) FROM idem_records",
                )
                .fetch_one(pool)
                .await?;
                let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
                    .fetch_one(pool)
                    .await?;
                let size: i64 = sqlx::query_scalar("PRAGMA page_size")
                    .fetch_one(pool)
                    .await?;
                (rows, expired.unwrap_or(0), pages * size)
            }
            Table::Postgres(pool, table) => {
                sqlx::query_as(&format!(
                    "SELECT count(*), count(*) FILTER (WHERE expires_at <= clock_timestamp()), \
                     pg_total_relation_size('\"{table}\"') FROM \"{table}\""
                ))
                .fetch_one(pool)
                .await?
            }
        })
    }
}

/// Claims and completes new keys at `plan.rate` a second for `secs`, counting the table every
/// [`SAMPLE_EVERY`], with the library's pruner running or not.
async fn run_one(
    name: &'static str,
    store: Arc<dyn Store>,
    table: &Table,
    plan: SustainPlan,
    secs: u64,
    pruner: bool,
) -> Result<SustainRun, BenchError> {
    eprintln!(
        "{name}: {} new keys/s for {secs} s, pruner {}",
        plan.rate,
        if pruner { "running" } else { "stopped" }
    );
    let (handle, batch) = if pruner {
        let pruner = Pruner::records(store.clone(), PrunerConfig::default())?;
        let batch = pruner.batch_size();
        (Some(pruner.spawn()), Some(batch))
    } else {
        (None, None)
    };
    let latencies = Arc::new(Mutex::new(Vec::<u64>::with_capacity(
        plan.rate as usize * secs as usize,
    )));
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = JoinSet::new();
    let mut points = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let started = Instant::now();
    let length = Duration::from_secs(secs);
    let mut issued = 0u64;
    let mut next_sample = Duration::ZERO;
    loop {
        tick.tick().await;
        let now = started.elapsed();
        if now >= next_sample {
            let (rows, expired, bytes) = table.count().await?;
            points.push(Point {
                at: now,
                rows,
                expired,
                bytes,
            });
            next_sample += SAMPLE_EVERY;
        }
        if now >= length {
            break;
        }
        let due = (now.as_secs_f64() * f64::from(plan.rate)) as u64;
        while issued < due {
            let permit = permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| BenchError::Unexpected(e.to_string()))?;
            issued += 1;
            let (store, latencies) = (store.clone(), latencies.clone());
            let retention = plan.retention;
            tasks.spawn(async move {
                let _permit = permit;
                let key = Key::from_bytes(random_key());
                let t = Instant::now();
                let claim = match store.claim(ClaimRequest::new(&key, LEASE)).await? {
                    ClaimOutcome::Claimed(claim) => claim,
                    _ => return Err(BenchError::Unexpected("a new key was taken".into())),
                };
                let took = t.elapsed();
                store.complete(&claim, done(retention)).await?;
                latencies
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
                Ok::<_, BenchError>(())
            });
            // Reap finished calls as we go, so errors surface and the set stays small.
            while let Some(done) = tasks.try_join_next() {
                done.map_err(|e| BenchError::Unexpected(e.to_string()))??;
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| BenchError::Unexpected(e.to_string()))??;
    }
    let wall = started.elapsed();
    if let Some(handle) = handle {
        handle.shutdown().await;
    }
    let mut lat = std::mem::take(&mut *latencies.lock().unwrap_or_else(PoisonError::into_inner));
    lat.sort_unstable();
    let at = |p: f64| {
        let n = lat.len();
        if n == 0 {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        Duration::from_nanos(lat[rank.clamp(1, n) - 1])
    };
    Ok(SustainRun {
        store: name,
        pruner: batch,
        wall,
        calls: lat.len() as u64,
        p50: at(50.0),
        p99: at(99.0),
        max: at(100.0),
        points,
    })
}

/// The SQLite runs, each on a new database file: without the pruner, then with it.
pub async fn sqlite(plan: SustainPlan) -> Result<Vec<SustainRun>, BenchError> {
    let mut runs = Vec::new();
    for (i, (pruner, secs)) in [(false, plan.baseline_secs), (true, plan.secs)]
        .into_iter()
        .enumerate()
    {
        let dir = tempfile::tempdir()?;
        // The run spawns its own pruner, or none for the baseline: never the store's.
        let store = crate::sqlite_store(&dir.path().join(format!("sustain-{i}.db"))).await?;
        let table = Table::Sqlite(store.pool().clone());
        runs.push(run_one("SQLite", Arc::new(store), &table, plan, secs, pruner).await?);
    }
    Ok(runs)
}

/// The PostgreSQL runs, each on a new table (dropped after): without the pruner, then with it.
pub async fn postgres(pool: &PgPool, plan: SustainPlan) -> Result<Vec<SustainRun>, BenchError> {
    let mut runs = Vec::new();
    for (pruner, secs) in [(false, plan.baseline_secs), (true, plan.secs)] {
        let name = format!("sustain_{:08x}", fastrand::u32(..));
        // The run spawns its own pruner, or none for the baseline: never the store's.
        let store = PostgresStore::builder()
            .pruner(None)
            .table(&name)
            .from_pool(pool.clone())
            .await?;
        let table = Table::Postgres(pool.clone(), name.clone());
        let outcome = run_one("PostgreSQL", Arc::new(store), &table, plan, secs, pruner).await;
        for t in [name.clone(), format!("{name}_migrations")] {
            sqlx::query(&format!("DROP TABLE IF EXISTS \"{t}\""))
                .execute(pool)
                .await?;
        }
        runs.push(outcome?);
    }
    Ok(runs)
}

/// The runs as markdown: one row per run, the targets, and the counts over time.
pub fn markdown(plan: SustainPlan, runs: &[SustainRun]) -> String {
    use std::fmt::Write as _;
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    let bound = 2 * i64::from(plan.rate) * plan.retention.as_secs() as i64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Sustained new keys: {} a second, {} s retention\n",
        plan.rate,
        plan.retention.as_secs()
    );
    let _ = writeln!(
        out,
        "| store | pruner | seconds | new keys/s achieved | claim p50 | claim p99 | claim max | \
         expired rows, most (after 2 retentions) | rows at the end | table bytes at the end | \
         bytes, end ÷ a minute before |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in runs {
        let last = r.points.last();
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            r.store,
            r.pruner
                .map_or("stopped".to_owned(), |b| format!("running, batches of {b}")),
            r.wall.as_secs_f64(),
            r.calls as f64 / r.wall.as_secs_f64().max(1e-9),
            ms(r.p50),
            ms(r.p99),
            ms(r.max),
            r.worst_expired(plan.retention),
            last.map_or(0, |p| p.rows),
            last.map_or(0, |p| p.bytes),
            r.growth_last_minute()
                .map_or("—".to_owned(), |g| format!("{g:.2}")),
        );
    }
    let _ = writeln!(
        out,
        "\nTargets:\n\n| target | measured | verdict |\n|---|---|---|"
    );
    for store in ["SQLite", "PostgreSQL"] {
        let (Some(with), Some(without)) = (
            runs.iter().find(|r| r.store == store && r.pruner.is_some()),
            runs.iter().find(|r| r.store == store && r.pruner.is_none()),
        ) else {
            continue;
        };
        let worst = with.worst_expired(plan.retention);
        let _ = writeln!(
            out,
            "| {store}: expired rows < 2 × rate × retention ({bound}) | {worst} | {} |",
            if worst < bound { "met" } else { "not met" }
        );
        let growth = with.growth_last_minute();
        let _ = writeln!(
            out,
            "| {store}: the table stops growing (bytes at the end ÷ a minute before ≤ 1.05) | {} | {} |",
            growth.map_or("—".to_owned(), |g| format!("{g:.2}")),
            if growth.is_some_and(|g| g <= 1.05) { "met" } else { "not met" }
        );
        let ratio = with.p99.as_secs_f64() / without.p99.as_secs_f64().max(1e-12);
        let _ = writeln!(
            out,
            "| {store}: claim p99 with the pruner ≤ 1.5 × without | {} ÷ {} = {ratio:.2} | {} |",
            ms(with.p99),
            ms(without.p99),
            if ratio <= 1.5 { "met" } else { "not met" }
        );
    }
    let _ = writeln!(
        out,
        "\nCounts over time (seconds: expired rows / rows / table KiB):\n"
    );
    for r in runs {
        let series: Vec<String> = r
            .points
            .iter()
            .map(|p| {
                format!(
                    "{:.0}: {} / {} / {}",
                    p.at.as_secs_f64(),
                    p.expired,
                    p.rows,
                    p.bytes / 1024
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "- {} (pruner {}): {}",
            r.store,
            if r.pruner.is_some() {
                "running"
            } else {
                "stopped"
            },
            series.join("; ")
        );
    }
    out
}
