//! `--versus-diom PATH`: idem-server beside Diom (svix's idempotency server, whose HTTP protocol
//! idem-server speaks), both driven by the same client, at equal durability. See
//! docs/performance.md, "Side by side with Diom".
//!
//! Both servers run as processes on loopback, each in a throwaway directory, in two pairings:
//!
//! - **PostgreSQL, both fsync**: idem-server over PostgreSQL (which must fsync its commits:
//!   `fsync` and `synchronous_commit` on, checked) against Diom's default (its raft log fsynced
//!   before a write is acknowledged, `cluster.log_sync_mode = "sync"`);
//! - **SQLite, neither fsyncs**: idem-server over SQLite with `synchronous=normal` (WAL; no
//!   fsync per commit, only at checkpoints: idem's SQLite store takes no `off`) against Diom's
//!   buffer mode (`sync_mode` and `cluster.log_sync_mode` `"buffer"`, the log flushed to the OS
//!   on every commit, as Diom's own `config.bench.toml`).
//!
//! The client: N HTTP/1.1 keep-alive connections opened before each slice (hyper, one request in
//! flight per connection), MessagePack bodies as Diom's clients send them, the admin token as a
//! bearer. Workloads: a new key (`start`, then `complete`: two requests, one operation) and a
//! replay (`start` of a key completed earlier, answered `completed`). Each row runs its slices
//! interleaved, idem-server then Diom, then Diom then idem-server, and so on; CPU per operation is
//! the server process's utime + stime over its slices (`/proc/PID/stat`; for idem-server over
//! PostgreSQL, the cluster's processes beside it), RSS its `VmRSS` after its last slice.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{header, Request};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

use crate::cpu::{self, Cpu};
use crate::BenchError;

/// The admin token of both servers (Diom wants 20 characters or more, idem-server 16).
const TOKEN: &str = "versus-admin-token-0123456789";
const LOCK_PERIOD_MS: u64 = 30_000;
const TTL_MS: u64 = 86_400_000;
/// The stored response: a small JSON answer, as an API would keep.
const RESPONSE: &[u8] = br#"{"id":"ch_0123456789","status":"succeeded"}"#;
/// A request that takes longer than this stops the run.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to answer its first request (Diom initialises its cluster).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The connection counts of the rows.
const CONNECTIONS: [usize; 4] = [1, 8, 32, 128];
/// idem-server's PostgreSQL pool: the benchmark's usual 32 (idem-bench's `PG_POOL`).
const PG_POOL: u32 = 32;

/// What `--versus-diom` was given.
pub(crate) struct Versus {
    pub diom: PathBuf,
    /// The idem-server binary; by default the one beside idem-bench (the same target dir).
    pub idem_server: Option<PathBuf>,
    pub quick: bool,
    pub pg_url: Option<String>,
    pub sqlite: bool,
    pub postgres: bool,
}

struct Plan {
    warmup: Duration,
    slice: Duration,
    rounds: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                warmup: Duration::from_secs(1),
                slice: Duration::from_secs(1),
                rounds: 2,
            }
        } else {
            Plan {
                warmup: Duration::from_secs(3),
                slice: Duration::from_secs(3),
                rounds: 5,
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    NewKey,
    Replay,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::NewKey => "new key (start + complete)",
            Workload::Replay => "replay (start)",
        }
    }
}

