//! Instructions per call of the in-process paths, counted by valgrind's callgrind, which counts
//! the same on a loaded machine as on a quiet one: a change of a few percent that wall-clock
//! ratios on this 2-core machine cannot show is plain here. The `loopback-*` paths serve the
//! HTTP app on a loopback port to a hyper client in this process, so a request is counted end
//! to end as the wall-clock HTTP rows time it, the kernel's part aside.
//!
//! `idem-bench --callgrind` runs this binary under `valgrind --tool=callgrind` twice per path,
//! as `idem-bench --count PATH --iters N` with [`FEW`] and [`MANY`] calls, counting only inside
//! [`measured`] (after the path's set-up and a warm-up), and reports (instructions of the longer
//! run − of the shorter) ÷ ([`MANY`] − [`FEW`]): the per-call cost without what both runs share.
//! Every path runs on a current-thread runtime with keys derived from a counter and a seeded
//! generator, so two runs of one build count the same to a few instructions a call.
//!
//! Beside each count: the same path's count in the checked-in baseline
//! (`idem-bench/callgrind-baseline.txt`, written by `--callgrind --save-baseline`), and the
//! ratios the targets are about (the engine ÷ the raw store calls, observed ÷ plain, the HTTP
//! layer ÷ the bare app).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use std::sync::{Mutex, PoisonError};

use axum::body::Body;
use axum::http::{header, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use idem::http::IdempotencyLayer;
use idem::{
    ClaimOutcome, ClaimRequest, Completion, Error, Idempotency, Key, MemoryStore, ReplayCache,
    Store, DEFAULT_LATENCIES_ONE_IN,
};
use tower::ServiceExt;

use crate::harness::Op;
use crate::workload::{deposit, work, LEASE, RETENTION};
use crate::BenchError;

/// The calls of the shorter and the longer run of each path.
pub const FEW: u64 = 1_000;
pub const MANY: u64 = 3_000;
/// The same for the paths on SQLite, which count the whole process: what its set-up does (the
/// database, the migrations, the threads) moves by about 1.5 million instructions from one run
/// to the next, so the runs are 2,000 operations apart, as the in-process paths' are (with 200
/// and 600 operations, that was 1 % of a steps operation).
pub const FEW_SQL: u64 = 400;
pub const MANY_SQL: u64 = 2_400;

/// Keys completed ahead for the replay paths, which cycle through them.
const COMPLETED: u64 = 256;

/// The checked-in baseline, beside this crate's manifest.
const BASELINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/callgrind-baseline.txt");

/// One in-process path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Case {
    /// `MemoryStore::claim` + `complete` on a new key: what the engine's fresh call is held to.
    Store,
    /// `Idempotency::call(key).run(..)` on a new key (memory store).
    EngineFresh,
    /// The same on a completed key.
    EngineReplay,
    /// The same through an engine with the replay cache, every key in the cache.
    CacheReplay,
    /// A function with `#[idempotent]` on a new request id.
    Attribute,
    /// What the attribute expands to, by hand: `Key::derive` of the request id, then the call.
    Derived,
    /// A new key and its replay through the engine, nothing installed.
    Plain,
    /// The same with a Prometheus recorder and a JSON tracing subscriber installed (default
    /// latency sampling).
    Observed,
    /// A POST with a JSON body to the bare axum app, in process (`oneshot`).
    HttpBare,
    /// The same app behind `IdempotencyLayer` over the memory store, a new key each.
    HttpFresh,
    /// The same, replaying completed keys.
    HttpReplay,
    /// The bare app served on a loopback port and called by a hyper client on one keep-alive
    /// connection, both on the one runtime: a request end to end as the wall-clock HTTP rows
    /// time it (client, hyper and axum both ways), less what the kernel does.
    LoopbackBare,
    /// The same app behind `IdempotencyLayer` over the memory store, a new key each.
    LoopbackFresh,
    /// The same, replaying completed keys.
    LoopbackReplay,
    /// An operation of three steps on SQLite (`run_steps`, three at-least-once steps, each one
    /// write to an effects table), as the wall-clock steps rows run it.
    StepsSqlite,
    /// The same three writes made resumable by hand (recovery points: the key claimed, a fenced
    /// update of its row after each write, the result stored), on the same database.
    StepsSqliteRecoveryPoints,
    /// `Idempotency::call(key).run(..)` on a new key on SQLite (the default policy, so the
    /// completion keeps its key as a tombstone), as the wall-clock SQLite fresh rows run it.
    SqliteFresh,
    /// The raw `INSERT` + `UPDATE` those rows compare it with, on the same database.
    SqliteFreshRaw,
}

