//! [`RedisStore`] and its builder: the store, its connections and its errors.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, ServerErrorKind, Value};

use idem_core::store::support::{check_duration, check_fingerprint};
use idem_core::{
    Abandoned, AbandonedQuery, Claim, ClaimOutcome, ClaimRequest, Completion, Error, Fingerprint,
    Key, OnLapse, Record, RecordState, StepLog, StepRecord, StepState, StepWrite, Store,
    StoreError, StoreErrorKind, StoredResult, Token, UncertainOperation,
};

use crate::scripts::{Lua, Scripts};

/// Records in Redis or Valkey, one server or a Redis Cluster (feature `redis`).
///
/// ```no_run
/// use idem::{Idempotency, RedisStore};
/// # async fn f() -> Result<(), idem::Error> {
/// // One server (or a primary with replicas behind one address):
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// // A Redis Cluster, from any of its nodes:
/// let cluster = RedisStore::builder()
///     .prefix("payments")
///     .connect_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
///     .await?;
/// let engine = Idempotency::new(store);
/// # let _ = (engine, cluster); Ok(()) }
/// ```
///
/// # How records are kept
///
/// Each record is one Redis hash under `<prefix>:{<key in hex>}`. The braces are a hash tag:
/// in a cluster, a record lives in one slot, so every operation on it is served by one node.
/// Every state change is one Lua script, atomic on the server:
///
/// | operation | round trips | what runs on the server |
/// |---|---|---|
/// | `start` (new key, replay, locked, uncertain, tombstone, key reused) | 1 | the claim script: reads the record and, when it is absent or ended, writes the claim |
/// | `complete` | 1 | the fenced completion script (with a `key_retention`, it also writes the response's own key `<record key>:r`, the same slot) |
/// | `abort`, `renew` | 1 | a fenced script each |
/// | `get` | 1 | a read-only script (it needs the server's clock) |
/// | `evict` | 1 | a script deleting the record, its steps and its response |
/// | `begin_steps`, `write_step` | 1 | a script each that checks the record is in progress under the claim's token, then counts the attempt or writes the step in the hash `<record key>:steps` (the same slot); a `write_step` with `on_lapse` sets the record's uncertain flag in the same script |
/// | `take_uncertain` | 1 | a script that takes over the record only while it is uncertain, lapsed and carries the token |
/// | `find_uncertain` | the scan of `list`, then 1 `get` per operation returned | as `list` ([below](#impl-StoreAdmin-for-RedisStore)) |
/// | `prune_expired` | 0 | nothing: Redis deletes ended records (and steps, and tombstones' responses) itself |
/// | [`StoreAdmin`](idem_core::StoreAdmin) `list`, `stats` | about 2 per 1,000 keys of the prefix | `SCAN` on every master, each step's keys read with pipelined `HMGET`s ([below](#impl-StoreAdmin-for-RedisStore)) |
///
/// So a new key costs two round trips (claim, complete) and a replay one; with
/// [`wait_for_replicas`](RedisStoreBuilder::wait_for_replicas) the claim and the completion
/// each carry a `WAIT` in the same round trip. The scripts are sent by their SHA-1
/// (`EVALSHA`); a server that does not know them yet (a restart, a new node) gets them once in
/// full.
///
/// # Time and expiry
///
/// Leases and retention are measured on the server's clock (`TIME` inside the scripts), never
/// the application's. A completed record's key expires (`PEXPIREAT`) when its retention ends,
/// and a running claim's key [`LAPSED_CLAIMS_KEPT`](idem_core::LAPSED_CLAIMS_KEPT) after its lease
/// ends, so Redis deletes ended records by itself and no [`Pruner`](idem_core::Pruner) is needed. A
/// record counts as ended at its lease or retention end, whatever Redis has deleted yet; a
/// claim's owner may still complete it in that time if nobody claimed the key since (as on every
/// store).
///
/// **Past the lease** (`docs/architecture.md`). A claim made with
/// [`OnLapse::Uncertain`] (or set so by a step write) has no expiry at all: once its lease ends
/// it answers [`ClaimOutcome::Uncertain`] and stays until its holder completes or aborts it,
/// [`take_uncertain`](Store::take_uncertain) resolves it, or it is evicted. A completion with a
/// [`key_retention`](Completion::key_retention) keeps its response in a key of its own,
/// `<record key>:r`, that expires when the retention ends, and the record (without the response)
/// expires when the tombstone ends, rounded up to whole seconds; in between a claim answers
/// [`ClaimOutcome::Expired`]. So Redis drops a tombstone's result bytes by itself: a tombstone
/// is the record's hash alone, 216 bytes of `MEMORY USAGE` under the prefix `idem` with a
/// fingerprint (Redis 7.0; `docs/stores.md`). A completion without a `key_retention` keeps its
/// response in the record, as before.
///
/// # What a failover can lose
///
/// Redis replicates asynchronously. A master acknowledges a claim or a completion before any
/// replica has it, and if it fails in that window, the replica that takes over never saw the
/// write: the claim vanishes (another caller may then claim the key and run the work a second
/// time) or the completion vanishes (the record reads as running, or as absent, and a retry
/// runs the work again). This is the one store rule (`docs/architecture.md`, "The store rules")
/// this store keeps only as long as the master lives: **observed commits** hold on the master,
/// not across a failover.
///
/// [`wait_for_replicas(n, timeout)`](RedisStoreBuilder::wait_for_replicas) narrows the window:
/// after each claim and completion the store sends `WAIT n timeout` in the same round trip,
/// and reports the operation as failed ([`StoreErrorKind::Unavailable`]) unless `n` replicas
/// acknowledged it. A claim so refused never runs its work (the key stays held for one lease),
/// and a completion so refused is retried by the engine until it lands. `WAIT` does not make
/// Redis strongly consistent (a replica that acknowledged may still not be the one promoted),
/// but a failover then loses only writes that the store reported as failed, provided the
/// lease outlasts the failover (a completion refused meanwhile is retried while the key stays
/// claimed). A shard whose master failed has no replica until one rejoins, and meanwhile every
/// claim and completion there is refused.
///
/// What it costs: each claim and completion waits for the replica's acknowledgement, so its
/// latency includes a replica round trip, and `WAIT` blocks the connection it is sent on, so
/// the store opens [8 connections](RedisStoreBuilder::connections) when it waits (1 otherwise).
/// On the benchmark's machine (one server and one replica on loopback, `scripts/bench`), new
/// keys ran at 0.48, 0.59 and 0.58 of the throughput without `WAIT` at 1, 8 and 32 tasks; with
/// a single connection it had been 0.47, 0.40 and 0.13. A replay writes nothing, so its `WAIT`
/// returns at once: replays ran at the same speed. `docs/performance.md` has the rows.
///
/// Durability across a restart of the whole server follows its persistence settings (`appendonly
/// yes` with `appendfsync everysec` loses up to a second; without persistence, everything).
///
/// # Errors
///
/// | Redis says | kind |
/// |---|---|
/// | connection refused, dropped or timed out; `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`; fewer replicas than asked for acknowledged | [`Unavailable`](StoreErrorKind::Unavailable) |
/// | `TRYAGAIN`, `MOVED`/`ASK` left after the client's redirects | [`Transient`](StoreErrorKind::Transient) |
/// | `OOM` (maxmemory reached) | [`Full`](StoreErrorKind::Full) |
/// | `READONLY` (a replica) | [`ReadOnly`](StoreErrorKind::ReadOnly) |
/// | a record of the wrong shape | [`Corrupt`](StoreErrorKind::Corrupt) |
/// | anything else | [`Query`](StoreErrorKind::Query) |
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) prefix: String,
    scripts: Scripts,
    wait: Option<(u32, Duration)>,
}

