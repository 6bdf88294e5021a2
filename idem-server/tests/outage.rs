//! idem-server down for longer than the lease, twice, under load from four client engines on
//! `RemoteStore` (docs/never-twice.md, "The store goes away after the work ran"): every answer a
//! caller was given is the one stored, and no key's work runs twice.
//!
//! The server runs on a SQLite file with its background pruner (the default), is killed with
//! SIGKILL mid-load and restarted on the same file and port after two leases. Calls whose work
//! ended while it was down answered their callers (`Fresh`) with their completion pending in the
//! background; the restarted server's pruner runs at once, and before the fix it deleted those
//! lapsed claims, so the pending completions were refused (`409 stale_holder`) and the next call
//! ran the work again. A lapsed claim that nobody took over is now kept for its holder
//! (`LAPSED_CLAIMS_KEPT`), and the completion lands when the server is back.
//!
//! Each engine has keys of its own, with its eight tasks calling the same keys at once: a call
//! of the engine that meets its own pending completion never claims (it is `Locked`, or waits).
//! A key shared with another process whose holder's lease ran out can be taken over by that
//! process, and its work run again: that is the documented case of never-twice.md, counted by
//! `another_process_after_an_outage_longer_than_the_lease_runs_again` in idem-core's tests, and
//! kept out of this count.

mod common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{ADMIN, ALICE};
use idem::RemoteStore;
use idem_core::{Error, Idempotency, Key, Outcome, RecordState, Store};
use idem_test_support::free_port;
use idem_test_support::Process;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(2);
/// How long the server stays down each time: two leases.
const OUTAGE: Duration = Duration::from_secs(4);
const KILLS: usize = 2;
const ENGINES: usize = 4;
const TASKS: usize = 8;
/// Keys per engine, called in order by each of its tasks.
const KEYS: usize = 400;
/// New keys answered before each kill and after the last restart.
const WINDOW: usize = 40;