/// A server process, killed (by its own PID) and reaped when dropped.
struct Process {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Process {
    fn spawn(
        mut command: Command,
        name: &'static str,
        bin: &Path,
        log: PathBuf,
    ) -> Result<Process, BenchError> {
        let out = File::create(&log)?;
        command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = command.spawn().map_err(|e| {
            BenchError::Usage(format!("cannot run {name} at {}: {e}", bin.display()))
        })?;
        Ok(Process { child, name, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An error naming why the server is not usable, with its exit status (if it exited) and
    /// the end of its log.
    fn failure(&mut self, what: &str) -> BenchError {
        let exited = match self.child.try_wait() {
            Ok(Some(status)) => format!(" (it exited: {status})"),
            _ => String::new(),
        };
        let log = self.log_text();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let tail = if tail.is_empty() {
            "(empty)".to_owned()
        } else {
            tail.join("\n")
        };
        BenchError::Server(format!(
            "{} {what}{exited}; the end of its log ({}):\n{tail}",
            self.name,
            self.log.display(),
        ))
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running server: its process, address and throwaway directory (removed after the process
/// is gone: fields drop in order).
struct Server {
    process: Process,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Server {
    fn name(&self) -> &'static str {
        self.process.name
    }

    /// The server of `process` at `addr`, once it answers.
    async fn ready(
        process: Process,
        addr: SocketAddr,
        dir: tempfile::TempDir,
        since: Instant,
    ) -> Result<Server, BenchError> {
        let mut server = Server {
            process,
            addr,
            _dir: dir,
        };
        server.wait_ready(since).await?;
        Ok(server)
    }

    /// Waits until a `start` is answered (any of Diom's answers), or fails with the log.
    async fn wait_ready(&mut self, since: Instant) -> Result<(), BenchError> {
        let body = start_body("versus-ready")?;
        loop {
            if self.process.exited() {
                return Err(self.process.failure("stopped before it answered"));
            }
            if let Ok(mut conn) = connect(self.addr).await
                && let Ok(answer) = post(&mut conn, "start", body.clone()).await
                && answer.ok
            {
                return Ok(());
            }
            if since.elapsed() > START_TIMEOUT {
                return Err(self.process.failure(&format!(
                    "did not answer a start on {} within {} s",
                    self.addr,
                    START_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `command` without the caller's variables that start with `prefix` (a server's settings).
fn without_vars(command: &mut Command, prefix: &str) {
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with(prefix) {
            command.env_remove(var);
        }
    }
}

/// idem-server on `store` (a store URL), listening on a port of its choosing, read from its
/// JSON log line.
async fn start_idem(bin: &Path, store: &str, extra: &[String]) -> Result<Server, BenchError> {
    let since = Instant::now();
    let dir = tempfile::tempdir()?;
    let mut command = Command::new(bin);
    command
        .current_dir(dir.path())
        .args(["--listen", "127.0.0.1:0", "--store", store])
        .args(["--admin-token", TOKEN, "--log-json"])
        .args(extra);
    without_vars(&mut command, "IDEM_");
    let log = dir.path().join("idem-server.log");
    let mut process = Process::spawn(command, "idem-server", bin, log)?;
    let addr = loop {
        if let Some(addr) = listen_address(&process.log_text()) {
            break addr;
        }
        if process.exited() {
            return Err(process.failure("stopped before it listened"));
        }
        if since.elapsed() > START_TIMEOUT {
            return Err(process.failure("never logged its address"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Server::ready(process, addr, dir, since).await
}

/// The address of idem-server's "idem-server listening" line (`--log-json`).
fn listen_address(log: &str) -> Option<SocketAddr> {
    log.lines().find_map(|line| {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        value.get("fields")?.get("listen")?.as_str()?.parse().ok()
    })
}

/// Diom's durability settings.
#[derive(Clone, Copy)]
enum DiomMode {
    /// Its defaults: the raft log fsynced (`cluster.log_sync_mode = "sync"`, grouped by its
    /// interval timer) before a write is acknowledged.
    Default,
    /// Nothing fsynced: `sync_mode` and `cluster.log_sync_mode` `"buffer"`, the log flushed to
    /// the OS on every commit (`log_sync_interval_commits = 1`), as Diom's `config.bench.toml`.
    Buffer,
}

/// Diom from `bin`, on free loopback ports, its databases in a throwaway directory, configured
/// by a TOML file there (and none of the caller's `DIOM_*` variables or `.env`). A section given
/// in the file must have all its fields: the databases' `filename` and `cache_size` are Diom's
/// defaults.
async fn start_diom(bin: &Path, mode: DiomMode) -> Result<Server, BenchError> {
    let since = Instant::now();
    let dir = tempfile::tempdir()?;
    let (port, cluster_port) = (free_port()?, free_port()?);
    let db = dir.path().join("db");
    let db = toml_string(&db.to_string_lossy());
    let (top, cluster) = match mode {
        DiomMode::Default => ("", ""),
        DiomMode::Buffer => (
            "sync_mode = \"buffer\"\n",
            "log_sync_mode = \"buffer\"\nlog_sync_interval_commits = 1\n",
        ),
    };
    let config = format!(
        "admin_token = \"{TOKEN}\"\n\
         listen_address = \"127.0.0.1:{port}\"\n\
         log_level = \"info\"\n\
         {top}\n\
         [cluster]\n\
         listen_address = \"127.0.0.1:{cluster_port}\"\n\
         advertised_address = \"127.0.0.1:{cluster_port}\"\n\
         {cluster}\n\
         [persistent_db]\n\
         path = {db}\n\
         filename = \"fjall_persistent\"\n\
         cache_size = \"20%\"\n\n\
         [ephemeral_db]\n\
         path = {db}\n\
         filename = \"fjall_ephemeral\"\n\
         cache_size = \"20%\"\n"
    );
    let config_path = dir.path().join("diom.toml");
    std::fs::write(&config_path, config)?;
    let mut command = Command::new(bin);
    command
        .current_dir(dir.path())
        .arg("--config-path")
        .arg(&config_path)
        .arg("server")
        // Its start-up errors in a few lines, not a backtrace.
        .env("RUST_BACKTRACE", "0");
    without_vars(&mut command, "DIOM_");
    let log = dir.path().join("diom.log");
    let process = Process::spawn(command, "Diom", bin, log)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    Server::ready(process, addr, dir, since).await
}

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A loopback port nothing listens on now (the OS's choice; another process could take it
/// before Diom binds it, which Diom's start then reports).
fn free_port() -> Result<u16, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

// The bodies as Diom's clients send them. idem-wire's `StartIn` and `CompleteIn` would add the
// fenced extension's fields (`fenced`, `absent`, `is_error`, `observed`), which Diom's clients
// never send.
#[derive(Serialize)]
struct Start<'a> {
    key: &'a str,
    lock_period_ms: u64,
}

#[derive(Serialize)]
struct Complete<'a> {
    key: &'a str,
    #[serde(with = "serde_bytes")]
    response: &'a [u8],
    ttl_ms: u64,
}

/// The part of a `start` answer the client reads.
#[derive(Deserialize)]
struct Started {
    status: String,
}

fn msgpack<T: Serialize>(value: &T) -> Result<Bytes, BenchError> {
    rmp_serde::to_vec_named(value)
        .map(Bytes::from)
        .map_err(|e| BenchError::Unexpected(format!("encoding a body: {e}")))
}

fn start_body(key: &str) -> Result<Bytes, BenchError> {
    msgpack(&Start {
        key,
        lock_period_ms: LOCK_PERIOD_MS,
    })
}

type Conn = SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Conn, BenchError> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| BenchError::Unexpected(format!("HTTP handshake with {addr}: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

struct Answer {
    ok: bool,
    status: hyper::StatusCode,
    body: Bytes,
}

/// One request on `conn`, bounded by [`REQUEST_TIMEOUT`].
async fn post(conn: &mut Conn, route: &str, body: Bytes) -> Result<Answer, BenchError> {
    let http = |e: hyper::Error| BenchError::Unexpected(format!("{route}: {e}"));
    let request = Request::post(format!("/api/v1.idempotency.{route}"))
        .header(header::HOST, "127.0.0.1")
        .header(header::CONTENT_TYPE, "application/msgpack")
        .header(header::ACCEPT, "application/msgpack")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Full::new(body))
        .map_err(|e| BenchError::Unexpected(format!("{route}: {e}")))?;
    let exchange = async {
        conn.ready().await.map_err(http)?;
        let response = conn.send_request(request).await.map_err(http)?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(http)?;
        Ok::<_, BenchError>(Answer {
            ok: status.is_success(),
            status,
            body: body.to_bytes(),
        })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| BenchError::Unexpected(format!("{route}: no answer within 30 s")))?
}

/// `start` on `conn`, whose answer must have `status` `want`.
async fn start(conn: &mut Conn, key: &str, want: &str) -> Result<(), BenchError> {
    let answer = post(conn, "start", start_body(key)?).await?;
    let status = answer
        .ok
        .then(|| rmp_serde::from_slice::<Started>(&answer.body).ok())
        .flatten();
    match status {
        Some(s) if s.status == want => Ok(()),
        _ => Err(unexpected("start", key, want, &answer)),
    }
}

fn unexpected(route: &str, key: &str, want: &str, answer: &Answer) -> BenchError {
    let body = String::from_utf8_lossy(&answer.body);
    let body: String = body.chars().take(300).collect();
    BenchError::Unexpected(format!(
        "{route} of {key}: wanted {want}, got {} {body:?}",
        answer.status
    ))
}

/// One timed operation of `workload` on `conn`.
async fn operation(conn: &mut Conn, workload: Workload, key: &str) -> Result<(), BenchError> {
    match workload {
        Workload::NewKey => {
            start(conn, key, "started").await?;
            let body = msgpack(&Complete {
                key,
                response: RESPONSE,
                ttl_ms: TTL_MS,
            })?;
            let answer = post(conn, "complete", body).await?;
            if !answer.ok {
                return Err(unexpected("complete", key, "2xx", &answer));
            }
            Ok(())
        }
        Workload::Replay => start(conn, key, "completed").await,
    }
}

/// What one slice (one server, one row) measured.
#[derive(Default)]
struct Tally {
    slices: usize,
    ops: u64,
    elapsed: Duration,
    /// Latencies in µs.
    latencies: Vec<u32>,
    cpu: Option<Duration>,
    /// The PostgreSQL cluster's CPU, for idem-server over PostgreSQL.
    store_cpu: Option<Duration>,
    rss_kib: Option<u64>,
}

impl Tally {
    /// Adds a slice's figures; a CPU figure missing from any slice is missing from the sum.
    fn add(&mut self, other: Tally) {
        let first = self.slices == 0;
        let sum = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (None, b) if first => b,
            _ => None,
        };
        self.cpu = sum(self.cpu, other.cpu);
        self.store_cpu = sum(self.store_cpu, other.store_cpu);
        self.slices += 1;
        self.ops += other.ops;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
        self.rss_kib = other.rss_kib;
    }

    fn per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn percentile(&mut self, p: usize) -> Option<u32> {
        self.latencies.sort_unstable();
        let n = self.latencies.len();
        (n > 0).then(|| self.latencies[(n * p / 100).min(n - 1)])
    }

    /// CPU per operation in µs.
    fn per_op(&self, cpu: Option<Duration>) -> Option<f64> {
        Some(cpu?.as_secs_f64() * 1e6 / self.ops.max(1) as f64)
    }
}

/// The completed keys of a server, from which replays draw.
#[derive(Default)]
struct Keys {
    done: Vec<String>,
    slices: u64,
}

/// Runs `workload` on `server` over `conns` fresh keep-alive connections for `length`.
async fn slice(
    server: &Server,
    keys: &mut Keys,
    workload: Workload,
    conns: usize,
    length: Duration,
    store_cpu: Option<Cpu>,
) -> Result<Tally, BenchError> {
    let mut senders = Vec::with_capacity(conns);
    for _ in 0..conns {
        senders.push(connect(server.addr).await?);
    }
    keys.slices += 1;
    let tag = format!("v{}", keys.slices);
    let replays = Arc::new(std::mem::take(&mut keys.done));
    if workload == Workload::Replay && replays.is_empty() {
        return Err(BenchError::Unexpected("no completed key to replay".into()));
    }
    let pid = server.process.pid();
    let (cpu_before, store_before) = (cpu::process_cpu(pid), store_cpu.map(|c| c.read()));
    let began = Instant::now();
    let deadline = began + length;
    let tasks: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| {
            let (tag, replays) = (tag.clone(), replays.clone());
            tokio::spawn(async move {
                let mut took = Vec::new();
                let mut made = Vec::new();
                while Instant::now() < deadline {
                    let key = match workload {
                        Workload::NewKey => format!("{tag}-{c}-{}", took.len()),
                        Workload::Replay => replays[fastrand::usize(..replays.len())].clone(),
                    };
                    let at = Instant::now();
                    operation(&mut conn, workload, &key).await?;
                    took.push(u32::try_from(at.elapsed().as_micros()).unwrap_or(u32::MAX));
                    if workload == Workload::NewKey {
                        made.push(key);
                    }
                }
                Ok::<_, BenchError>((took, made))
            })
        })
        .collect();
    let mut tally = Tally::default();
    let mut failed = None;
    let mut made_all = Vec::new();
    for task in tasks {
        match task.await? {
            Ok((took, made)) => {
                tally.latencies.extend(took);
                made_all.extend(made);
            }
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    tally.elapsed = began.elapsed();
    let (cpu_after, store_after) = (cpu::process_cpu(pid), store_cpu.map(|c| c.read()));
    keys.done = Arc::try_unwrap(replays).unwrap_or_else(|shared| shared.as_ref().clone());
    keys.done.extend(made_all);
    if let Some(e) = failed {
        return Err(BenchError::Unexpected(format!("{}: {e}", server.name())));
    }
    tally.ops = tally.latencies.len() as u64;
    tally.cpu = cpu_before
        .zip(cpu_after)
        .map(|(before, after)| after.saturating_sub(before));
    tally.store_cpu = store_before
        .zip(store_after)
        .and_then(|(before, after)| before.until(&after).1);
    tally.rss_kib = cpu::rss_kib(pid);
    // Each slice on its own line, so a server that slows down through a run shows it.
    eprintln!(
        "    slice: {} {} at {conns}: {:.0}/s, {} of a core, {} keys held",
        server.name(),
        workload.name(),
        tally.per_second(),
        tally.cpu.map_or_else(
            || "CPU unknown".to_owned(),
            |cpu| format!("{:.0} %", 100.0 * cpu.as_secs_f64() / length.as_secs_f64())
        ),
        keys.done.len()
    );
    Ok(tally)
}

/// One pairing: what its rows are called and how its two servers start.
struct Pairing<'a> {
    label: &'static str,
    idem_bin: &'a Path,
    diom_bin: &'a Path,
    store: Backing<'a>,
    /// Where the PostgreSQL cluster's CPU is read, when it runs on this machine.
    store_cpu: Option<Cpu>,
}

/// What idem-server stores into, and how Diom runs beside it.
enum Backing<'a> {
    /// The cluster at `url` (a table of its own per start, dropped after), against Diom's
    /// default.
    Postgres {
        url: &'a str,
        pool: &'a sqlx::PgPool,
    },
    /// A SQLite file in a throwaway directory, against Diom's buffer mode.
    Sqlite,
}

/// A pairing's two servers, started afresh, and what to remove once they are stopped.
struct Pair {
    idem: Server,
    diom: Server,
    table: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Pairing<'_> {
    /// Both servers, each on a store of its own that nothing has written yet.
    async fn start(&self) -> Result<Pair, BenchError> {
        match &self.store {
            Backing::Postgres { url, .. } => {
                let table = format!("idem_versus_{:08x}", fastrand::u32(..));
                let extra = [
                    "--table".to_owned(),
                    table.clone(),
                    "--max-connections".to_owned(),
                    PG_POOL.to_string(),
                ];
                let idem = start_idem(self.idem_bin, url, &extra).await?;
                let diom = start_diom(self.diom_bin, DiomMode::Default).await?;
                Ok(Pair {
                    idem,
                    diom,
                    table: Some(table),
                    _dir: None,
                })
            }
            Backing::Sqlite => {
                let dir = tempfile::tempdir()?;
                let db = dir.path().join("idem.db");
                let url = format!("sqlite://{}?mode=rwc&synchronous=normal", db.display());
                let idem = start_idem(self.idem_bin, &url, &[]).await?;
                let diom = start_diom(self.diom_bin, DiomMode::Buffer).await?;
                Ok(Pair {
                    idem,
                    diom,
                    table: None,
                    _dir: Some(dir),
                })
            }
        }
    }

    /// Stops both servers and drops idem-server's table.
    async fn stop(&self, pair: Pair) -> Result<(), BenchError> {
        let Pair {
            idem,
            diom,
            table,
            _dir,
        } = pair;
        drop((idem, diom));
        if let (Backing::Postgres { pool, .. }, Some(table)) = (&self.store, table) {
            sqlx::query(&format!(
                "DROP TABLE IF EXISTS \"{table}\", \"{table}_steps\", \"{table}_migrations\""
            ))
            .execute(*pool)
            .await?;
        }
        Ok(())
    }
}

/// One row of the table.
struct Row {
    pairing: &'static str,
    workload: Workload,
    conns: usize,
    idem: Tally,
    diom: Tally,
}

/// Runs the rows of one pairing, interleaving the two servers. Each row starts both afresh
/// (new data directories, a new table), warms them up and then takes its slices: Diom's
/// throughput falls as its raft log grows through a run (its default snapshots, which purge
/// the log, come after 15 minutes), so a row measured after earlier rows would meet a Diom
/// slowed by them. Fresh servers per row are the conditions most favourable to both.
async fn run_pairing(pairing: &Pairing<'_>, plan: &Plan) -> Result<Vec<Row>, BenchError> {
    let mut rows = Vec::new();
    for conns in CONNECTIONS {
        for workload in [Workload::NewKey, Workload::Replay] {
            let pair = pairing.start().await?;
            let row = run_row(pairing, &pair, plan, conns, workload).await;
            pairing.stop(pair).await?;
            let (idem, diom) = row?;
            eprintln!(
                "  {} {} at {conns}: idem-server {:.0}/s, Diom {:.0}/s",
                pairing.label,
                workload.name(),
                idem.per_second(),
                diom.per_second()
            );
            rows.push(Row {
                pairing: pairing.label,
                workload,
                conns,
                idem,
                diom,
            });
        }
    }
    Ok(rows)
}

/// One row on freshly started servers: both warmed up (new keys, which replays then draw
/// from), then the row's slices, interleaved.
async fn run_row(
    pairing: &Pairing<'_>,
    pair: &Pair,
    plan: &Plan,
    conns: usize,
    workload: Workload,
) -> Result<(Tally, Tally), BenchError> {
    let (mut idem_keys, mut diom_keys) = (Keys::default(), Keys::default());
    for (server, keys) in [(&pair.idem, &mut idem_keys), (&pair.diom, &mut diom_keys)] {
        slice(server, keys, Workload::NewKey, 8, plan.warmup, None).await?;
        slice(server, keys, Workload::Replay, 8, plan.warmup / 2, None).await?;
    }
    let (mut idem, mut diom) = (Tally::default(), Tally::default());
    for round in 0..plan.rounds {
        for idem_first in [round % 2 == 0, round % 2 == 1] {
            if idem_first {
                let t = slice(
                    &pair.idem,
                    &mut idem_keys,
                    workload,
                    conns,
                    plan.slice,
                    pairing.store_cpu,
                )
                .await?;
                idem.add(t);
            } else {
                let t = slice(
                    &pair.diom,
                    &mut diom_keys,
                    workload,
                    conns,
                    plan.slice,
                    None,
                )
                .await?;
                diom.add(t);
            }
        }
    }
    Ok((idem, diom))
}

/// The version line a binary prints for `--version`, or "unknown".
fn version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Fails unless the cluster at `url` fsyncs its commits, and says where its CPU is read.
async fn checked_postgres(url: &str) -> Result<(sqlx::PgPool, Option<Cpu>, String), BenchError> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await?;
    let show = |name: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(&format!("SHOW {name}"))
                .fetch_one(&pool)
                .await
        }
    };
    let (fsync, commit) = (show("fsync").await?, show("synchronous_commit").await?);
    if fsync != "on" || commit == "off" {
        return Err(BenchError::Usage(format!(
            "the PostgreSQL rows compare with Diom's fsyncing default, but this cluster has \
             fsync={fsync}, synchronous_commit={commit}: give a cluster that fsyncs its commits \
             (scripts/bench --versus-diom starts one), or --stores sqlite"
        )));
    }
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await?;
    let postmaster = u32::try_from(backend).ok().and_then(cpu::postmaster_of);
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await?;
    let about = format!("PostgreSQL {version}, fsync={fsync}, synchronous_commit={commit}");
    Ok((
        pool,
        postmaster.map(|p| Cpu {
            postmaster: Some(p),
        }),
        about,
    ))
}

/// The idem-server binary: the one given, or the one beside this program.
fn idem_binary(given: Option<&Path>) -> Result<PathBuf, BenchError> {
    let path = match given {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()?.with_file_name("idem-server"),
    };
    if !path.is_file() {
        return Err(BenchError::Usage(format!(
            "no idem-server binary at {}: build it (cargo build --release -p idem-server) or \
             pass --idem-server PATH",
            path.display()
        )));
    }
    Ok(path)
}

/// The whole run: the pairings asked for, in turn; returns the report (markdown).
pub(crate) async fn run(versus: Versus) -> Result<String, BenchError> {
    if !versus.diom.is_file() {
        return Err(BenchError::Usage(format!(
            "--versus-diom {}: no such file (build Diom as docs/performance.md, \"Side by side \
             with Diom\", says, and give the path of its diom-server binary)",
            versus.diom.display()
        )));
    }
    let idem_bin = idem_binary(versus.idem_server.as_deref())?;
    let plan = Plan::new(versus.quick);
    let load_before = load_average();
    let began = Instant::now();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    if versus.postgres {
        let url = versus.pg_url.as_deref().ok_or_else(|| {
            BenchError::Usage(
                "no PostgreSQL URL: pass --pg-url, set IDEM_TEST_PG_URL, run scripts/bench \
                 --versus-diom, or --stores sqlite"
                    .into(),
            )
        })?;
        let (pool, store_cpu, about) = checked_postgres(url).await?;
        eprintln!("PostgreSQL ({about}) against Diom's default");
        let pairing = Pairing {
            label: "PostgreSQL / Diom default",
            idem_bin: &idem_bin,
            diom_bin: &versus.diom,
            store: Backing::Postgres { url, pool: &pool },
            store_cpu,
        };
        rows.extend(run_pairing(&pairing, &plan).await?);
        notes.push(format!(
            "- PostgreSQL / Diom default (both fsync before acknowledging): idem-server over {about} \
             (pool of {PG_POOL}), against Diom's defaults (raft log `log_sync_mode = \"sync\"`, \
             fsyncs grouped by its interval timer); idem-server's CPU column adds the cluster's \
             processes{}",
            if store_cpu.is_some() {
                ""
            } else {
                " (not visible here: left out)"
            }
        ));
    }
    if versus.sqlite {
        eprintln!("SQLite (synchronous=normal) against Diom's buffer mode");
        let pairing = Pairing {
            label: "SQLite / Diom buffer",
            idem_bin: &idem_bin,
            diom_bin: &versus.diom,
            store: Backing::Sqlite,
            store_cpu: None,
        };
        rows.extend(run_pairing(&pairing, &plan).await?);
        notes.push(
            "- SQLite / Diom buffer (neither fsyncs a write): idem-server over SQLite in WAL \
             mode with `synchronous=normal` (no fsync per commit; the log is synced at \
             checkpoints, which is more than Diom syncs: idem's SQLite store takes no `off`), \
             against Diom with `sync_mode` and `cluster.log_sync_mode` `\"buffer\"` and \
             `log_sync_interval_commits = 1` (Diom's config.bench.toml)"
                .to_owned(),
        );
    }
    notes.push(
        "- Every row starts both servers afresh (new data directories, a new table) and warms \
         them up before its slices: Diom slows down as its raft log grows through a run (each \
         `start`, replays included, is a log entry; its default purges the log at its first \
         snapshot, after 15 minutes), so each row meets both at their best"
            .to_owned(),
    );
    Ok(report(
        &versus,
        &idem_bin,
        &plan,
        &mut rows,
        &notes,
        &load_before,
        began.elapsed(),
    ))
}

fn report(
    versus: &Versus,
    idem_bin: &Path,
    plan: &Plan,
    rows: &mut [Row],
    notes: &[String],
    load_before: &str,
    took: Duration,
) -> String {
    let mut out = format!(
        "# idem-server versus Diom ({mode}), {date}\n\n\
         - machine: {machine}; load average {load_before} before, {load_after} after; took {took:.0} s\n\
         - idem-server: {idem_version} ({idem_path}); Diom: {diom_version} ({diom_path})\n\
         - each row: {rounds} slices of {slice:.1} s a server, interleaved (idem-server first in \
           odd rounds, Diom first in even ones), after a {warm:.1} s warm-up; fresh keep-alive \
           HTTP/1.1 connections each slice, one request in flight on each; MessagePack bodies; \
           a new key is `start` then `complete` (two requests), a replay a `start` of a key \
           completed earlier\n\
         - ops/s and latencies are of operations; CPU is µs of the server process (utime + stime) \
           a operation; RSS is VmRSS after the row\n{notes}\n\n",
        mode = if versus.quick { "quick" } else { "full" },
        date = crate::utc_date(),
        machine = crate::machine(),
        load_after = load_average(),
        took = took.as_secs_f64(),
        idem_version = version(idem_bin),
        idem_path = idem_bin.display(),
        diom_version = version(&versus.diom),
        diom_path = versus.diom.display(),
        rounds = plan.rounds,
        slice = plan.slice.as_secs_f64(),
        warm = plan.warmup.as_secs_f64(),
        notes = notes.join("\n"),
    );
    out.push_str(
        "| pairing | workload | conns | idem ops/s | Diom ops/s | idem ÷ Diom | p50 µs idem / Diom \
         | p99 µs idem / Diom | CPU µs/op idem / Diom | RSS MiB idem / Diom |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let us = |v: Option<u32>| v.map_or("-".into(), |v| v.to_string());
    let cpu = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
    let mib = |v: Option<u64>| v.map_or("-".into(), |v| format!("{:.0}", v as f64 / 1024.0));
    for row in rows.iter_mut() {
        let idem_cpu = match row.idem.per_op(row.idem.store_cpu) {
            Some(store) => format!("{} + {store:.0} PG", cpu(row.idem.per_op(row.idem.cpu))),
            None => cpu(row.idem.per_op(row.idem.cpu)),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {} / {} | {} / {} | {idem_cpu} / {} | {} / {} |\n",
            row.pairing,
            row.workload.name(),
            row.conns,
            row.idem.per_second(),
            row.diom.per_second(),
            row.idem.per_second() / row.diom.per_second().max(1e-9),
            us(row.idem.percentile(50)),
            us(row.diom.percentile(50)),
            us(row.idem.percentile(99)),
            us(row.diom.percentile(99)),
            cpu(row.diom.per_op(row.diom.cpu)),
            mib(row.idem.rss_kib),
            mib(row.diom.rss_kib),
        ));
    }
    out
}