/// Connections to one server or to a cluster. Each multiplexes its callers over one socket per
/// node; calls take the connections in turn (see [`RedisStoreBuilder::connections`]).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(Pool<ConnectionManager>),
    Cluster(Pool<ClusterConnection>),
}

/// A few multiplexed connections, handed out in turn.
#[derive(Clone)]
pub(crate) struct Pool<C> {
    conns: Arc<[C]>,
    next: Arc<AtomicUsize>,
}

impl<C: Clone> Pool<C> {
    fn new(conns: Vec<C>) -> Pool<C> {
        Pool {
            conns: conns.into(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The next connection (the builder never makes an empty pool; `None` if it did).
    pub(crate) fn pick(&self) -> Option<C> {
        let n = match self.conns.len() {
            0 | 1 => 0,
            len => self.next.fetch_add(1, Ordering::Relaxed) % len,
        };
        self.conns.get(n).cloned()
    }
}

pub(crate) fn no_connection() -> RedisError {
    RedisError::from((ErrorKind::Io, "the store has no connection"))
}

impl Conn {
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(p) => {
                cmd.query_async(&mut p.pick().ok_or_else(no_connection)?)
                    .await
            }
            Conn::Cluster(p) => {
                cmd.query_async(&mut p.pick().ok_or_else(no_connection)?)
                    .await
            }
        }
    }

    pub(crate) async fn pipe(&self, pipe: &Pipeline) -> Result<Vec<Value>, RedisError> {
        match self {
            Conn::Single(p) => {
                pipe.query_async(&mut p.pick().ok_or_else(no_connection)?)
                    .await
            }
            Conn::Cluster(p) => {
                pipe.query_async(&mut p.pick().ok_or_else(no_connection)?)
                    .await
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Conn::Single(p) => p.conns.len(),
            Conn::Cluster(p) => p.conns.len(),
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field(
                "kind",
                &match self.inner.conn {
                    Conn::Single(_) => "single",
                    Conn::Cluster(_) => "cluster",
                },
            )
            .field("connections", &self.inner.conn.len())
            .field("prefix", &self.inner.prefix)
            .field("wait", &self.inner.wait)
            .finish()
    }
}

/// Builds a [`RedisStore`]: the key prefix, timeouts and replica acknowledgements, then
/// [`connect`](Self::connect) (one server) or [`connect_cluster`](Self::connect_cluster).
///
/// ```no_run
/// use std::time::Duration;
/// use idem::RedisStore;
/// # async fn f() -> Result<(), idem::Error> {
/// let store = RedisStore::builder()
///     .prefix("orders")
///     .response_timeout(Duration::from_secs(1))
///     .wait_for_replicas(1, Duration::from_millis(50))
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    wait: Option<(u32, Duration)>,
    connections: Option<usize>,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: "idem".to_owned(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            wait: None,
            connections: None,
        }
    }
}

/// Connections opened with [`RedisStoreBuilder::wait_for_replicas`] and no
/// [`connections`](RedisStoreBuilder::connections) given.
const WAIT_CONNECTIONS: usize = 8;

impl RedisStoreBuilder {
    /// The namespace of the store's keys (default `idem`): records live under
    /// `<prefix>:{<key>}`. 1 to 64 characters of ASCII letters, digits and `_ - . :`; two stores
    /// with different prefixes share a server without seeing each other's records.
    ///
    /// ```
    /// let _ = idem::RedisStore::builder().prefix("billing");
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long to wait for a connection to a node (default 2 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let _ = idem::RedisStore::builder().connect_timeout(Duration::from_millis(500));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for a reply before the operation fails as
    /// [`Unavailable`](StoreErrorKind::Unavailable) (default 5 s). Whether a write that timed out
    /// took effect is unknown; the engine treats it so.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let _ = idem::RedisStore::builder().response_timeout(Duration::from_secs(1));
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// After each claim and completion, waits until `replicas` replicas acknowledged it (Redis
    /// `WAIT`, in the same round trip), for at most `timeout`; an operation fewer replicas
    /// acknowledged fails as [`Unavailable`](StoreErrorKind::Unavailable). See
    /// [what a failover can lose](RedisStore#what-a-failover-can-lose).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let _ = idem::RedisStore::builder().wait_for_replicas(1, Duration::from_millis(100));
    /// ```
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = Some((replicas, timeout));
        self
    }

