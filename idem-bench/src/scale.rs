//! The scale run: claim latency on a table holding many records against an empty one, and
//! claim latency while a pruner drains many expired records against the same claims without it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem::store::{Forward, Forwarding};
use idem::{
    ClaimOutcome, ClaimRequest, Key, PostgresStore, Pruner, PrunerConfig, SqliteStore, Store,
};
use sqlx::{PgPool, SqlitePool};
use tokio::time::Instant;

use crate::cpu::Cpu;
use crate::harness::{self, op, Hit, Op, Sample, Timing};
use crate::workload::random_key;
use crate::BenchError;

/// Claims run from this many tasks while measuring latency.
pub const CLAIM_CONCURRENCY: usize = 1;

/// The lease of the measured claims: longer than any prune takes, so the pruner deletes exactly
/// the loaded records and none of the claims made meanwhile.
const CLAIM_LEASE: Duration = Duration::from_secs(3600);

/// Where the scale tables live.
#[derive(Clone)]
pub enum Backend {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// How big and how long.
#[derive(Debug, Clone, Copy)]
pub struct ScalePlan {
    /// Records in the full table and in the table to prune.
    pub rows: u64,
    pub timing: Timing,
    /// The most time alternating slices before the run gives up draining.
    pub prune_cap: Duration,
    /// The pruner's batch size: `None` for the store's own ([`Store::prune_batch_size`]),
    /// set to it once the run knows the store.
    pub prune_batch: Option<u32>,
    /// A fixed pause between the pruner's batches; `None`: paced by cost (the default).
    pub prune_pause: Option<Duration>,
    /// The pruner's share of the store's time; `None`: its default.
    pub prune_share: Option<f64>,
    pub cpu: Cpu,
}

/// What the scale run measured on one backend.
pub struct ScaleReport {
    pub plan: ScalePlan,
    pub load_time: Duration,
    /// Claims on a table that started empty.
    pub empty: Sample,
    /// Claims on a table holding `rows` live records.
    pub full: Sample,
    /// Claims on a table of `rows` expired records, pruner stopped.
    pub without_prune: Sample,
    /// The same claims while the pruner deletes.
    pub during_prune: Sample,
    pub pruned: u64,
    pub prune_time: Duration,
    pub prune_finished: bool,
}

impl Backend {
    fn tag(&self) -> String {
        format!("{:08x}", fastrand::u32(..))
    }

    /// A store on a new table of the real schema (its own migrations create it).
    async fn store(&self, table: &str) -> Result<Arc<dyn Store>, BenchError> {
        // No background pruner: the scale run measures a table as it fills.
        Ok(match self {
            Backend::Sqlite(pool) => Arc::new(
                SqliteStore::builder()
                    .pruner(None)
                    .table(table)
                    .from_pool(pool.clone())
                    .await?,
            ),
            Backend::Postgres(pool) => Arc::new(
                PostgresStore::builder()
                    .pruner(None)
                    .table(table)
                    .from_pool(pool.clone())
                    .await?,
            ),
        })
    }