const CASES: [Case; 18] = [
    Case::Store,
    Case::EngineFresh,
    Case::EngineReplay,
    Case::CacheReplay,
    Case::Attribute,
    Case::Derived,
    Case::Plain,
    Case::Observed,
    Case::HttpBare,
    Case::HttpFresh,
    Case::HttpReplay,
    Case::LoopbackBare,
    Case::LoopbackFresh,
    Case::LoopbackReplay,
    Case::StepsSqlite,
    Case::StepsSqliteRecoveryPoints,
    Case::SqliteFresh,
    Case::SqliteFreshRaw,
];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Store => "store-claim-complete",
            Case::EngineFresh => "engine-fresh",
            Case::EngineReplay => "engine-replay",
            Case::CacheReplay => "cache-replay",
            Case::Attribute => "attribute-fresh",
            Case::Derived => "derived-fresh",
            Case::Plain => "fresh+replay-plain",
            Case::Observed => "fresh+replay-observed",
            Case::HttpBare => "http-bare",
            Case::HttpFresh => "http-fresh",
            Case::HttpReplay => "http-replay",
            Case::LoopbackBare => "loopback-bare",
            Case::LoopbackFresh => "loopback-fresh",
            Case::LoopbackReplay => "loopback-replay",
            Case::StepsSqlite => "steps-sqlite",
            Case::StepsSqliteRecoveryPoints => "steps-sqlite-recovery-points",
            Case::SqliteFresh => "sqlite-fresh",
            Case::SqliteFreshRaw => "sqlite-fresh-raw",
        }
    }

    /// Whether SQLite runs part of the path, on sqlx's worker threads, where
    /// [`measured`] is not on the stack: such a path is counted whole (its set-up is the same
    /// in both runs, so the difference is its calls').
    fn on_worker_threads(self) -> bool {
        matches!(
            self,
            Case::StepsSqlite
                | Case::StepsSqliteRecoveryPoints
                | Case::SqliteFresh
                | Case::SqliteFreshRaw
        )
    }

    /// The calls of the shorter and the longer run: fewer for the SQLite paths, whose call is
    /// a hundred times the others'.
    fn runs(self) -> (u64, u64) {
        if self.on_worker_threads() {
            (FEW_SQL, MANY_SQL)
        } else {
            (FEW, MANY)
        }
    }

    fn parse(name: &str) -> Result<Case, BenchError> {
        CASES.into_iter().find(|p| p.name() == name).ok_or_else(|| {
            let names: Vec<_> = CASES.iter().map(|p| p.name()).collect();
            BenchError::Usage(format!(
                "unknown path {name:?} for --count: one of {}",
                names.join(", ")
            ))
        })
    }
}

/// `--count PATH --iters N`, when those are the arguments: the path and the calls.
pub fn from_args() -> Option<Result<(Case, u64), BenchError>> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) != Some("--count") {
        return None;
    }
    Some(match argv.as_slice() {
        [_, path, iters, n] if iters == "--iters" => Case::parse(path).and_then(|p| {
            n.parse()
                .map(|n| (p, n))
                .map_err(|_| BenchError::Usage(format!("--iters takes a number, not {n:?}")))
        }),
        _ => Err(BenchError::Usage("--count PATH --iters N".into())),
    })
}

/// Runs `path` `iters` times after its set-up, on a current-thread runtime. Only
/// [`measured`]'s calls are counted (`--toggle-collect`): the set-up, and a warm-up that
/// triggers every lazy initialisation first (the metrics recorder calibrates its clock in a
/// loop whose length varies from run to run), are not.
pub fn run(path: Case, iters: u64) -> Result<(), BenchError> {
    // The engine samples latencies at random from this thread's generator: seeded, every run
    // samples the same calls.
    fastrand::seed(7);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let observed = (path == Case::Observed).then(crate::memory::observers);
    let _recorder = observed
        .as_ref()
        .map(|(recorder, _)| metrics::set_default_local_recorder(recorder));
    let _tracing = observed
        .as_ref()
        .map(|(_, tracing)| tracing::dispatcher::set_default(tracing));
    let mut subject = Subject::new(path)?;
    if path.on_worker_threads() {
        subject.on_sqlite = Some(runtime.block_on(on_sqlite(path))?);
    }
    let replay = matches!(
        path,
        Case::EngineReplay | Case::CacheReplay | Case::HttpReplay | Case::LoopbackReplay
    );
    if matches!(
        path,
        Case::LoopbackBare | Case::LoopbackFresh | Case::LoopbackReplay
    ) {
        runtime.block_on(subject.serve_on_loopback())?;
    }
    // Warm-up: the replay paths complete their keys (and fill the cache) here; the fresh
    // paths use keys of their own, far from the measured ones.
    let warm_up = if replay {
        0..2 * COMPLETED
    } else {
        WARM_UP..WARM_UP + COMPLETED
    };
    runtime.block_on(subject.calls(warm_up, false))?;
    measured(&runtime, &subject, iters, replay)
}