    /// How many connections the store opens (to the server, or to each node of a cluster), 1
    /// to 64; calls take them in turn. Default: 1, or 8 with
    /// [`wait_for_replicas`](Self::wait_for_replicas).
    ///
    /// One multiplexed connection carries every call of the process, and without `WAIT` it is
    /// rarely the limit. `WAIT` blocks the connection it is sent on until the replicas answer,
    /// so every call behind it on that connection waits too: with one connection, the store
    /// does one claim or completion per replica round trip, whatever the number of tasks
    /// (`docs/performance.md` has the figures). More connections let that many waits overlap.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let _ = idem::RedisStore::builder()
    ///     .wait_for_replicas(1, Duration::from_millis(100))
    ///     .connections(16);
    /// ```
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = Some(connections);
        self
    }

    fn connection_count(&self) -> usize {
        self.connections.unwrap_or(if self.wait.is_some() {
            WAIT_CONNECTIONS
        } else {
            1
        })
    }

    fn check(&self) -> Result<(), Error> {
        let ok = |c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c);
        if self.prefix.is_empty() || self.prefix.len() > 64 || !self.prefix.chars().all(ok) {
            return Err(Error::InvalidConfig(format!(
                "Redis key prefix {:?} must be 1 to 64 characters of ASCII letters, digits and \
                 `_ - . :` (braces would change the cluster slot of every record)",
                self.prefix
            )));
        }
        check_duration("the Redis connect timeout", self.connect_timeout)?;
        check_duration("the Redis response timeout", self.response_timeout)?;
        if let Some((replicas, timeout)) = self.wait {
            if replicas == 0 {
                return Err(Error::InvalidConfig(
                    "wait_for_replicas needs at least 1 replica; leave it unset to not wait".into(),
                ));
            }
            check_duration("the Redis replica wait", timeout)?;
        }
        if !(1..=64).contains(&self.connection_count()) {
            return Err(Error::InvalidConfig(format!(
                "a RedisStore opens 1 to 64 connections, not {}",
                self.connection_count()
            )));
        }
        Ok(())
    }

    /// Connects to one server (`redis://[user:password@]host[:port][/db]`, or `rediss://` for
    /// TLS when the `redis` crate is built with it) and loads the scripts. The connection comes
    /// back by itself after the server does; calls in between fail as
    /// [`Unavailable`](StoreErrorKind::Unavailable).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem::Error> {
    /// let store = idem::RedisStore::builder().connect("redis://127.0.0.1:6379").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect(self, url: &str) -> Result<RedisStore, Error> {
        self.check()?;
        let client = redis::Client::open(url).map_err(|e| bad_url(url, e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(2);
        let mut conns = Vec::with_capacity(self.connection_count());
        for _ in 0..self.connection_count() {
            conns.push(
                client
                    .get_connection_manager_with_config(config.clone())
                    .await
                    .map_err(|e| store_error("connect", e))?,
            );
        }
        self.finish(Conn::Single(Pool::new(conns))).await
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port` each); the
    /// client learns the others and follows the slots as they move.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem::Error> {
    /// let store = idem::RedisStore::builder()
    ///     .connect_cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect_cluster<I, S>(self, urls: I) -> Result<RedisStore, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.check()?;
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        if urls.is_empty() {
            return Err(Error::InvalidConfig(
                "connect_cluster needs the URL of at least one cluster node".into(),
            ));
        }
        let client = ClusterClientBuilder::new(urls.iter().map(String::as_str))
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .retries(3)
            .build()
            .map_err(|e| bad_url(&urls.join(","), e))?;
        let mut conns = Vec::with_capacity(self.connection_count());
        for _ in 0..self.connection_count() {
            conns.push(
                client
                    .get_async_connection()
                    .await
                    .map_err(|e| store_error("connect", e))?,
            );
        }
        self.finish(Conn::Cluster(Pool::new(conns))).await
    }

    async fn finish(self, conn: Conn) -> Result<RedisStore, Error> {
        let store = RedisStore {
            inner: Arc::new(Inner {
                conn,
                prefix: self.prefix,
                scripts: Scripts::new(),
                wait: self.wait,
            }),
        };
        // One round trip that proves the server answers (and, in a cluster, every slot has a
        // master): a missing or half-made cluster fails here rather than at the first call.
        let probe = store.inner.key(&Key::from_bytes([0; 32]));
        store
            .inner
            .conn
            .query(redis::cmd("EXISTS").arg(&probe))
            .await
            .map_err(|e| store_error("connect", e))?;
        Ok(store)
    }
}

impl RedisStore {
    /// A builder: prefix `idem`, connect timeout 2 s, response timeout 5 s, no replica wait.
    ///
    /// ```
    /// let _ = idem::RedisStore::builder().prefix("idem");
    /// ```
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// Connects to one server with the defaults; see [`RedisStoreBuilder::connect`].
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem::Error> {
    /// let store = idem::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<RedisStore, Error> {
        Self::builder().connect(url).await
    }

    /// The key prefix.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem::Error> {
    /// let store = idem::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// assert_eq!(store.prefix(), "idem");
    /// # Ok(()) }
    /// ```
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key holding the record of `key`: `<prefix>:{<key in hex>}`.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem::Error> {
    /// let store = idem::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// let key = idem::Key::from_bytes([0xab; 32]);
    /// assert!(store.redis_key(&key).starts_with("idem:{abab"));
    /// # Ok(()) }
    /// ```
    pub fn redis_key(&self, key: &Key) -> String {
        self.inner.key(key)
    }

    /// The Lua scripts this store runs on the server, by name (`claim`, `complete`, `abort`,
    /// `renew`, `get`, `begin_steps`, `write_step`, `evict`): to review them, or to pre-load
    /// them with `SCRIPT LOAD` (the store also sends one in full to a server that does not know
    /// it). Each takes the record's key as `KEYS[1]` (and the steps', for the last three, as
    /// `KEYS[2]`); their arguments are listed in the store's source (idem-redis's `scripts.rs`).
    ///
    /// ```
    /// let scripts = idem::RedisStore::script_sources();
    /// assert!(scripts.iter().any(|(name, source)| *name == "claim" && source.contains("TIME")));
    /// ```
    pub fn script_sources() -> Vec<(&'static str, String)> {
        let s = Scripts::new();
        vec![
            ("claim", s.claim.body),
            ("complete", s.complete.body),
            ("abort", s.abort.body),
            ("renew", s.renew.body),
            ("get", s.get.body),
            ("take_uncertain", s.take_uncertain.body),
            ("begin_steps", s.begin_steps.body),
            ("write_step", s.write_step.body),
            ("evict", s.evict.body),
        ]
    }
}

impl Inner {
    pub(crate) fn key(&self, key: &Key) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(self.prefix.len() + 67);
        out.push_str(&self.prefix);
        out.push_str(":{");
        for b in key.as_bytes() {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        out.push('}');
        out
    }

    /// Runs `lua` on `key` with `args`: by SHA-1, and in full when the server does not know
    /// it yet. With `replicated` and a replica wait configured, a `WAIT` follows in the same
    /// round trip and its answer is checked.
    async fn eval(
        &self,
        op: &'static str,
        lua: &Lua,
        key: &Key,
        args: &[&[u8]],
        replicated: bool,
    ) -> Result<Value, Error> {
        self.eval_keys(op, lua, key, &[], args, replicated).await
    }

    /// [`eval`](Self::eval), with the record's key followed by `suffixes` as `KEYS[2]`, … (the
    /// record's steps, [`STEPS`], or its response, [`RESPONSE`]).
    async fn eval_keys(
        &self,
        op: &'static str,
        lua: &Lua,
        key: &Key,
        suffixes: &[&str],
        args: &[&[u8]],
        replicated: bool,
    ) -> Result<Value, Error> {
        let key = self.key(key);
        // The same hash tag as the record's: one cluster slot, so one script may touch them all.
        let others: Vec<String> = suffixes.iter().map(|s| format!("{key}{s}")).collect();
        let command = |verb: &str, script: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script).arg(1 + others.len()).arg(&key);
            for other in &others {
                cmd.arg(other);
            }
            for a in args {
                cmd.arg(*a);
            }
            cmd
        };
        let wait = self.wait.filter(|_| replicated);
        let run = |cmd: Cmd| async move {
            match wait {
                None => self.conn.query(&cmd).await.map(|v| (v, None)),
                Some((replicas, timeout)) => {
                    let mut pipe = redis::pipe();
                    pipe.add_command(cmd)
                        .cmd("WAIT")
                        .arg(replicas)
                        .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
                    let mut values = self.conn.pipe(&pipe).await?.into_iter();
                    let value = values.next().unwrap_or(Value::Nil);
                    let acked = match values.next() {
                        Some(Value::Int(n)) => n,
                        _ => -1,
                    };
                    Ok((value, Some((replicas, timeout, acked))))
                }
            }
        };
        let (value, waited) = match run(command("EVALSHA", &lua.sha)).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                run(command("EVAL", &lua.body)).await
            }
            other => other,
        }
        .map_err(|e| store_error(op, e))?;
        if let Some((replicas, timeout, acked)) = waited
            && acked < i64::from(replicas)
        {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "Redis {op}: the master applied it, but only {acked} of the {replicas} \
                         replicas asked for acknowledged it within {timeout:?}; a failover now \
                         could lose it"
                ),
            )));
        }
        Ok(value)
    }

    /// A fenced script's answer: 1 done, 0 the claim is lost.
    async fn fenced(
        &self,
        op: &'static str,
        lua: &Lua,
        claim: &Claim,
        args: &[&[u8]],
        replicated: bool,
    ) -> Result<(), Error> {
        match self.eval(op, lua, claim.key(), args, replicated).await? {
            Value::Int(1) => Ok(()),
            Value::Int(0) => Err(Error::LeaseLost),
            other => Err(corrupt(format!("the {op} script answered {other:?}"))),
        }
    }
}

