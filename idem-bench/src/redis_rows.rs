//! RedisStore against the raw redis client sending the same number of commands on the same kind
//! of connection, in one run, with two baselines:
//!
//! - **the same scripts** (`RedisStore::script_sources`, sent with `EVALSHA` by hand): a new key
//!   is the claim script plus the completion script, a replay and a duplicate the claim script.
//!   The ratio is idem's client-side cost.
//! - **plain commands**, what a user would write without fencing or the server's clock: a new
//!   key is `SET key token NX GET PX lease` (nil means won) plus `SET key result XX PX
//!   retention`; a replay and a duplicate are the same `SET … NX GET`. The ratio adds what the
//!   scripts cost the server (about 17 µs a call against 2 µs for a `SET`, from `INFO
//!   commandstats`).
//!
//! Rows for one server and for a 3-master cluster, as `--redis-url` and `--redis-cluster-urls`
//! name them (under `scripts/bench`, the servers of `scripts/redis-servers.sh`).

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Value};

use idem::{Idempotency, RedisStore};

use crate::cpu::Cpu;
use crate::harness::Hit;
use crate::raw::Raw;
use crate::report::Row;
use crate::workload::{work, Receipt, Subject, LEASE, RETENTION};
use crate::{run_subject, Baselines, BenchError, Plan};

/// The baselines of these rows, the storm at 1, 8 and 32 tasks.
const BASELINES: Baselines = Baselines {
    fresh: "raw, same commands",
    replay: "raw, same command",
    storm_concurrency: &[1, 8, 32],
    max_replay_keys: usize::MAX,
};

/// One server or a cluster, multiplexed and cheap to clone.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The hand-written commands: idem's scripts, or plain `SET`s.
#[derive(Clone)]
pub struct RawRedis {
    conn: Conn,
    prefix: String,
    scripts: Option<std::sync::Arc<(redis::Script, redis::Script)>>,
}

/// What the claim script answered: `None` when this caller took the key.
fn claim_answer(v: Value) -> Result<Option<Vec<u8>>, BenchError> {
    let Value::Array(parts) = v else {
        return Err(BenchError::Unexpected(format!(
            "the claim script gave {v:?}"
        )));
    };
    match parts.as_slice() {
        [Value::BulkString(tag), ..] if tag == b"started" => Ok(None),
        [Value::BulkString(tag), _, Value::Int(1), Value::BulkString(r), _] if tag == b"done" => {
            let mut stored = b"c".to_vec();
            stored.extend_from_slice(r);
            Ok(Some(stored))
        }
        _ => Ok(Some(b"p".to_vec())),
    }
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
    async fn claim(&self, key: &str, token: &[u8; 16]) -> Result<Option<Vec<u8>>, BenchError> {
        if let Some(scripts) = &self.scripts {
            let mut call = scripts.0.key(key);
            call.arg(&token[..])
                .arg(LEASE.as_millis() as u64)
                .arg(&b""[..]);
            let v = match self.conn.clone() {
                Conn::Single(mut c) => call.invoke_async(&mut c).await,
                Conn::Cluster(mut c) => call.invoke_async(&mut c).await,
            }
            .map_err(failed)?;
            return claim_answer(v);
        }
        let mut value = b"p".to_vec();
        value.extend_from_slice(token);
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

    async fn complete(&self, key: &str, token: &[u8; 16], seed: u64) -> Result<(), BenchError> {
        if let Some(scripts) = &self.scripts {
            let response = serde_json::to_vec(&work(seed))?;
            let mut call = scripts.1.key(key);
            call.arg(&token[..])
                .arg(RETENTION.as_millis() as u64)
                .arg("1")
                .arg(response)
                .arg("0");
            let _: Value = match self.conn.clone() {
                Conn::Single(mut c) => call.invoke_async(&mut c).await,
                Conn::Cluster(mut c) => call.invoke_async(&mut c).await,
            }
            .map_err(failed)?;
            return Ok(());
        }
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
        match self.storm(key, seed).await? {
            Hit::Fresh => Ok(Hit::Fresh),
            _ => Err(BenchError::Unexpected(
                "raw claim found the key taken".into(),
            )),
        }
    }

    /// The claim of a completed key: one command, the stored result decoded.
    pub async fn replay(&self, key: &[u8; 32]) -> Result<Hit, BenchError> {
        let token: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        match self.claim(&self.key(key), &token).await? {
            Some(stored) => Self::replayed(&stored)?
                .ok_or_else(|| BenchError::Unexpected("raw replay found no stored result".into())),
            None => Err(BenchError::Unexpected("a raw replay took a new key".into())),
        }
    }

    /// Claim; on a new key run and complete, otherwise read what the claim returned.
    pub async fn storm(&self, key: &[u8; 32], seed: u64) -> Result<Hit, BenchError> {
        let key = self.key(key);
        let token: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        match self.claim(&key, &token).await? {
            None => {
                self.complete(&key, &token, seed).await?;
                Ok(Hit::Fresh)
            }
            Some(stored) => Ok(Self::replayed(&stored)?.unwrap_or(Hit::Locked)),
        }
    }
}

/// The Redis rows: one server (`url`) and a cluster (`cluster_urls`), each: fresh, replay and
/// storm at 1, 8 and 32 tasks, idem and the baseline interleaved. (The cost of
/// `wait_for_replicas` is not measured here: the benchmark's server has no replica.)
pub async fn run(
    url: Option<&str>,
    cluster_urls: Option<&[String]>,
    plan: &Plan,
    rows: &mut Vec<Row>,
    versions: &mut Vec<String>,
) -> Result<(), BenchError> {
    let tag = format!("{:08x}", fastrand::u32(..));
    let sources = RedisStore::script_sources();
    let source = |name: &str| {
        sources
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| redis::Script::new(s))
            .ok_or_else(|| BenchError::Unexpected(format!("no {name} script")))
    };
    let scripts = std::sync::Arc::new((source("claim")?, source("complete")?));
    if let Some(url) = url {
        versions.push(format!("Redis at {url}"));
        let client = redis::Client::open(url).map_err(failed)?;
        let conn = Conn::Single(client.get_connection_manager().await.map_err(failed)?);
        for (name, scripts) in [("Redis", Some(scripts.clone())), ("Redis vs SET", None)] {
            let store = RedisStore::builder()
                .prefix(format!("bench_idem_{tag}_{}", scripts.is_some()))
                .connect(url)
                .await?;
            let raw = RawRedis {
                conn: conn.clone(),
                prefix: format!("bench_raw_{tag}_{}", scripts.is_some()),
                scripts,
            };
            run_subject(subject(name, store, raw), plan, rows, &BASELINES).await?;
        }
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
            scripts: Some(scripts),
        };
        run_subject(subject("Redis Cluster", store, raw), plan, rows, &BASELINES).await?;
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