/// The first key number of a fresh path's warm-up.
const WARM_UP: u64 = 1 << 40;

/// The calls callgrind counts (`--toggle-collect=*counts::measured*`).
#[inline(never)]
fn measured(
    runtime: &tokio::runtime::Runtime,
    subject: &Subject,
    iters: u64,
    replay: bool,
) -> Result<(), BenchError> {
    runtime.block_on(subject.calls(0..iters, replay))
}

/// The `i`th key of a run: distinct for every `i`, the same in every run.
fn key(i: u64) -> Key {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&i.to_le_bytes());
    bytes[8] = 1;
    Key::from_bytes(bytes)
}

/// What a path calls: a store, an engine or an app.
struct Subject {
    path: Case,
    store: MemoryStore,
    engine: Idempotency,
    app: axum::Router,
    response: Vec<u8>,
    /// The client's connection to `app` served on a loopback port (the loopback paths only).
    loopback: Mutex<Option<SendRequest<Full<Bytes>>>>,
    /// The operation of the SQLite paths, and the directory of its database.
    on_sqlite: Option<(Op, tempfile::TempDir)>,
}

/// The operation a SQLite path runs, on a database of its own, set up as the wall-clock rows
/// set it up ([`crate::sqlite_store`], [`crate::sqlite_raw`]).
async fn on_sqlite(path: Case) -> Result<(Op, tempfile::TempDir), BenchError> {
    let dir = tempfile::tempdir()?;
    let store = crate::sqlite_store(&dir.path().join("bench.db")).await?;
    let pool = store.pool().clone();
    let op = match path {
        Case::StepsSqlite | Case::StepsSqliteRecoveryPoints => {
            let effects = crate::steps::Effects::sqlite(pool.clone(), "effects").await?;
            if path == Case::StepsSqlite {
                crate::steps::idem_steps(&Idempotency::new(store), &effects)
            } else {
                crate::steps::recovery_points(&crate::sqlite_raw(pool).await?, &effects)
            }
        }
        _ => {
            let raw = crate::sqlite_raw(pool).await?;
            let subject = crate::workload::Subject::new(
                "SQLite",
                crate::cpu::Cpu::default(),
                Idempotency::new(store),
                Some(raw),
            );
            if path == Case::SqliteFresh {
                subject.fresh_engine()
            } else {
                subject.fresh_raw().ok_or_else(|| {
                    BenchError::Unexpected("the SQLite subject has no raw statements".into())
                })?
            }
        }
    };
    Ok((op, dir))
}

impl Subject {
    fn new(path: Case) -> Result<Subject, BenchError> {
        let engine = match path {
            Case::CacheReplay => Idempotency::builder(MemoryStore::new())
                .replay_cache(ReplayCache::new(1 << 20, 1 << 30))
                .build()?,
            Case::Plain | Case::Observed => Idempotency::builder(MemoryStore::new())
                .sample_latencies(DEFAULT_LATENCIES_ONE_IN)
                .build()?,
            _ => Idempotency::new(MemoryStore::new()),
        };
        // Given its state (none) before it is layered, as `axum::serve` does for each connection:
        // a `Router` called without it turns its handler into a route, through the layer, on
        // every request, which no served app does.
        let app = axum::Router::new()
            .route("/deposits", axum::routing::post(http_deposit))
            .with_state(());
        let app = match path {
            Case::HttpFresh | Case::HttpReplay | Case::LoopbackFresh | Case::LoopbackReplay => app
                .layer(
                    IdempotencyLayer::builder(engine.clone())
                        .require_key(true)
                        .caller(|parts| {
                            let cookie = parts.headers.get(header::COOKIE)?.to_str().ok()?;
                            cookie.strip_prefix("session=").map(str::to_owned)
                        })
                        .build()?,
                ),
            _ => app,
        };
        Ok(Subject {
            path,
            store: MemoryStore::new(),
            engine,
            app,
            response: serde_json::to_vec(&work(7))?,
            loopback: Mutex::new(None),
            on_sqlite: None,
        })
    }