/// What a record's steps hash appends to its key.
pub(crate) const STEPS: &str = ":steps";

/// What the key of a record's response kept apart (a completion with a tombstone) appends to
/// the record's key.
pub(crate) const RESPONSE: &str = ":r";

/// Milliseconds as the scripts take them: rounded up, so a lease is never shorter than asked.
fn millis(d: Duration) -> Vec<u8> {
    let ms = d.as_nanos().div_ceil(1_000_000);
    ms.to_string().into_bytes()
}

pub(crate) fn time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

pub(crate) fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

/// A step from its field's name and its value (`b` or `f`, the position, `:`, the result).
pub(crate) fn step_record(name: &[u8], value: &[u8]) -> Result<StepRecord, Error> {
    let bad = || corrupt(format!("a stored step is {value:?}"));
    let (state, rest) = value.split_first().ok_or_else(bad)?;
    let colon = rest.iter().position(|b| *b == b':').ok_or_else(bad)?;
    let position = std::str::from_utf8(&rest[..colon])
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .ok_or_else(bad)?;
    let result = &rest[colon + 1..];
    let state = match state {
        b'f' => StepState::Finished(result.to_vec()),
        b'b' => StepState::Begun,
        _ => return Err(bad()),
    };
    let name = String::from_utf8(name.to_vec())
        .map_err(|_| corrupt("a stored step name is not UTF-8".into()))?;
    Ok(StepRecord {
        name,
        position,
        state,
    })
}

