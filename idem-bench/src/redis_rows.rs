//! RedisStore against the raw redis client doing by hand what a user would write instead, with
//! the same number of commands, on the same kind of connection, in one run: a new key is
//! `SET key token NX GET PX lease` (the claim: nil means won) plus `SET key result XX PX
//! retention`; a replay and a duplicate are the same `SET … NX GET`, which returns the stored
//! result. idem runs a Lua script per command instead (fenced, on the server's clock).
//!
//! Rows for one server and for a 3-master cluster, as `--redis-url` and `--redis-cluster-urls`
//! name them (under `scripts/bench`, the servers of `scripts/redis-servers.sh`), plus the cost of
//! `wait_for_replicas` when a replica is reachable.

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Value};

use idem::{Idempotency, RedisStore};

use crate::cpu::Cpu;
use crate::harness::Hit;
use crate::raw::Raw;
use crate::report::{Row, Workload};
use crate::workload::{work, Receipt, Subject, LEASE, RETENTION};
use crate::{compare, BenchError, Plan};

const CONCURRENCY: [usize; 3] = [1, 8, 32];

/// One server or a cluster, multiplexed and cheap to clone.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The hand-written commands.
#[derive(Clone)]
pub struct RawRedis {
    conn: Conn,
    prefix: String,
}

fn failed(e: redis::RedisError) -> BenchError {
    BenchError::Redis(e.to_string())
}

impl RawRedis {
    async fn query(&self, cmd: &Cmd) -> Result<Value, BenchError> {
        match self.conn.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
        .map_err(failed)
    }

    fn key(&self, key: &[u8; 32]) -> String {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{{{hex}}}", self.prefix)
    }

    /// `SET key p<token> NX GET PX lease`: `None` when this caller took the key, else what is
    /// stored.
    async fn claim(&self, key: &str) -> Result<Option<Vec<u8>>, BenchError> {
        let token: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        let mut value = b"p".to_vec();
        value.extend_from_slice(&token);
        let mut cmd = redis::cmd("SET");
        cmd.arg(key)
            .arg(value)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(LEASE.as_millis() as u64);
        match self.query(&cmd).await? {
            Value::Nil => Ok(None),
            Value::BulkString(b) => Ok(Some(b)),
            other => Err(BenchError::Unexpected(format!("SET NX GET gave {other:?}"))),
        }
    }

    async fn complete(&self, key: &str, seed: u64) -> Result<(), BenchError> {
        let mut value = b"c".to_vec();
        value.extend(serde_json::to_vec(&work(seed))?);
        let mut cmd = redis::cmd("SET");
        cmd.arg(key)
            .arg(value)
            .arg("XX")
            .arg("PX")
            .arg(RETENTION.as_millis() as u64);
        self.query(&cmd).await?;
        Ok(())
    }

    fn replayed(stored: &[u8]) -> Result<Option<Hit>, BenchError> {
        match stored.split_first() {
            Some((b'c', json)) => {
                let _: Receipt = serde_json::from_slice(json)?;
                Ok(Some(Hit::Replayed))
            }
            _ => Ok(None),
        }
    }

    /// Claim, trivial work, complete: two commands.
    pub async fn fresh(&self, key: &[u8; 32], seed: u64) -> Result<Hit, BenchError> {
        let key = self.key(key);
        match self.claim(&key).await? {
            None => {
                self.complete(&key, seed).await?;
                Ok(Hit::Fresh)
            }
            Some(_) => Err(BenchError::Unexpected(
                "raw SET NX found the key taken".into(),
            )),
        }
    }

    /// The claim of a completed key: one command, the stored result decoded.
    pub async fn replay(&self, key: &[u8; 32]) -> Result<Hit, BenchError> {
        match self.claim(&self.key(key)).await? {
            Some(stored) => Self::replayed(&stored)?
                .ok_or_else(|| BenchError::Unexpected("raw replay found no stored result".into())),
            None => Err(BenchError::Unexpected("a raw replay took a new key".into())),
        }
    }

    /// Claim; on a new key run and complete, otherwise read what the claim returned.
    pub async fn storm(&self, key: &[u8; 32], seed: u64) -> Result<Hit, BenchError> {
        let key = self.key(key);
        match self.claim(&key).await? {
            None => {
                self.complete(&key, seed).await?;
                Ok(Hit::Fresh)
            }
            Some(stored) => Ok(Self::replayed(&stored)?.unwrap_or(Hit::Locked)),
        }
    }
}

/// The Redis rows: one server (`url`) and a cluster (`cluster_urls`), each: fresh, replay and
/// storm at 1, 8 and 32 tasks, idem and the baseline interleaved; then, on one server with a
/// replica, the cost of `wait_for_replicas(1, …)`.
pub async fn run(
    url: Option<&str>,
    cluster_urls: Option<&[String]>,
    plan: &Plan,
    rows: &mut Vec<Row>,
    versions: &mut Vec<String>,
) -> Result<(), BenchError> {
    let tag = format!("{:08x}", fastrand::u32(..));
    if let Some(url) = url {
        versions.push(format!("Redis at {url}"));
        let client = redis::Client::open(url).map_err(failed)?;
        let conn = Conn::Single(client.get_connection_manager().await.map_err(failed)?);
        let store = RedisStore::builder()
            .prefix(format!("bench_idem_{tag}"))
            .connect(url)
            .await?;
        let raw = RawRedis {
            conn,
            prefix: format!("bench_raw_{tag}"),
        };
        measure(subject("Redis", store, raw), plan, rows, "").await?;
    }
    if let Some(urls) = cluster_urls {
        versions.push(format!("Redis Cluster at {}", urls.join(",")));
        let client =
            redis::cluster::ClusterClient::new(urls.iter().map(String::as_str)).map_err(failed)?;
        let conn = Conn::Cluster(client.get_async_connection().await.map_err(failed)?);
        let store = RedisStore::builder()
            .prefix(format!("bench_idem_{tag}"))
            .connect_cluster(urls)
            .await?;
        let raw = RawRedis {
            conn,
            prefix: format!("bench_raw_{tag}"),
        };
        measure(subject("Redis Cluster", store, raw), plan, rows, "").await?;
    }
    Ok(())
}

fn subject(name: &'static str, store: RedisStore, raw: RawRedis) -> Subject {
    Subject::new(
        name,
        Cpu::default(),
        Idempotency::new(store),
        Some(Raw::Redis(raw)),
    )
}

async fn measure(
    mut s: Subject,
    plan: &Plan,
    rows: &mut Vec<Row>,
    _note: &str,
) -> Result<(), BenchError> {
    s.seed_replays(plan.replay_keys).await?;
    for c in CONCURRENCY {
        eprintln!("{}: fresh, replay and storm, {c} tasks", s.name);
        let fresh = [
            ("engine", s.fresh_engine()),
            ("#[idempotent]", s.fresh_attribute()),
        ];
        let baseline = ("raw SET NX GET + SET XX", s.fresh_raw());
        compare(&s, Workload::Fresh, &fresh, baseline, c, plan, rows).await?;
        let replay = [
            ("engine", s.replay_engine()),
            ("engine+cache", s.replay_cached()),
        ];
        let baseline = ("raw SET NX GET", s.replay_raw());
        compare(&s, Workload::Replay, &replay, baseline, c, plan, rows).await?;
        let storm = [("engine", s.storm_engine())];
        compare(
            &s,
            Workload::Storm,
            &storm,
            ("raw", s.storm_raw()),
            c,
            plan,
            rows,
        )
        .await?;
    }
    Ok(())
}