    /// Serves `app` on a loopback port of the current runtime and connects the client to it
    /// (`TCP_NODELAY` on both ends, as the wall-clock HTTP rows do).
    async fn serve_on_loopback(&self) -> Result<(), BenchError> {
        use axum::serve::ListenerExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(axum::serve(listener, self.app.clone()).into_future());
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| BenchError::Unexpected(e.to_string()))?;
        tokio::spawn(conn);
        *self.loopback.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
        Ok(())
    }

    /// The calls numbered `range`; with `replay`, on the keys numbered modulo [`COMPLETED`],
    /// each of which must replay.
    async fn calls(&self, range: std::ops::Range<u64>, replay: bool) -> Result<(), BenchError> {
        let mut text = String::with_capacity(32);
        let mut loopback = self
            .loopback
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        for i in range {
            let n = if replay { i % COMPLETED } else { i };
            let replayed = match self.path {
                Case::Store => {
                    let key = key(n);
                    let ClaimOutcome::Claimed(claim) =
                        self.store.claim(ClaimRequest::new(&key, LEASE)).await?
                    else {
                        return Err(BenchError::Unexpected("a new key was not claimable".into()));
                    };
                    let done = Completion {
                        response: Some(&self.response),
                        is_error: false,
                        retention: RETENTION,
                        key_retention: Duration::ZERO,
                    };
                    self.store.complete(&claim, done).await?;
                    false
                }
                Case::EngineFresh | Case::EngineReplay | Case::CacheReplay => self
                    .engine
                    .call(key(n))
                    .run(async move { Ok::<_, Error>(work(n)) })
                    .await?
                    .is_replayed(),
                Case::Attribute | Case::Derived => {
                    text.clear();
                    let _ = write!(text, "{n:032x}");
                    if self.path == Case::Attribute {
                        deposit(&self.engine, &text, n).await?;
                    } else {
                        self.engine
                            .call(Key::derive("bench_deposit", "", &text).map_err(Error::from)?)
                            .scope("bench_deposit")
                            .run(async move { Ok::<_, Error>(work(n)) })
                            .await?;
                    }
                    false
                }
                Case::Plain | Case::Observed => {
                    for _ in 0..2 {
                        self.engine
                            .call(key(n))
                            .scope("bench")
                            .run(async move { Ok::<_, Error>(work(n)) })
                            .await?;
                    }
                    false
                }
                Case::HttpBare | Case::HttpFresh | Case::HttpReplay => {
                    text.clear();
                    let _ = write!(text, "k-{n:016x}");
                    let request = Request::post("/deposits")
                        .header(header::CONTENT_TYPE, "application/json")
                        .header("idempotency-key", text.as_str())
                        .header(header::COOKIE, "session=s-1")
                        .body(Body::from(format!(
                            "{{\"account\":{},\"cents\":{n}}}",
                            n % 1000
                        )))
                        .map_err(|e| BenchError::Unexpected(e.to_string()))?;
                    let response = self
                        .app
                        .clone()
                        .oneshot(request)
                        .await
                        .map_err(|e| BenchError::Unexpected(e.to_string()))?;
                    if !response.status().is_success() {
                        return Err(BenchError::Unexpected(format!(
                            "the app answered {}",
                            response.status()
                        )));
                    }
                    let replayed = response.headers().contains_key("idempotent-replayed");
                    // Read the body, as a client does.
                    axum::body::to_bytes(response.into_body(), 1 << 20)
                        .await
                        .map_err(|e| BenchError::Unexpected(e.to_string()))?;
                    replayed
                }
                Case::StepsSqlite
                | Case::StepsSqliteRecoveryPoints
                | Case::SqliteFresh
                | Case::SqliteFreshRaw => {
                    let (op, _) = self.on_sqlite.as_ref().ok_or_else(|| {
                        BenchError::Unexpected("no SQLite operation set up".into())
                    })?;
                    op().await?;
                    false
                }
                Case::LoopbackBare | Case::LoopbackFresh | Case::LoopbackReplay => {
                    let sender = loopback
                        .as_mut()
                        .ok_or_else(|| BenchError::Unexpected("no loopback connection".into()))?;
                    text.clear();
                    let _ = write!(text, "k-{n:016x}");
                    let request = Request::post("/deposits")
                        .header(header::HOST, "127.0.0.1")
                        .header(header::CONTENT_TYPE, "application/json")
                        .header("idempotency-key", text.as_str())
                        .header(header::COOKIE, "session=s-1")
                        .body(Full::new(Bytes::from(format!(
                            "{{\"account\":{},\"cents\":{n}}}",
                            n % 1000
                        ))))
                        .map_err(|e| BenchError::Unexpected(e.to_string()))?;
                    let unexpected = |e: hyper::Error| BenchError::Unexpected(e.to_string());
                    sender.ready().await.map_err(unexpected)?;
                    let response = sender.send_request(request).await.map_err(unexpected)?;
                    if !response.status().is_success() {
                        return Err(BenchError::Unexpected(format!(
                            "the app answered {}",
                            response.status()
                        )));
                    }
                    let replayed = response.headers().contains_key("idempotent-replayed");
                    response.into_body().collect().await.map_err(unexpected)?;
                    replayed
                }
            };
            if replay && !replayed {
                return Err(BenchError::Unexpected(format!(
                    "{}: a completed key ran again",
                    self.path.name()
                )));
            }
        }
        *self.loopback.lock().unwrap_or_else(PoisonError::into_inner) = loopback;
        Ok(())
    }
}