pub(crate) fn corrupt(why: String) -> Error {
    Error::Store(StoreError::new(StoreErrorKind::Corrupt, why))
}

fn bad_url(url: &str, e: RedisError) -> Error {
    Error::InvalidConfig(format!(
        "cannot use the Redis URL {url:?}: {e} (expected redis://[user:password@]host[:port][/db])"
    ))
}

/// The kind of a Redis failure; see [`RedisStore#errors`].
fn kind_of(e: &RedisError) -> StoreErrorKind {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return StoreErrorKind::Unavailable;
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading,
        )
        | ErrorKind::ClusterConnectionNotFound => StoreErrorKind::Unavailable,
        ErrorKind::Server(
            ServerErrorKind::TryAgain | ServerErrorKind::Moved | ServerErrorKind::Ask,
        ) => StoreErrorKind::Transient,
        ErrorKind::Server(ServerErrorKind::ReadOnly) => StoreErrorKind::ReadOnly,
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreErrorKind::Corrupt,
        _ if e.code() == Some("OOM") => StoreErrorKind::Full,
        _ => StoreErrorKind::Query,
    }
}

pub(crate) fn store_error(op: &'static str, e: RedisError) -> Error {
    Error::Store(StoreError::new(kind_of(&e), RedisFailure { op, source: e }))
}