    /// Inserts `rows` completed records in one statement, with random keys and tokens, whose
    /// retention ends `expires_in_ms` from now (negative: already expired).
    async fn bulk_load(
        &self,
        table: &str,
        rows: u64,
        expires_in_ms: i64,
    ) -> Result<(), BenchError> {
        let rows = i64::try_from(rows).unwrap_or(i64::MAX);
        let response = br#"{"account":42,"cents":4200}"#.as_slice();
        match self {
            Backend::Sqlite(pool) => {
                sqlx::query(&format!(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
                     INSERT INTO \"{table}\" (key, fingerprint, token, state, expires_at, response, is_error) \
                     SELECT randomblob(32), NULL, randomblob(16), 1, \
                       CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + ?2, ?3, 0 FROM n"
                ))
                .bind(rows)
                .bind(expires_in_ms)
                .bind(response)
                .persistent(false)
                .execute(pool)
                .await?;
                // Fold the bulk load into the database file, as a long-lived database would be.
                sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                    .persistent(false)
                    .execute(pool)
                    .await?;
            }
            Backend::Postgres(pool) => {
                let salt: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
                sqlx::query(&format!(
                    "INSERT INTO \"{table}\" (key, fingerprint, token, state, expires_at, response, is_error) \
                     SELECT sha256($1::bytea || int8send(i)), NULL, \
                       substring(sha256(int8send(i) || $1::bytea) from 1 for 16), 1, \
                       clock_timestamp() + $2::bigint * interval '1 millisecond', $3, false \
                     FROM generate_series(1, $4::bigint) AS i"
                ))
                .bind(&salt[..])
                .bind(expires_in_ms)
                .bind(response)
                .bind(rows)
                .persistent(false)
                .execute(pool)
                .await?;
                // A long-lived table has been vacuumed and analysed; a fresh bulk load has not.
                sqlx::query(&format!("VACUUM (ANALYZE) \"{table}\""))
                    .persistent(false)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    async fn drop_tables(&self, tables: &[String]) -> Result<(), BenchError> {
        for table in tables {
            for name in [table.clone(), format!("{table}_migrations")] {
                let sql = format!("DROP TABLE IF EXISTS \"{name}\"");
                match self {
                    Backend::Sqlite(pool) => {
                        sqlx::query(&sql).persistent(false).execute(pool).await?;
                    }
                    Backend::Postgres(pool) => {
                        sqlx::query(&sql).persistent(false).execute(pool).await?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A claim of a new random key.
fn claim(store: Arc<dyn Store>) -> Op {
    op(move || {
        let store = store.clone();
        async move {
            match store
                .claim(ClaimRequest::new(
                    &Key::from_bytes(random_key()),
                    CLAIM_LEASE,
                ))
                .await?
            {
                ClaimOutcome::Claimed(_) => Ok(Hit::Fresh),
                _ => Err(BenchError::Unexpected(
                    "a new random key was not claimable".into(),
                )),
            }
        }
    })
}

/// Runs both scale measurements on `backend` with `rows` records.
pub async fn run(backend: &Backend, plan: ScalePlan) -> Result<ScaleReport, BenchError> {
    let tag = backend.tag();
    let tables = [
        format!("bench_scale_empty_{tag}"),
        format!("bench_scale_full_{tag}"),
        format!("bench_scale_prune_{tag}"),
    ];
    let result = measure(backend, &tables, plan).await;
    let dropped = backend.drop_tables(&tables).await;
    let report = result?;
    dropped?;
    Ok(report)
}

async fn measure(
    backend: &Backend,
    tables: &[String; 3],
    plan: ScalePlan,
) -> Result<ScaleReport, BenchError> {
    let empty = backend.store(&tables[0]).await?;
    let full = backend.store(&tables[1]).await?;
    let doomed = backend.store(&tables[2]).await?;
    let loading = Instant::now();
    backend
        .bulk_load(&tables[1], plan.rows, 24 * 3600 * 1000)
        .await?;
    backend
        .bulk_load(&tables[2], plan.rows, -3600 * 1000)
        .await?;
    let load_time = loading.elapsed();

    let samples = harness::interleaved(
        &[&claim(empty), &claim(full)],
        CLAIM_CONCURRENCY,
        plan.timing,
        plan.cpu,
    )
    .await?;
    let [empty, full]: [Sample; 2] = samples
        .try_into()
        .map_err(|_| BenchError::Unexpected("two samples expected".into()))?;

    let plan = ScalePlan {
        prune_batch: Some(plan.prune_batch.unwrap_or(doomed.prune_batch_size())),
        ..plan
    };
    let prune = prune_while_claiming(doomed, plan).await?;
    Ok(ScaleReport {
        plan,
        load_time,
        empty,
        full,
        without_prune: prune.without,
        during_prune: prune.during,
        pruned: prune.pruned,
        prune_time: prune.time,
        prune_finished: prune.finished,
    })
}

struct PruneRun {
    without: Sample,
    during: Sample,
    pruned: u64,
    time: Duration,
    finished: bool,
}

/// Alternates slices of claims with the pruner stopped and running, until the pruner has
/// drained the expired records or `plan.prune_cap` of run time has passed. The pruner is
/// idem's own [`Pruner`] with its default pacing unless `--prune-batch` /
/// `--prune-pause-ms` override it: spawned for each running slice (its first run starts at
/// once) and shut down for each stopped one.
async fn prune_while_claiming(
    store: Arc<dyn Store>,
    plan: ScalePlan,
) -> Result<PruneRun, BenchError> {
    let (timing, cpu) = (plan.timing, plan.cpu);
    let metered = Arc::new(Forwarding(Metered {
        inner: store.clone(),
        rows: AtomicU64::new(0),
        busy_nanos: AtomicU64::new(0),
    }));
    let mut config = PrunerConfig::new();
    if let Some(batch) = plan.prune_batch {
        config = config.batch_size(batch);
    }
    if let Some(share) = plan.prune_share {
        config = config.share(share);
    }
    if let Some(pause) = plan.prune_pause {
        config = config.pause(pause);
    }
    let pruner = Pruner::records(metered.clone(), config)?;
    let done = Arc::new(AtomicBool::new(false));

    let claims = claim(store);
    harness::run(&claims, CLAIM_CONCURRENCY, timing.warmup, cpu).await?;
    let (mut without, mut during) = (Sample::default(), Sample::default());
    let started = Instant::now();
    while !done.load(Ordering::Relaxed) && started.elapsed() < plan.prune_cap {
        without.merge(harness::run(&claims, CLAIM_CONCURRENCY, timing.slice, cpu).await?);
        let mut handle = pruner.clone().spawn();
        let measured = harness::run_until(&claims, CLAIM_CONCURRENCY, timing.slice, cpu, &done);
        tokio::pin!(measured);
        let mut watching = true;
        let sample = loop {
            tokio::select! {
                sample = &mut measured => break sample?,
                report = handle.next_report(), if watching => match report {
                    Some(report) if report.drained => {
                        done.store(true, Ordering::Relaxed);
                        watching = false;
                    }
                    Some(_) => {}
                    None => watching = false,
                },
            }
        };
        handle.shutdown().await;
        during.merge(sample);
    }
    Ok(PruneRun {
        without,
        during,
        pruned: metered.rows.load(Ordering::Relaxed),
        time: Duration::from_nanos(metered.busy_nanos.load(Ordering::Relaxed)),
        finished: done.load(Ordering::Relaxed),
    })
}

/// The store as the pruner sees it, counting the rows its `prune_expired` calls delete and the
/// time spent in them.
struct Metered {
    inner: Arc<dyn Store>,
    rows: AtomicU64,
    busy_nanos: AtomicU64,
}

#[async_trait]
impl Forward for Metered {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn prune_expired(&self, limit: u32) -> Result<u64, idem::Error> {
        let t = Instant::now();
        let deleted = self.inner.prune_expired(limit).await?;
        let nanos = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.busy_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.rows.fetch_add(deleted, Ordering::Relaxed);
        Ok(deleted)
    }
}
