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
    rounds_factor: 1,
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
    /// One connection, or (beside a store with `wait_for_replicas`) as many as the store
    /// opens, taken in turn.
    conns: std::sync::Arc<[Conn]>,
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    prefix: String,
    scripts: Option<std::sync::Arc<(redis::Script, redis::Script)>>,
    /// With the scripts: `WAIT n timeout` after each, in the same round trip, as
    /// `wait_for_replicas` sends it.
    wait: Option<(u32, u64)>,
}

/// The scripts' second key, `KEYS[2]`: where a record keeps its response while a tombstone
/// outlives it (idem-redis's `RESPONSE` suffix), in the record's hash slot.
fn response_key(key: &str) -> String {
    format!("{key}:r")
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
        match self.conn() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
        .map_err(failed)
    }

    /// Runs a script by hand: `EVALSHA` through the client's `Script` (which loads it on
    /// `NOSCRIPT`), or, with a replica wait, `EVALSHA` and `WAIT` pipelined (the scripts were
    /// loaded ahead when the rows are set up).
    async fn invoke(
        &self,
        call: &redis::ScriptInvocation<'_>,
        script: &redis::Script,
        key: &str,
        args: &[Vec<u8>],
    ) -> Result<Value, BenchError> {
        let Some((replicas, timeout_ms)) = self.wait else {
            return match self.conn() {
                Conn::Single(mut c) => call.invoke_async(&mut c).await,
                Conn::Cluster(mut c) => call.invoke_async(&mut c).await,
            }
            .map_err(failed);
        };
        let mut pipe = redis::pipe();
        let evalsha = pipe
            .cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(2)
            .arg(key)
            .arg(response_key(key));
        for a in args {
            evalsha.arg(&a[..]);
        }
        pipe.cmd("WAIT").arg(replicas).arg(timeout_ms);
        let values: Vec<Value> = match self.conn() {
            Conn::Single(mut c) => pipe.query_async(&mut c).await,
            Conn::Cluster(mut c) => pipe.query_async(&mut c).await,
        }
        .map_err(failed)?;
        match values.as_slice() {
            [v, Value::Int(acked)] if *acked >= i64::from(replicas) => Ok(v.clone()),
            other => Err(BenchError::Unexpected(format!(
                "EVALSHA + WAIT gave {other:?}"
            ))),
        }
    }

    fn conn(&self) -> Conn {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.conns[i % self.conns.len()].clone()
    }

    fn key(&self, key: &[u8; 32]) -> String {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{{{hex}}}", self.prefix)
    }

    /// `SET key p<token> NX GET PX lease`: `None` when this caller took the key, else what is
    /// stored.
    async fn claim(&self, key: &str, token: &[u8; 16]) -> Result<Option<Vec<u8>>, BenchError> {
        if let Some(scripts) = &self.scripts {
            // The claim script's arguments: token, lease, fingerprint (none), uncertain on
            // lapse (no).
            let args = [
                token.to_vec(),
                (LEASE.as_millis() as u64).to_string().into_bytes(),
                Vec::new(),
                b"0".to_vec(),
            ];
            let mut call = scripts.0.key(key);
            call.key(response_key(key));
            call.arg(&args[..]);
            return claim_answer(self.invoke(&call, &scripts.0, key, &args).await?);
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
            let args = [
                token.to_vec(),
                (RETENTION.as_millis() as u64).to_string().into_bytes(),
                b"1".to_vec(),
                serde_json::to_vec(&work(seed))?,
                b"0".to_vec(),
                // The tombstone the engine keeps by default, so both sides write the same.
                idem::DEFAULT_KEY_RETENTION
                    .as_secs()
                    .to_string()
                    .into_bytes(),
            ];
            let mut call = scripts.1.key(key);
            call.key(response_key(key));
            call.arg(&args[..]);
            self.invoke(&call, &scripts.1, key, &args).await?;
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

/// The connections a `RedisStore` opens with `wait_for_replicas` (its default).
const WAIT_CONNECTIONS: usize = 8;

/// How long the `wait_for_replicas` rows let `WAIT` wait for the replica.
const WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// `connected_slaves` from `INFO replication`.
async fn connected_replicas(conn: &mut ConnectionManager) -> Result<u32, BenchError> {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(conn)
        .await
        .map_err(failed)?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0))
}

/// The Redis rows: one server (`url`) and a cluster (`cluster_urls`), each: fresh, replay and
/// storm at 1, 8 and 32 tasks, idem and the baseline interleaved. When the one server has a
/// replica (`scripts/bench` starts one), the same rows again with `wait_for_replicas(1, 1 s)`
/// against the same scripts followed by the same `WAIT` by hand: what `WAIT` costs is those
/// rows beside the plain "Redis" rows.
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
        let mut manager = client.get_connection_manager().await.map_err(failed)?;
        let replicas = connected_replicas(&mut manager).await?;
        let mut subjects = vec![
            ("Redis", Some(scripts.clone()), None),
            ("Redis vs SET", None, None),
        ];
        if replicas > 0 {
            // The scripts go out by SHA-1 in the pipeline, so the server must know them.
            for script in [&scripts.0, &scripts.1] {
                script
                    .prepare_invoke()
                    .load_async(&mut manager)
                    .await
                    .map_err(failed)?;
            }
            subjects.push((
                "Redis + WAIT 1",
                Some(scripts.clone()),
                Some((1, WAIT_TIMEOUT)),
            ));
        } else {
            eprintln!("Redis: the server at {url} has no replica, so no `wait_for_replicas` rows");
        }
        for (i, (name, scripts, wait)) in subjects.into_iter().enumerate() {
            let mut builder = RedisStore::builder().prefix(format!("bench_idem_{tag}_{i}"));
            if let Some((n, timeout)) = wait {
                builder = builder.wait_for_replicas(n, timeout);
            }
            let store = builder.connect(url).await?;
            // As many connections as the store opens: 1, or 8 with a replica wait.
            let mut conns = vec![Conn::Single(manager.clone())];
            for _ in 1..if wait.is_some() { WAIT_CONNECTIONS } else { 1 } {
                conns.push(Conn::Single(
                    client.get_connection_manager().await.map_err(failed)?,
                ));
            }
            let raw = RawRedis {
                conns: conns.into(),
                next: Default::default(),
                prefix: format!("bench_raw_{tag}_{i}"),
                scripts,
                wait: wait.map(|(n, t)| (n, t.as_millis() as u64)),
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
            conns: vec![conn].into(),
            next: Default::default(),
            prefix: format!("bench_raw_{tag}"),
            scripts: Some(scripts),
            wait: None,
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