/// A Redis error with the operation it failed.
#[derive(Debug)]
struct RedisFailure {
    op: &'static str,
    source: RedisError,
}

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redis {} failed: {}", self.op, self.source)
    }
}

impl std::error::Error for RedisFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A stored completion as the scripts return it: expiry, has response, response, is error.
fn cached(v: &[Value]) -> Result<StoredResult, Error> {
    match v {
        [at, has, response, is_error] => {
            let at = int(at).ok_or_else(|| corrupt(format!("expiry {at:?}")))?;
            let response = match int(has) {
                Some(1) => Some(bytes(response).unwrap_or_default().to_vec()),
                _ => None,
            };
            Ok(StoredResult {
                response,
                is_error: matches!(int(is_error), Some(1))
                    || bytes(is_error) == Some(b"1".as_slice()),
                expires_at: time(at),
                not_retained: None,
            })
        }
        _ => Err(corrupt(format!("a completed record answered {v:?}"))),
    }
}

fn token(v: &Value) -> Result<Token, Error> {
    bytes(v)
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .map(Token::from_bytes)
        .ok_or_else(|| corrupt(format!("a stored token is {v:?}, not 16 bytes")))
}

/// The fingerprint stored in a record, as a script returned it (absent: `Nil`).
fn stored_fingerprint(v: &Value) -> Result<Option<Fingerprint>, Error> {
    match bytes(v) {
        Some(b) => Ok(Some(Fingerprint::from_bytes(
            <[u8; 32]>::try_from(b)
                .map_err(|_| corrupt(format!("a stored fingerprint is {} bytes", b.len())))?,
        ))),
        None => Ok(None),
    }
}