#[derive(serde::Deserialize)]
struct Deposit {
    account: u64,
    cents: u64,
}

async fn http_deposit(axum::Json(d): axum::Json<Deposit>) -> axum::Json<crate::workload::Receipt> {
    axum::Json(work(d.cents ^ d.account))
}

/// Instructions per call of each path, now and in the baseline.
pub struct CountsReport {
    pub now: BTreeMap<Case, u64>,
    pub baseline: BTreeMap<String, u64>,
    /// The baseline file's comment lines (the commit and compiler it was measured with).
    pub baseline_about: Vec<String>,
}

/// Whether valgrind is on the PATH.
pub fn valgrind_found() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Counts every path under callgrind (two runs each); with `save`, writes them as the baseline.
pub fn measure(save: bool) -> Result<CountsReport, BenchError> {
    let exe = std::env::current_exe()?;
    let dir = tempfile::tempdir()?;
    let mut now = BTreeMap::new();
    for path in CASES {
        let (few, many) = path.runs();
        let per_call = instructions(&exe, dir.path(), path, many)?.saturating_sub(instructions(
            &exe,
            dir.path(),
            path,
            few,
        )?) / (many - few);
        eprintln!("callgrind: {} {per_call} instructions a call", path.name());
        now.insert(path, per_call);
    }
    if save {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# idem-bench --callgrind: instructions per call of each path, the baseline that\n\
             # the benchmark compares with (`idem-bench --callgrind --save-baseline` writes it).\n\
             # {}",
            build_about()
        );
        for (path, n) in &now {
            let _ = writeln!(out, "{} {n}", path.name());
        }
        std::fs::write(BASELINE, out)?;
        eprintln!("idem-bench: wrote {BASELINE}");
    }
    let (baseline, baseline_about) = read_baseline();
    Ok(CountsReport {
        now,
        baseline,
        baseline_about,
    })
}

/// The commit and compiler this binary was built from, as far as the environment tells.
fn build_about() -> String {
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "an unknown commit".into());
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "an unknown rustc".into());
    format!("measured at {commit} with {rustc}, release profile")
}

fn read_baseline() -> (BTreeMap<String, u64>, Vec<String>) {
    let Ok(text) = std::fs::read_to_string(BASELINE) else {
        return (BTreeMap::new(), Vec::new());
    };
    let mut counts = BTreeMap::new();
    let mut about = Vec::new();
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix('#') {
            about.push(comment.trim().to_owned());
        } else if let Some((name, n)) = line.split_once(' ')
            && let Ok(n) = n.trim().parse()
        {
            counts.insert(name.to_owned(), n);
        }
    }
    (counts, about)
}