/// The server on `db`, listening on `addr`, once it answers.
fn server(addr: &str, db: &std::path::Path) -> Process {
    let child = Command::new(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", addr, "--admin-token", ADMIN])
        .args(["--caller-token", &format!("alice={ALICE}")])
        .arg("--store")
        .arg(format!("sqlite://{}?mode=rwc", db.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut process = Process::new(child);
    // Bounded: 30 s for the server to listen.
    for _ in 0..300 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return process;
        }
        assert!(process.exited().is_none(), "the server exited at start");
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the server never listened on {addr}");
}

fn key(engine: usize, n: usize) -> Key {
    Key::derive("outage", "", &format!("e{engine}-k{n}")).unwrap()
}

/// What the load saw.
#[derive(Default)]
struct Seen {
    /// The values the work produced, per key: one per execution.
    runs: Mutex<HashMap<Key, Vec<u64>>>,
    /// Every answer a caller was given, per key.
    answers: Mutex<HashMap<Key, Vec<Outcome<u64>>>>,
    /// Calls refused because the server was down (they were retried).
    unavailable: AtomicU64,
    /// Calls that met a completion pending in their own engine (`Locked`, then retried).
    locked: AtomicU64,
    next: AtomicU64,
}

impl Seen {
    /// How many calls were answered `Fresh` (their work ran for them).
    fn fresh(&self) -> usize {
        let answers = self.answers.lock().unwrap();
        answers
            .values()
            .flatten()
            .filter(|o| matches!(o, Outcome::Fresh(_)))
            .count()
    }

    /// Waits until `more` calls more than now were answered `Fresh` (a minute at most): the
    /// load between two kills is counted, not timed, so a loaded machine slows it down without
    /// thinning it out.
    async fn until_fresh(&self, more: usize) {
        let (target, deadline) = (
            self.fresh() + more,
            Instant::now() + Duration::from_secs(60),
        );
        while self.fresh() < target {
            assert!(
                Instant::now() < deadline,
                "no {more} fresh answers within a minute of the server's start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One call of `key` on `engine`, retried until it answers: the work takes 20 ms and
    /// returns a value no other execution returns.
    async fn call(&self, engine: &Idempotency, key: Key, stop: Instant) {
        // Bounded by `stop` (plus one call's time): every refused try sleeps first.
        loop {
            let work = async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let value = self.next.fetch_add(1, Ordering::SeqCst);
                self.runs
                    .lock()
                    .unwrap()
                    .entry(key)
                    .or_default()
                    .push(value);
                Ok::<_, Error>(value)
            };
            match engine.call(key).run(work).await {
                Ok(outcome) => {
                    self.answers
                        .lock()
                        .unwrap()
                        .entry(key)
                        .or_default()
                        .push(outcome);
                    return;
                }
                Err(Error::Locked { retry_after }) => {
                    self.locked.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(retry_after.min(Duration::from_millis(200))).await;
                }
                Err(Error::Store(e)) => {
                    assert!(e.kind().is_transient(), "{e}");
                    self.unavailable.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{key}: {e}"),
            }
            if Instant::now() > stop {
                return;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_is_lost_when_the_server_is_down_past_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let addr = format!("127.0.0.1:{}", free_port());
    let url = format!("http://{addr}");
    let mut running = server(&addr, &db);

    let engines: Vec<Idempotency> = (0..ENGINES)
        .map(|_| {
            let remote = RemoteStore::builder(url.clone(), ALICE)
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap();
            Idempotency::builder(remote).lease(LEASE).build().unwrap()
        })
        .collect();
    let seen = Arc::new(Seen::default());
    let done = Arc::new(AtomicBool::new(false));
    // The whole load ends by then, whatever happens.
    let stop = Instant::now() + Duration::from_secs(90);

    let mut load = Vec::new();
    for (e, engine) in engines.iter().enumerate() {
        for _ in 0..TASKS {
            let (engine, seen, done) = (engine.clone(), seen.clone(), done.clone());
            load.push(tokio::spawn(async move {
                for n in 0..KEYS {
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    seen.call(&engine, key(e, n), stop).await;
                }
            }));
        }
    }

    // Each kill comes once the server answered `WINDOW` new keys since it started; the load
    // ends once it answered as many after the last restart.
    let mut kills = Vec::new();
    for _ in 0..KILLS {
        seen.until_fresh(WINDOW).await;
        running.kill();
        kills.push(Instant::now());
        tokio::time::sleep(OUTAGE).await;
        running = server(&addr, &db);
    }
    seen.until_fresh(WINDOW).await;
    done.store(true, Ordering::SeqCst);
    for task in load {
        task.await.unwrap();
    }

    // Every key that ran has its result in the store once the engines' background completions
    // are through (each retries at most a third of the lease apart): polled, bounded. Then a
    // fresh engine replays it.
    let check = RemoteStore::builder(url.clone(), ALICE).build().unwrap();
    let replayer = Idempotency::builder(check.clone())
        .lease(LEASE)
        .build()
        .unwrap();
    let runs = seen.runs.lock().unwrap().clone();
    let answers = seen.answers.lock().unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stored = HashMap::new();
    for key in runs.keys() {
        // Bounded by `deadline`.
        let completed = loop {
            let record = check.get(key).await.unwrap();
            if matches!(record.map(|r| r.state), Some(RecordState::Completed(_))) {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let value = if completed {
            match replayer
                .call(*key)
                .run(async { Ok::<_, Error>(u64::MAX) })
                .await
            {
                Ok(Outcome::Replayed(v)) => Some(v),
                other => panic!("{key}: completed in the store, then {other:?}"),
            }
        } else {
            None
        };
        stored.insert(*key, value);
    }

    let twice: Vec<_> = runs.iter().filter(|(_, v)| v.len() > 1).collect();
    let unstored: Vec<_> = stored.iter().filter(|(_, v)| v.is_none()).collect();
    let mut lost = Vec::new();
    for (key, given) in &answers {
        for outcome in given {
            let value = match outcome {
                Outcome::Fresh(v) | Outcome::Replayed(v) => *v,
            };
            if stored.get(key).copied().flatten() != Some(value) {
                lost.push((*key, *outcome));
            }
        }
    }
    let fresh = seen.fresh();
    eprintln!(
        "{} keys answered ({fresh} fresh, {} answers), {} calls refused while the server was down, {} met a pending completion; {} kills of {OUTAGE:?} with a {LEASE:?} lease",
        answers.len(),
        answers.values().map(Vec::len).sum::<usize>(),
        seen.unavailable.load(Ordering::Relaxed),
        seen.locked.load(Ordering::Relaxed),
        kills.len(),
    );
    assert!(twice.is_empty(), "work ran twice: {twice:?}");
    assert!(unstored.is_empty(), "results never stored: {unstored:?}");
    assert!(lost.is_empty(), "answers given and lost: {lost:?}");
    assert!(
        seen.unavailable.load(Ordering::Relaxed) > 0,
        "no call met the outage"
    );
    assert!(
        fresh >= WINDOW * (KILLS + 1),
        "too little load: {fresh} fresh answers"
    );
}
