//! `--outbox`: the dispatcher against a hand-written polling publisher, on SQLite and (given
//! its URL) PostgreSQL, in the same run. Both publish to an in-process channel (so the broker
//! costs nothing and the figures are the outbox's own), on tables of their own.
//!
//! - **Throughput**: 20,000 messages added up front, the time until all are published and
//!   marked sent; messages a second.
//! - **Lag**: a producer adds 2,000 messages a second for 5 s while the publisher runs; the
//!   time from each message's commit to its arrival on the channel, p50 and p99.
//!
//! The hand-written poller is what a careful team writes without idem: `SELECT` the oldest
//! unsent rows (500), publish each, `UPDATE … SET sent_at` each by id, sleep 100 ms when
//! nothing was found (the dispatcher's default interval).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::{
    ChannelPublisher, Dispatcher, DispatcherConfig, Key, MemoryStore, MessageId, OutboxMessage,
    OutboxSource, Publisher, SqlOutbox,
};
use tokio::sync::mpsc::Receiver;

use crate::BenchError;

/// One store's row: throughput and lag of each publisher.
pub struct Row {
    pub store: &'static str,
    pub dispatcher_rate: f64,
    pub poller_rate: f64,
    pub dispatcher_lag: (Duration, Duration),
    pub poller_lag: (Duration, Duration),
}

fn message(i: u64) -> Result<OutboxMessage, BenchError> {
    let key = Key::derive("bench", "", &format!("m-{i}")).map_err(idem::Error::from)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    Ok(OutboxMessage::new(
        MessageId::derive(&key, "placed"),
        "order",
        format!("o-{}", i % 64),
        "placed",
        now.to_string().into_bytes(),
    )?)
}

/// The lag of a received message: now minus the add time in its payload.
fn lag_of(m: &OutboxMessage) -> Duration {
    let added: u128 = std::str::from_utf8(&m.payload)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    Duration::from_micros(now.saturating_sub(added) as u64)
}

/// Receives `n` messages (or until `deadline`); their lags.
async fn receive(
    received: &mut Receiver<OutboxMessage>,
    n: usize,
    deadline: Duration,
) -> Vec<Duration> {
    let mut lags = Vec::with_capacity(n);
    let until = tokio::time::Instant::now() + deadline;
    while lags.len() < n {
        match tokio::time::timeout_at(until, received.recv()).await {
            Ok(Some(m)) => lags.push(lag_of(&m)),
            _ => break,
        }
    }
    lags
}

fn p(lags: &mut [Duration]) -> (Duration, Duration) {
    if lags.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    lags.sort();
    let at = |q: f64| lags[((lags.len() as f64 * q) as usize).min(lags.len() - 1)];
    (at(0.5), at(0.99))
}

/// What the two publishers need of a database: its outbox, adding messages, and the
/// hand-written poller's two statements.
trait Db: Send + Sync + 'static {
    type Outbox: OutboxSource + Clone;
    fn outbox(&self) -> Self::Outbox;
    fn add(
        &self,
        chunk: &[OutboxMessage],
    ) -> impl std::future::Future<Output = Result<(), BenchError>> + Send;
    /// The oldest unsent rows (seq, payload), up to 500.
    fn unsent(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<(i64, Vec<u8>)>, BenchError>> + Send;
    fn mark(&self, seq: i64) -> impl std::future::Future<Output = Result<(), BenchError>> + Send;
}

/// A database's [`Db`]: its pool, its outbox, and its clock expression for the poller's mark.
macro_rules! sql_db {
    ($name:ident, $db:ty, $pool:ty, $now:expr) => {
        struct $name {
            pool: $pool,
            outbox: SqlOutbox<$db>,
        }

        impl Db for $name {
            type Outbox = SqlOutbox<$db>;
            fn outbox(&self) -> Self::Outbox {
                self.outbox.clone()
            }
            async fn add(&self, chunk: &[OutboxMessage]) -> Result<(), BenchError> {
                let mut tx = self.pool.begin().await?;
                self.outbox.add(&mut tx, chunk).await?;
                tx.commit().await?;
                Ok(())
            }
            async fn unsent(&self) -> Result<Vec<(i64, Vec<u8>)>, BenchError> {
                let sql = format!(
                    "SELECT seq, payload FROM {} WHERE sent_at IS NULL ORDER BY seq LIMIT 500",
                    self.outbox.table()
                );
                Ok(sqlx::query_as(&sql).fetch_all(&self.pool).await?)
            }
            async fn mark(&self, seq: i64) -> Result<(), BenchError> {
                let sql = format!(
                    "UPDATE {} SET sent_at = {} WHERE seq = $1",
                    self.outbox.table(),
                    $now
                );
                sqlx::query(&sql).bind(seq).execute(&self.pool).await?;
                Ok(())
            }
        }
    };
}

sql_db!(
    Sqlite,
    sqlx::Sqlite,
    sqlx::SqlitePool,
    "CAST(round(unixepoch('subsec') * 1000) AS INTEGER)"
);
sql_db!(Postgres, sqlx::Postgres, sqlx::PgPool, "clock_timestamp()");

/// Adds messages `from..from + n`, 100 per transaction.
async fn fill<D: Db>(db: &D, from: u64, n: u64) -> Result<(), BenchError> {
    let mut i = from;
    while i < from + n {
        let chunk: Vec<OutboxMessage> = (i..(i + 100).min(from + n))
            .map(message)
            .collect::<Result<_, _>>()?;
        db.add(&chunk).await?;
        i += 100;
    }
    Ok(())
}

