//! What idem's test crates share (not published): the project's rule for a test whose server
//! is missing, fresh stores on the servers `scripts/test` starts, servers of a test's own, and
//! bounded polling.
//!
//! The rule: a test that needs a server asks here for its setting (`IDEM_TEST_PG_URL`,
//! `IDEM_TEST_REDIS_URL`, `IDEM_TEST_DYNAMODB_URL`, …). Without it the test prints
//! `skipping <test>: <VAR> is not set` to stderr and returns, unless the store's
//! `IDEM_REQUIRE_…=1` (set by `scripts/test`) makes that a failure.
//!
//! Each store's helpers sit behind the feature of the same name (`postgres`, `redis`,
//! `dynamodb`), which turns the store on in idem-core or brings in its crate (`idem-redis`), so
//! a test binary builds only the stores it tests. [`bank`] is the business the transactional tests pay into; [`hold`] a handler that waits
//! for its test; [`layer`] what the HTTP and gRPC layer tests share; [`grpc`] (feature `grpc`) the
//! gRPC service the gRPC layer's tests, example and benchmark serve.
#![forbid(unsafe_code)]

use std::future::Future;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub mod bank;
#[cfg(feature = "dynamodb")]
pub mod dynamodb;
pub mod faults;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod hold;
pub mod layer;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "props")]
pub mod props;
#[cfg(feature = "redis")]
pub mod redis;
pub mod stores;

/// Whether `err` is [`SchemaNotMigrated`](idem_core::Error::SchemaNotMigrated) for a table
/// found at schema version `found` (`None`: no table or ledger) that needs version `needed`:
/// what a SQL store that does not migrate answers on a table not brought up to date.
///
/// ```
/// use idem_core::Error;
/// let err = Error::SchemaNotMigrated { table: "idem_records".into(), found: Some(0), needed: 2 };
/// assert!(idem_test_support::not_migrated(&err, Some(0), 2));
/// assert!(!idem_test_support::not_migrated(&err, None, 2));
/// ```
pub fn not_migrated(err: &idem_core::Error, found: Option<i64>, needed: i64) -> bool {
    match err {
        idem_core::Error::SchemaNotMigrated {
            found: f,
            needed: n,
            ..
        } => *f == found && *n == needed,
        _ => false,
    }
}

/// The part of a SQL store's migration script (its builder's `schema_sql`) that brings a schema
/// to `version`: the ledger and the steps up to it. An applied step is never edited, so this is
/// what that version's migrations made: the schema of a deployment still at `version`.
///
/// ```
/// let script = "CREATE TABLE l;\n\n-- Version 1: a.\nCREATE TABLE a;\n\n-- Version 2: b.\nCREATE TABLE b;\n";
/// assert_eq!(
///     idem_test_support::script_up_to(script, 1),
///     "CREATE TABLE l;\n\n-- Version 1: a.\nCREATE TABLE a;\n"
/// );
/// ```
pub fn script_up_to(script: &str, version: i64) -> &str {
    let next = format!("\n-- Version {}:", version + 1);
    match script.find(&next) {
        Some(end) => &script[..end],
        None => panic!("the script has no version {}", version + 1),
    }
}