/// `d` in whole seconds, rounded up (a tombstone's length as the stores keep it).
fn whole_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[async_trait]
impl Store for RedisStore {
    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        request.check()?;
        let key = request.key;
        let token = Token::random();
        let token_bytes = token.to_bytes();
        let fp: &[u8] = request.fingerprint.map_or(&[], |f| f.as_bytes());
        let lease_ms = millis(request.lease);
        let uncertain: &[u8] = match request.on_lapse {
            OnLapse::Uncertain => b"1",
            _ => b"0",
        };
        let inner = &self.inner;
        let answer = inner
            .eval_keys(
                "claim",
                &inner.scripts.claim,
                key,
                &[RESPONSE],
                &[&token_bytes, &lease_ms, fp, uncertain],
                true,
            )
            .await?;
        let Value::Array(parts) = answer else {
            return Err(corrupt(format!("the claim script answered {answer:?}")));
        };
        let at = |rest: &[Value]| {
            rest.first()
                .and_then(int)
                .map(time)
                .ok_or_else(|| corrupt(format!("the claim script answered {parts:?}")))
        };
        match parts.split_first() {
            Some((tag, rest)) => match bytes(tag) {
                Some(b"started") => Ok(ClaimOutcome::Claimed(Claim::new(*key, token))),
                Some(b"locked") => {
                    let left = rest.first().and_then(int).unwrap_or(0);
                    Ok(ClaimOutcome::Locked {
                        retry_after: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
                    })
                }
                Some(b"reused") => {
                    let stored = rest.first().map(stored_fingerprint).transpose()?.flatten();
                    check_fingerprint(stored.as_ref(), request.fingerprint)?;
                    Err(corrupt(format!(
                        "the claim script found another request's fingerprint, but {stored:?} \
                         is of the same request as {:?}",
                        request.fingerprint
                    )))
                }
                Some(b"uncertain") => Ok(ClaimOutcome::Uncertain { since: at(rest)? }),
                Some(b"expired") => Ok(ClaimOutcome::Expired { since: at(rest)? }),
                Some(b"done") => Ok(ClaimOutcome::Completed(cached(rest)?)),
                _ => Err(corrupt(format!("the claim script answered {parts:?}"))),
            },
            None => Err(corrupt("the claim script answered nothing".into())),
        }
    }

    async fn complete(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error> {
        completion.check()?;
        let token = claim.token().to_bytes();
        let retention = millis(completion.retention);
        let (has, response): (&[u8], &[u8]) = match completion.response {
            Some(r) => (b"1", r),
            None => (b"0", b""),
        };
        let is_error: &[u8] = if completion.is_error { b"1" } else { b"0" };
        let kept = whole_secs(completion.key_retention).to_string();
        let inner = &self.inner;
        match inner
            .eval_keys(
                "complete",
                &inner.scripts.complete,
                claim.key(),
                &[RESPONSE],
                &[&token, &retention, has, response, is_error, kept.as_bytes()],
                true,
            )
            .await?
        {
            Value::Int(1) => Ok(()),
            Value::Int(0) => Err(Error::LeaseLost),
            other => Err(corrupt(format!("the complete script answered {other:?}"))),
        }
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        let token = claim.token().to_bytes();
        let inner = &self.inner;
        inner
            .fenced("abort", &inner.scripts.abort, claim, &[&token], false)
            .await
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        check_duration("lease", lease)?;
        let token = claim.token().to_bytes();
        let lease = millis(lease);
        let inner = &self.inner;
        inner
            .fenced(
                "renew",
                &inner.scripts.renew,
                claim,
                &[&token, &lease],
                false,
            )
            .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let inner = &self.inner;
        let answer = inner
            .eval_keys("get", &inner.scripts.get, key, &[RESPONSE], &[], false)
            .await?;
        let Value::Array(parts) = answer else {
            return Err(corrupt(format!("the get script answered {answer:?}")));
        };
        let [state, tok, at, fp, response, is_error] = parts.as_slice() else {
            if parts.is_empty() {
                return Ok(None);
            }
            return Err(corrupt(format!("the get script answered {parts:?}")));
        };
        let at = time(int(at).ok_or_else(|| corrupt(format!("expiry {at:?}")))?);
        let fingerprint = stored_fingerprint(fp)?;
        let state = match bytes(state) {
            Some(b"p") => RecordState::InProgress {
                token: token(tok)?,
                lease_until: at,
            },
            Some(b"u") => RecordState::Uncertain {
                token: token(tok)?,
                since: at,
            },
            Some(b"c") => RecordState::Completed(StoredResult {
                response: bytes(response).map(<[u8]>::to_vec),
                is_error: bytes(is_error) == Some(b"1".as_slice()),
                expires_at: at,
                not_retained: None,
            }),
            Some(b"x") => RecordState::Expired { since: at },
            _ => return Err(corrupt(format!("a stored state is {state:?}"))),
        };
        Ok(Some(Record::new(*key, fingerprint, state)))
    }

    async fn evict(&self, key: &Key) -> Result<bool, Error> {
        let inner = &self.inner;
        let deleted = inner
            .eval_keys(
                "evict",
                &inner.scripts.evict,
                key,
                &[STEPS, RESPONSE],
                &[],
                false,
            )
            .await?;
        Ok(int(&deleted).unwrap_or(0) > 0)
    }

    async fn take_uncertain(
        &self,
        key: &Key,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, Error> {
        check_duration("lease", lease)?;
        let new = Token::random();
        let inner = &self.inner;
        let answer = inner
            .eval(
                "take_uncertain",
                &inner.scripts.take_uncertain,
                key,
                &[&token.to_bytes(), &new.to_bytes(), &millis(lease)],
                true,
            )
            .await?;
        match answer {
            Value::Int(1) => Ok(Claim::new(*key, new)),
            Value::Int(0) => Err(Error::NotUncertain { operation: *key }),
            other => Err(corrupt(format!(
                "the take_uncertain script answered {other:?}"
            ))),
        }
    }

    async fn find_uncertain(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<UncertainOperation>, Error> {
        self.uncertain_page(query).await
    }

    async fn find_abandoned(&self, query: AbandonedQuery<'_>) -> Result<Vec<Abandoned>, Error> {
        self.inner.find_abandoned(query).await
    }

    async fn begin_steps(&self, claim: &Claim, retention: Duration) -> Result<StepLog, Error> {
        check_duration("retention", retention)?;
        let token = claim.token().to_bytes();
        let retention = millis(retention);
        let inner = &self.inner;
        let answer = inner
            .eval_keys(
                "begin_steps",
                &inner.scripts.begin_steps,
                claim.key(),
                &[STEPS],
                &[&token, &retention],
                false,
            )
            .await?;
        let parts = match answer {
            Value::Int(0) => return Err(Error::LeaseLost),
            Value::Array(parts) => parts,
            other => {
                return Err(corrupt(format!(
                    "the begin_steps script answered {other:?}"
                )))
            }
        };
        let (Some(attempt), Some(Value::Array(fields))) =
            (parts.first().and_then(int), parts.get(1))
        else {
            return Err(corrupt(format!(
                "the begin_steps script answered {parts:?}"
            )));
        };
        let mut steps = Vec::new();
        for pair in fields.chunks(2) {
            let (Some(field), Some(value)) =
                (pair.first().and_then(bytes), pair.get(1).and_then(bytes))
            else {
                return Err(corrupt(format!("a steps hash holds {pair:?}")));
            };
            if let Some(name) = field.strip_prefix(b"s:") {
                steps.push(step_record(name, value)?);
            }
        }
        steps.sort_by_key(|s| s.position);
        let attempt = u32::try_from(attempt)
            .map_err(|_| corrupt(format!("a steps hash counts {attempt} attempts")))?;
        Ok(StepLog { attempt, steps })
    }

    /// One script, fenced by the claim: the step, and with `on_lapse` the record's uncertain
    /// flag and its expiry (none while uncertain).
    async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
        step.check()?;
        let token = claim.token().to_bytes();
        let retention = millis(step.retention);
        let position = step.position.to_string();
        let (finished, result): (&[u8], &[u8]) = match step.result {
            Some(result) => (b"1", result),
            None => (b"0", b""),
        };
        let on_lapse: &[u8] = match step.on_lapse {
            None => b"",
            Some(OnLapse::Uncertain) => b"u",
            Some(_) => b"r",
        };
        let inner = &self.inner;
        let args: [&[u8]; 7] = [
            &token,
            &retention,
            step.name.as_bytes(),
            position.as_bytes(),
            finished,
            result,
            on_lapse,
        ];
        match inner
            .eval_keys(
                "write_step",
                &inner.scripts.write_step,
                claim.key(),
                &[STEPS],
                &args,
                true,
            )
            .await?
        {
            Value::Int(1) => Ok(()),
            Value::Int(0) => Err(Error::LeaseLost),
            other => Err(corrupt(format!("the write_step script answered {other:?}"))),
        }
    }

    /// Redis deletes ended records itself (key expiry), and a tombstone's response with its
    /// own key's expiry: nothing to do, 0.
    async fn prune_expired(&self, _limit: u32) -> Result<u64, Error> {
        Ok(0)
    }
}