/// The hand-written poller, until `stop`.
async fn poll<D: Db>(
    db: Arc<D>,
    publisher: ChannelPublisher,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), BenchError> {
    let id = MessageId::from_uuid(idem::uuid::Uuid::nil());
    while !*stop.borrow() {
        let rows = db.unsent().await?;
        if rows.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        for (seq, payload) in rows {
            let m = OutboxMessage {
                id,
                aggregate_type: "order".into(),
                aggregate_id: String::new(),
                kind: "placed".into(),
                payload,
            };
            publisher
                .publish(&m)
                .await
                .map_err(|e| BenchError::Usage(e.to_string()))?;
            db.mark(seq).await?;
        }
    }
    Ok(())
}

/// Which publisher a measurement runs.
#[derive(Clone, Copy)]
enum Which {
    Dispatcher,
    Poller,
}

/// Starts `which` on `db`; a stop sender and its task.
fn start<D: Db>(
    db: &Arc<D>,
    which: Which,
    publisher: ChannelPublisher,
) -> Result<
    (
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ),
    BenchError,
> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = match which {
        Which::Dispatcher => {
            let dispatcher = Dispatcher::new(
                Arc::new(MemoryStore::new()),
                Arc::new(db.outbox()),
                Arc::new(publisher),
                DispatcherConfig::new(),
            )?;
            let handle = dispatcher.spawn();
            let mut stopped = stopped;
            tokio::spawn(async move {
                let _ = stopped.changed().await;
                handle.shutdown().await;
            })
        }
        Which::Poller => {
            let db = db.clone();
            tokio::spawn(async move {
                if let Err(e) = poll(db, publisher, stopped).await {
                    eprintln!("idem-bench: the hand-written poller failed: {e}");
                }
            })
        }
    };
    Ok((stop, task))
}

/// Messages a second for `which` to publish `n` added up front.
async fn throughput<D: Db>(
    db: &Arc<D>,
    which: Which,
    from: u64,
    n: u64,
) -> Result<f64, BenchError> {
    fill(&**db, from, n).await?;
    let (publisher, mut received) = ChannelPublisher::new(1024);
    let started = Instant::now();
    let (stop, task) = start(db, which, publisher)?;
    let got = receive(&mut received, n as usize, Duration::from_secs(300)).await;
    let elapsed = started.elapsed();
    let _ = stop.send(true);
    drop(received);
    let _ = task.await;
    Ok(got.len() as f64 / elapsed.as_secs_f64())
}

/// p50 and p99 lag of `which` while a producer adds `rate` messages a second for `secs`.
async fn lag<D: Db>(
    db: &Arc<D>,
    which: Which,
    from: u64,
    rate: u64,
    secs: u64,
) -> Result<(Duration, Duration), BenchError> {
    let (publisher, mut received) = ChannelPublisher::new(4096);
    let (stop, task) = start(db, which, publisher)?;
    let n = rate * secs;
    let producer = {
        let db = db.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let per_tick = (rate / 100).max(1);
            let mut i = from;
            while i < from + n {
                tick.tick().await;
                fill(&*db, i, per_tick).await?;
                i += per_tick;
            }
            Ok::<(), BenchError>(())
        })
    };
    let mut lags = receive(
        &mut received,
        n as usize,
        Duration::from_secs(secs * 10 + 30),
    )
    .await;
    producer
        .await
        .map_err(|e| BenchError::Usage(e.to_string()))??;
    let _ = stop.send(true);
    drop(received);
    let _ = task.await;
    Ok(p(&mut lags))
}

async fn row<D: Db>(store: &'static str, db: D, quick: bool) -> Result<Row, BenchError> {
    let db = Arc::new(db);
    let n = if quick { 5_000 } else { 20_000 };
    let secs = if quick { 2 } else { 5 };
    // Interleaved: poller, dispatcher, dispatcher, poller; the better of each pair.
    let mut rates = [0.0f64; 2];
    let mut from = 0;
    for which in [
        Which::Poller,
        Which::Dispatcher,
        Which::Dispatcher,
        Which::Poller,
    ] {
        let r = throughput(&db, which, from, n).await?;
        from += n;
        let at = matches!(which, Which::Dispatcher) as usize;
        rates[at] = rates[at].max(r);
    }
    let poller_lag = lag(&db, Which::Poller, from, 2_000, secs).await?;
    from += 2_000 * secs;
    let dispatcher_lag = lag(&db, Which::Dispatcher, from, 2_000, secs).await?;
    Ok(Row {
        store,
        dispatcher_rate: rates[1],
        poller_rate: rates[0],
        dispatcher_lag,
        poller_lag,
    })
}

/// The rows: SQLite in a temporary file, and PostgreSQL at `pg_url` if given.
pub async fn run(pg_url: Option<&str>, quick: bool) -> Result<Vec<Row>, BenchError> {
    let mut rows = Vec::new();
    let dir = tempfile::tempdir()?;
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("outbox.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Normal);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    let outbox = SqlOutbox::new(pool.clone(), "outbox").await?;
    rows.push(row("SQLite", Sqlite { pool, outbox }, quick).await?);
    if let Some(url) = pg_url {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(url)
            .await?;
        let table = format!("bench_outbox_{:x}", fastrand::u32(..));
        let outbox = SqlOutbox::new(pool.clone(), &table).await?;
        rows.push(
            row(
                "PostgreSQL",
                Postgres {
                    pool: pool.clone(),
                    outbox,
                },
                quick,
            )
            .await?,
        );
        sqlx::raw_sql(&format!("DROP TABLE \"{table}\", \"{table}_migrations\""))
            .execute(&pool)
            .await?;
    }
    Ok(rows)
}