/// Runs one operation with a step through `store` as the engine would, checking each answer:
/// a claim that begins its steps (attempt 1) and stores one, released; a second claim that finds
/// that step (attempt 2) and completes; then a replay of the result. For tests that a store on
/// some table or schema works at all (a table name at its longest, a schema just upgraded).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = idem_core::MemoryStore::new();
/// let key = idem_core::Key::derive("doc", "", "k1").unwrap();
/// idem_test_support::claim_steps_and_complete(&store, &key).await;
/// # }
/// ```
pub async fn claim_steps_and_complete(store: &dyn idem_core::Store, key: &idem_core::Key) {
    use idem_core::{ClaimOutcome, ClaimRequest, Completion, StepState, StepWrite};
    let lease = Duration::from_secs(30);
    let retention = Duration::from_secs(3600);
    let claim = || async {
        match store.claim(ClaimRequest::new(key, lease)).await.unwrap() {
            ClaimOutcome::Claimed(claim) => claim,
            other => panic!("expected a claim, got {other:?}"),
        }
    };
    let first = claim().await;
    let log = store.begin_steps(&first, retention).await.unwrap();
    assert_eq!((log.attempt, log.steps.len()), (1, 0));
    let step = StepWrite {
        name: "charge",
        position: 0,
        result: Some(b"ch_1"),
        retention,
        on_lapse: None,
    };
    store.write_step(&first, step).await.unwrap();
    store.abort(&first).await.unwrap();
    let second = claim().await;
    let log = store.begin_steps(&second, retention).await.unwrap();
    assert_eq!(log.attempt, 2);
    assert_eq!(log.steps.len(), 1, "{:?}", log.steps);
    assert_eq!(log.steps[0].name, "charge");
    assert_eq!(log.steps[0].state, StepState::Finished(b"ch_1".to_vec()));
    let done = Completion {
        response: Some(b"receipt"),
        is_error: false,
        retention,
        key_retention: Duration::ZERO,
    };
    store.complete(&second, done).await.unwrap();
    match store.claim(ClaimRequest::new(key, lease)).await.unwrap() {
        ClaimOutcome::Completed(stored) => {
            assert_eq!(stored.response.as_deref(), Some(&b"receipt"[..]))
        }
        other => panic!("expected the replay, got {other:?}"),
    }
}

/// Checks a SQL store just connected to a schema of an older version: its schema is now the
/// current one (4), the completed record `kept` written before the upgrade is still there, and
/// the store works ([`claim_steps_and_complete`] on `fresh`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # #[cfg(feature = "sqlite")] {
/// use idem_core::{Completion, Key, ClaimOutcome, ClaimRequest, Store};
/// use idem_sql::SqliteStore;
/// let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
/// let kept = Key::derive("doc", "", "kept").unwrap();
/// let ClaimOutcome::Claimed(claim) = store.claim(ClaimRequest::new(&kept, std::time::Duration::from_secs(30))).await.unwrap() else { panic!() };
/// let done = Completion { response: None, is_error: false, retention: std::time::Duration::from_secs(60), key_retention: std::time::Duration::ZERO };
/// store.complete(&claim, done).await.unwrap();
/// idem_test_support::upgraded_and_working(&store, &kept, &Key::derive("doc", "", "new").unwrap()).await;
/// # } }
/// ```
pub async fn upgraded_and_working<S: idem_core::Store + idem_core::StoreAdmin>(
    store: &S,
    kept: &idem_core::Key,
    fresh: &idem_core::Key,
) {
    assert_eq!(store.schema_version().await.unwrap(), 6);
    let record = store.get(kept).await.unwrap();
    match record.map(|r| r.state) {
        Some(idem_core::RecordState::Completed(_)) => {}
        other => panic!("the record written before the upgrade is {other:?}"),
    }
    claim_steps_and_complete(store, fresh).await;
}

/// The value of the environment variable `var`, or `None` after printing why `test` skips; a
/// failure instead when `require` (such as `IDEM_REQUIRE_PG`) is `1`.
///
/// ```
/// let _url = idem_test_support::setting("doc_example", "IDEM_TEST_PG_URL", "IDEM_REQUIRE_PG");
/// ```
pub fn setting(test: &str, var: &str, require: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if required(require) => {
            panic!("{test}: {var} is not set, and {require}=1 requires it")
        }
        _ => {
            eprintln!("skipping {test}: {var} is not set");
            None
        }
    }
}

/// Whether the test command set `require` (such as `IDEM_REQUIRE_PG`) to `1`: every test of
/// that store must run.
///
/// ```
/// let _must_run = idem_test_support::required("IDEM_REQUIRE_PG");
/// ```
pub fn required(require: &str) -> bool {
    std::env::var(require).is_ok_and(|v| v == "1")
}

/// How long any one awaited event of a test may take before the test fails instead of hanging.
pub const BOUND: Duration = Duration::from_secs(30);

/// Awaits `fut`, failing the test (naming `what` it waited for) if it takes longer than
/// [`BOUND`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let answer = idem_test_support::within("the answer", async { 42 }).await;
/// assert_eq!(answer, 42);
/// # }
/// ```
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// The name of the running test (its thread's name), for messages.
///
/// ```
/// assert!(!idem_test_support::current_test().is_empty());
/// ```
pub fn current_test() -> String {
    std::thread::current().name().unwrap_or("a test").to_owned()
}