/// The instructions callgrind counted in one run of `path` with `iters` calls.
fn instructions(exe: &Path, dir: &Path, path: Case, iters: u64) -> Result<u64, BenchError> {
    let out: PathBuf = dir.join(format!("{}-{iters}.out", path.name()));
    let mut valgrind = Command::new("valgrind");
    valgrind
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg("--quiet");
    if !path.on_worker_threads() {
        valgrind.arg("--toggle-collect=*counts::measured*");
    }
    let status = valgrind
        .arg(exe)
        .args(["--count", path.name(), "--iters", &iters.to_string()])
        .status()?;
    if !status.success() {
        return Err(BenchError::Unexpected(format!(
            "valgrind on --count {} --iters {iters} failed: {status}",
            path.name()
        )));
    }
    let text = std::fs::read_to_string(&out)?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| BenchError::Unexpected(format!("no totals in {}", out.display())))
}

impl CountsReport {
    /// The table and the pair ratios, as markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "## Instructions per call (callgrind)\n\n\
             Counted by valgrind's callgrind: ({MANY}-call run − {FEW}-call run) ÷ {}, one \
             current-thread runtime, in process. The same on a loaded machine as on a quiet one. \
             The SQLite paths (steps, fresh keys) run SQLite on sqlx's worker threads, so their \
             whole process is counted: ({MANY_SQL}-operation run − {FEW_SQL}-operation run) ÷ \
             {}.\n",
            MANY - FEW,
            MANY_SQL - FEW_SQL
        );
        if !self.baseline_about.is_empty() {
            let _ = writeln!(out, "Baseline: {}\n", self.baseline_about.join(" "));
        }
        out.push_str("| path | instructions | baseline | ÷ baseline |\n|---|--:|--:|--:|\n");
        for (path, n) in &self.now {
            let base = self.baseline.get(path.name()).copied();
            let _ = writeln!(
                out,
                "| {} | {n} | {} | {} |",
                path.name(),
                base.map_or("—".into(), |b| b.to_string()),
                base.filter(|b| *b > 0)
                    .map_or("—".into(), |b| format!("{:.3}", *n as f64 / b as f64)),
            );
        }
        let ratio = |a: Case, b: Case| {
            let (a, b) = (self.now.get(&a)?, self.now.get(&b)?);
            (*b > 0).then(|| *a as f64 / *b as f64)
        };
        out.push_str("\n| ratio of instructions | now |\n|---|--:|\n");
        for (label, a, b) in [
            (
                "engine, new key ÷ the raw claim + complete",
                Case::EngineFresh,
                Case::Store,
            ),
            (
                "metrics + tracing on ÷ off (new key + replay)",
                Case::Observed,
                Case::Plain,
            ),
            (
                "HTTP layer, new key ÷ the bare app",
                Case::HttpFresh,
                Case::HttpBare,
            ),
            (
                "HTTP layer, replay ÷ the bare app",
                Case::HttpReplay,
                Case::HttpBare,
            ),
            (
                "HTTP layer over loopback, new key ÷ the bare app",
                Case::LoopbackFresh,
                Case::LoopbackBare,
            ),
            (
                "HTTP layer over loopback, replay ÷ the bare app",
                Case::LoopbackReplay,
                Case::LoopbackBare,
            ),
            (
                "steps on SQLite ÷ the same writes made resumable by hand",
                Case::StepsSqlite,
                Case::StepsSqliteRecoveryPoints,
            ),
            (
                "SQLite, new key ÷ the raw INSERT + UPDATE",
                Case::SqliteFresh,
                Case::SqliteFreshRaw,
            ),
            (
                "#[idempotent] ÷ the same by hand, new key",
                Case::Attribute,
                Case::Derived,
            ),
            (
                "replay cache ÷ a store replay",
                Case::CacheReplay,
                Case::EngineReplay,
            ),
        ] {
            if let Some(r) = ratio(a, b) {
                let _ = writeln!(out, "| {label} | {r:.3} |");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--count` takes every path by the name the table prints, and the checked-in baseline
    /// has a count for each (a path added without one would print "—" beside it forever).
    #[test]
    fn every_path_parses_back_and_has_a_baseline() {
        let (baseline, about) = read_baseline();
        assert!(about.iter().any(|l| l.contains("measured at")), "{about:?}");
        for case in CASES {
            assert_eq!(Case::parse(case.name()).ok(), Some(case));
            assert!(
                baseline.get(case.name()).is_some_and(|n| *n > 0),
                "no baseline for {}",
                case.name()
            );
        }
        assert!(Case::parse("nothing").is_err());
    }
}
