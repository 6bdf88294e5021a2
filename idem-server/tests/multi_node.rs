//! Three idem-server processes over one PostgreSQL, and over a Redis Cluster, driven by Diom's
//! Rust client: clients with duplicate keys spread over the nodes start each key's work once;
//! one node killed with SIGKILL mid-storm (while a claim made through it is held) frees that
//! claim after one lock period, through the other nodes; no completed result is lost. `IDEM_STORM_CLIENTS` and
//! `IDEM_STORM_KEYS` scale it (16 clients and 400 keys by default; the storm is 64 and
//! 10,000). Needs `IDEM_TEST_PG_URL`, and `IDEM_TEST_REDIS_CLUSTER_URLS` with the feature `redis`
//! (scripts/test sets both).

mod common;

use std::collections::{HashMap, VecDeque};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{ADMIN, ALICE};
use diom::models::{IdempotencyCompleteIn, IdempotencyStartIn, IdempotencyStartOut};
use diom::{DiomClient, DiomOptions};
use idem_test_support::free_port;
use idem_test_support::Process;
use tokio::time::Instant;

const LOCK: Duration = Duration::from_secs(3);
const NODES: usize = 3;

fn knob(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A node on `pg` in `table`, listening on a free port, once it answers.
fn node(pg: &str, table: &str) -> (String, Process) {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", &addr, "--store", pg, "--table", table])
        .args([
            "--admin-token",
            ADMIN,
            "--caller-token",
            &format!("alice={ALICE}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut process = Process::new(child);
    // Bounded: 60 s for the node to listen.
    for _ in 0..600 {
        if std::net::TcpStream::connect(&addr).is_ok() {
            return (format!("http://{addr}"), process);
        }
        assert!(process.exited().is_none(), "node {addr} exited at start");
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("node {addr} never listened");
}

/// What the storm saw, per key.
#[derive(Default)]
struct Seen {
    /// `started` answers.
    starts: HashMap<usize, usize>,
    /// Completes that succeeded.
    completes: HashMap<usize, usize>,
    /// Start requests lost with the node (it may have claimed).
    lost: HashMap<usize, usize>,
    /// Claims abandoned with the killed node: when they were made.
    abandoned: HashMap<usize, Instant>,
    /// How long after an abandoned claim its key was started again.
    reclaimed_after: Vec<Duration>,
}

struct Storm {
    clients: Vec<DiomClient>,
    dead: [AtomicBool; NODES],
    ops: AtomicUsize,
    kill_after: usize,
    killed: AtomicBool,
    victim: Mutex<Option<Process>>,
    seen: Mutex<Seen>,
    /// The retries of abandoned claims.
    retries: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Storm {
    /// The retry of a claim abandoned with the killed node: polls `start` through the surviving
    /// nodes every 20 ms until the key frees (then runs and completes it) or completes.
    async fn retry(self: Arc<Self>, k: usize, deadline: Instant) {
        let key = format!("key-{k}");
        // Bounded by the deadline.
        loop {
            assert!(Instant::now() < deadline, "{key} was never freed");
            let idem = self.clients[1].idempotency();
            match idem
                .start(key.clone(), IdempotencyStartIn::new(LOCK))
                .await
                .unwrap()
            {
                IdempotencyStartOut::Started => {
                    let claimed = Instant::now();
                    {
                        let mut seen = self.seen.lock().unwrap();
                        *seen.starts.entry(k).or_default() += 1;
                        if let Some(at) = seen.abandoned.remove(&k) {
                            seen.reclaimed_after.push(claimed - at);
                        }
                    }
                    let done = IdempotencyCompleteIn::new(
                        key.clone().into_bytes(),
                        Duration::from_secs(3600),
                    );
                    idem.complete(key, done).await.unwrap();
                    *self.seen.lock().unwrap().completes.entry(k).or_default() += 1;
                    return;
                }
                IdempotencyStartOut::Completed(done) => {
                    assert_eq!(done.response, key.into_bytes());
                    return;
                }
                IdempotencyStartOut::Locked => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    fn kill_victim(&self) {
        if let Some(mut process) = self.victim.lock().unwrap().take() {
            process.kill();
        }
        self.dead[0].store(true, Ordering::SeqCst);
        self.killed.store(true, Ordering::SeqCst);
    }

    /// One client's keys, retried until each is completed (or abandoned with the killed node).
    async fn client(self: Arc<Self>, c: usize, keys: Vec<usize>, deadline: Instant) {
        let mut queue: VecDeque<usize> = keys.into();
        let mut attempt = c;
        while let Some(k) = queue.pop_front() {
            assert!(
                Instant::now() < deadline,
                "client {c}: the storm did not end in time"
            );
            attempt += 1;
            let n = (0..NODES)
                .map(|i| (attempt + i) % NODES)
                .find(|n| !self.dead[*n].load(Ordering::SeqCst))
                .unwrap();
            let idem = self.clients[n].idempotency();
            let key = format!("key-{k}");
            let ops = self.ops.fetch_add(1, Ordering::SeqCst);
            match idem.start(key.clone(), IdempotencyStartIn::new(LOCK)).await {
                Err(e) if e.is_connection() => {
                    self.dead[n].store(true, Ordering::SeqCst);
                    *self.seen.lock().unwrap().lost.entry(k).or_default() += 1;
                    queue.push_back(k);
                }
                Err(e) => panic!("client {c} start {key}: {e}"),
                Ok(IdempotencyStartOut::Started) => {
                    let claimed = Instant::now();
                    {
                        let mut seen = self.seen.lock().unwrap();
                        *seen.starts.entry(k).or_default() += 1;
                        if let Some(at) = seen.abandoned.remove(&k) {
                            seen.reclaimed_after.push(claimed - at);
                        }
                    }
                    // The kill comes while this claim, made through the victim, is held.
                    if n == 0 && ops >= self.kill_after && !self.killed.load(Ordering::SeqCst) {
                        self.kill_victim();
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let done = IdempotencyCompleteIn::new(
                        key.clone().into_bytes(),
                        Duration::from_secs(3600),
                    );
                    match idem.complete(key.clone(), done).await {
                        Ok(_) => *self.seen.lock().unwrap().completes.entry(k).or_default() += 1,
                        // The node died holding this claim: the client dies with it, and a
                        // retry of its own polls the key through the surviving nodes.
                        Err(e) if e.is_connection() => {
                            self.dead[n].store(true, Ordering::SeqCst);
                            self.seen.lock().unwrap().abandoned.insert(k, claimed);
                            let retry = tokio::spawn(self.clone().retry(k, deadline));
                            self.retries.lock().unwrap().push(retry);
                        }
                        Err(e) => panic!("client {c} complete {key}: {e}"),
                    }
                }
                Ok(IdempotencyStartOut::Locked) => {
                    queue.push_back(k);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok(IdempotencyStartOut::Completed(done)) => {
                    assert_eq!(
                        done.response,
                        key.into_bytes(),
                        "client {c}: another key's result"
                    );
                }
            }
        }
    }
}

/// The storm on three nodes over `store`, its records under `table` (a table, or Redis's key
/// prefix).
async fn storm_on(store: &str, table: &str) {
    let (clients_n, keys_n) = (knob("IDEM_STORM_CLIENTS", 16), knob("IDEM_STORM_KEYS", 400));
    // The first node migrates the table; the others find it.
    let mut nodes = vec![node(store, table)];
    nodes.push(node(store, table));
    nodes.push(node(store, table));
    let urls: Vec<String> = nodes.iter().map(|(url, _)| url.clone()).collect();
    let mut processes: Vec<Process> = nodes.into_iter().map(|(_, p)| p).collect();
    let victim = processes.remove(0);
    let client = |url: &String| {
        DiomClient::new(
            ALICE.to_owned(),
            Some(DiomOptions {
                server_url: Some(url.clone()),
                num_retries: Some(0),
                timeout: Some(Duration::from_secs(30)),
                ..DiomOptions::default()
            }),
        )
    };
    // Every key goes to two clients: duplicates race on every node.
    let per_client = |c: usize| -> Vec<usize> {
        let mut keys: Vec<usize> = (0..keys_n)
            .filter(|k| k % clients_n == c || (k + 1) % clients_n == c)
            .collect();
        fastrand::Rng::with_seed(c as u64).shuffle(&mut keys);
        keys
    };
    let storm = Arc::new(Storm {
        clients: urls.iter().map(client).collect(),
        dead: Default::default(),
        ops: AtomicUsize::new(0),
        kill_after: keys_n * 2 / 3,
        killed: AtomicBool::new(false),
        victim: Mutex::new(Some(victim)),
        seen: Mutex::new(Seen::default()),
        retries: Mutex::default(),
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    let tasks: Vec<_> = (0..clients_n)
        .map(|c| tokio::spawn(storm.clone().client(c, per_client(c), deadline)))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let retries = std::mem::take(&mut *storm.retries.lock().unwrap());
    for r in retries {
        r.await.unwrap();
    }
    assert!(
        storm.killed.load(Ordering::SeqCst),
        "the victim was never killed"
    );

    {
        let seen = storm.seen.lock().unwrap();
        // A claim abandoned with the killed node was started again through another, unless its
        // complete had landed before the node died (only the answer was lost): then it replays
        // below like every other key.
        let landed: Vec<usize> = seen.abandoned.keys().copied().collect();
        assert!(
            !seen.reclaimed_after.is_empty(),
            "no claim held by the killed node was freed"
        );
        for after in &seen.reclaimed_after {
            // Freed after one lock period (the store's clock; slack for a loaded machine), not before.
            assert!(
                *after >= LOCK.mul_f64(0.9) && *after <= LOCK + Duration::from_secs(5),
                "reclaimed after {after:?}"
            );
        }
        let reclaimed = seen.reclaimed_after.len();
        for k in 0..keys_n {
            let completes =
                seen.completes.get(&k).copied().unwrap_or(0) + usize::from(landed.contains(&k));
            let starts = seen.starts.get(&k).copied().unwrap_or(0);
            assert_eq!(completes, 1, "key {k} completed {completes} times");
            let lost = seen.lost.get(&k).copied().unwrap_or(0);
            assert!(
                starts >= 1 && starts <= 1 + lost + reclaimed,
                "key {k} started {starts} times"
            );
        }
        let total_starts: usize = seen.starts.values().sum();
        eprintln!(
            "{clients_n} clients, {keys_n} keys on {NODES} nodes: {total_starts} starts, {reclaimed} claims \
             of the killed node freed after {:?}, {} completes whose answer died with it, {} start \
             requests lost with it",
            seen.reclaimed_after,
            landed.len(),
            seen.lost.values().sum::<usize>()
        );
        assert_eq!(
            total_starts,
            keys_n + reclaimed,
            "a key ran more than once, beyond the killed node's claims"
        );
    }
    // No completed result is lost: every key replays its own, through a surviving node.
    let survivor = &storm.clients[1];
    for k in 0..keys_n {
        let key = format!("key-{k}");
        match survivor
            .idempotency()
            .start(key.clone(), IdempotencyStartIn::new(LOCK))
            .await
            .unwrap()
        {
            IdempotencyStartOut::Completed(done) => assert_eq!(done.response, key.into_bytes()),
            other => panic!("{key}: {other:?}"),
        }
    }
    drop(processes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_postgres_start_each_key_once_and_survive_a_kill() {
    let test = "three_nodes_over_postgres_start_each_key_once_and_survive_a_kill";
    let Some(pg) = idem_test_support::postgres::pg_url(test) else {
        return;
    };
    let table = idem_test_support::unique_name("idem_server_storm");
    storm_on(&pg, &table).await;
    idem_test_support::postgres::drop_store_tables_now(&pg, &table);
}

/// The same over a Redis Cluster (feature `redis`; `IDEM_TEST_REDIS_CLUSTER_URLS`).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_a_redis_cluster_start_each_key_once_and_survive_a_kill() {
    let test = "three_nodes_over_a_redis_cluster_start_each_key_once_and_survive_a_kill";
    let Some(urls) =
        idem_test_support::setting(test, "IDEM_TEST_REDIS_CLUSTER_URLS", "IDEM_REQUIRE_REDIS")
    else {
        return;
    };
    let nodes: Vec<&str> = urls
        .split(',')
        .map(|u| u.trim_start_matches("redis://"))
        .collect();
    let cluster = format!("redis-cluster://{}", nodes.join(","));
    storm_on(
        &cluster,
        &idem_test_support::unique_name("idem_server_storm"),
    )
    .await;
}