/// A name no other test uses: `prefix`, `_` and 16 random hex digits (a table, a key prefix).
///
/// ```
/// let t = idem_test_support::unique_name("idem_t");
/// assert!(t.starts_with("idem_t_") && t.len() == "idem_t_".len() + 16);
/// ```
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}_{:016x}", fastrand::u64(..))
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a server a test starts itself, picked
/// below the range the OS hands out for port 0 (32768 and up on Linux). A port the OS picked
/// is free again from the moment the probe closes it, and a server that takes seconds to start
/// (moto's Python imports) could find it taken by a test elsewhere that bound port 0 meanwhile:
/// the test would then talk to that other server. Below the range only another such pick can
/// take it, and the shell scripts' servers pick from 20000-29999, as this does.
///
/// ```
/// let port = idem_test_support::free_port();
/// assert!((20000..30000).contains(&port));
/// ```
///
/// # Panics
///
/// When 500 random ports in the range were all taken.
pub fn free_port() -> u16 {
    for _ in 0..500 {
        let port = fastrand::u16(20000..30000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("500 random ports in 20000-29999 on 127.0.0.1 were all taken")
}

/// Polls `done` every 10 ms for at most 10 s; whether it came true. A test waits for what
/// happens in the background (a pruner's delete, a task's end), never for a fixed time.
///
/// ```
/// # async fn doc() {
/// assert!(idem_test_support::eventually(|| async { true }).await);
/// # }
/// ```
pub async fn eventually<F: Future<Output = bool>>(mut done: impl FnMut() -> F) -> bool {
    for _ in 0..1_000 {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// A child process of the test's own (a server), killed and waited for when dropped, also when
/// the test fails.
///
/// ```no_run
/// let mut server = idem_test_support::Process::new(
///     std::process::Command::new("redis-server").spawn().unwrap(),
/// );
/// server.kill();
/// ```
pub struct Process(std::process::Child);

impl Process {
    /// Takes charge of `child`.
    pub fn new(child: std::process::Child) -> Process {
        Process(child)
    }

    /// Its exit status if it has exited, without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().ok().flatten()
    }

    /// `kill -9`, and waits until it is gone (at once, without saving or telling anyone).
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A small tmpfs mounted for one test (which needs root: a full disk that is real, not
/// simulated); unmounted when dropped, also when the test fails.
///
/// ```no_run
/// let fs = idem_test_support::Tmpfs::mount(1 << 20, None).unwrap();
/// std::fs::write(fs.path().join("f"), b"x").unwrap();
/// ```
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` on a new temporary directory, owned by the user `owner` (only
    /// it may write there) when one is given, or says why not.
    pub fn mount(bytes: u64, owner: Option<&str>) -> Result<Tmpfs, String> {
        let mut options = format!("size={bytes}");
        if let Some(owner) = owner {
            let uid = Command::new("id")
                .args(["-u", owner])
                .output()
                .map_err(|e| format!("cannot run id: {e}"))?;
            let uid = String::from_utf8_lossy(&uid.stdout).trim().to_owned();
            options.push_str(&format!(",uid={uid},mode=0700"));
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &options, "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(Tmpfs { dir })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // A process still closing its files keeps the file system busy: detach it then (`-l`),
        // and the kernel frees it once the last file closes.
        let unmounted = Command::new("umount")
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

/// Runs the future `work` makes to its end on a thread with a runtime of its own, and waits for
/// it: clean-up from `Drop`, which cannot await and whose runtime may be busy or gone. A
/// failure only leaves something stray on a throwaway server, so it is not reported.
///
/// ```
/// idem_test_support::on_own_runtime(|| async { /* drop a table */ });
/// ```
pub fn on_own_runtime<F>(work: impl FnOnce() -> F + Send + 'static)
where
    F: Future<Output = ()>,
{
    let cleanup = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(work());
    });
    let _ = cleanup.join();
}

/// A count per name, shared by its clones: a test's business table (how many times each effect
/// was applied), which a test asserts holds exactly one of each.
///
/// ```
/// let charges = idem_test_support::Tally::default();
/// charges.add("order-1");
/// assert_eq!(charges.count("order-1"), 1);
/// assert_eq!(charges.count("order-2"), 0);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Tally(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>);

impl Tally {
    /// Counts one more of `name`.
    pub fn add(&self, name: &str) {
        *self.lock().entry(name.to_owned()).or_default() += 1;
    }

    /// How many of `name` were counted.
    pub fn count(&self, name: &str) -> u32 {
        self.lock().get(name).copied().unwrap_or(0)
    }

    /// Every count, to show when an assertion fails.
    pub fn snapshot(&self) -> std::collections::HashMap<String, u32> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, u32>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Every `.rs` file under `dir`, recursively (a test's view of a crate's sources).
///
/// ```
/// let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
/// assert!(idem_test_support::rust_sources(&src).iter().any(|f| f.ends_with("lib.rs")));
/// ```
pub fn rust_sources(dir: &Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(dir, &mut found);
    found
}

/// Fails the test if a doc comment (`///`, `//!`) of a `.rs` file under `src` (recursively)
/// shows one of `paths` (such as `idem_core::`): users depend on the facade, `idem`, which
/// re-exports the idem crates' items, and its docs (rendered as `idem`'s) must name paths as
/// `idem::…` so every example compiles as a user pastes it. The targets of intra-doc links
/// (`](idem_core::X)`) are left out: rustdoc resolves them, the reader never sees them.
/// `at_least` is how many sources the crate has at least (so that a wrong `src` fails). Every
/// published crate but idem-core (whose own test is stricter: [`sources_name_facade_paths`])
/// calls it from `tests/doc_paths.rs`.
///
/// ```
/// let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
/// // This crate is no store's: its docs show idem-core's paths, but none of idem-redis.
/// idem_test_support::docs_name_facade_paths(&src, &[concat!("idem_", "redis::")], 5);
/// ```
pub fn docs_name_facade_paths(src: &Path, paths: &[&str], at_least: usize) {
    /// A doc comment's text with the targets of its intra-doc links (`](path)`) left out.
    fn shown(doc: &str) -> String {
        let mut out = String::new();
        let mut rest = doc;
        while let Some(at) = rest.find("](") {
            out.push_str(&rest[..at]);
            rest = &rest[at + 2..];
            rest = rest.find(')').map_or("", |end| &rest[end + 1..]);
        }
        out.push_str(rest);
        out
    }
    name_facade_paths(src, paths, at_least, |line| {
        line.strip_prefix("///")
            .or_else(|| line.strip_prefix("//!"))
            .map(shown)
    });
}

/// The stricter check idem-core's `tests/doc_paths.rs` makes: no line of a `.rs` file under
/// `src`, code or comment, names one of `paths` (inside a crate, code says `crate::`; and the
/// doc strings its macros build are code).
///
/// ```
/// let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
/// // This crate's code calls no item of idem-wire by its crate path.
/// idem_test_support::sources_name_facade_paths(&src, &[concat!("idem_", "wire::")], 5);
/// ```
pub fn sources_name_facade_paths(src: &Path, paths: &[&str], at_least: usize) {
    name_facade_paths(src, paths, at_least, |line| Some(line.to_owned()));
}

/// Fails the test if the part `pick` takes of a line (trimmed) of a `.rs` file under `src`
/// names one of `paths`, or if there are fewer than `at_least` sources.
fn name_facade_paths(
    src: &Path,
    paths: &[&str],
    at_least: usize,
    pick: impl Fn(&str) -> Option<String>,
) {
    let files = rust_sources(src);
    assert!(
        files.len() >= at_least,
        "only {} sources under {}",
        files.len(),
        src.display()
    );
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            let Some(seen) = pick(line) else {
                continue;
            };
            if paths.iter().any(|p| seen.contains(p)) {
                let at = file.strip_prefix(src).unwrap_or(&file).display();
                found.push(format!("src/{at}:{}: {line}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "write `idem::` (the facade users depend on) instead of {}:\n{}",
        paths.join(" or "),
        found.join("\n")
    );
}
