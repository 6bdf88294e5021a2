//! The Redis store against real servers: the stale owner fenced on the server's clock, typed
//! errors for an unreachable, restarted or failed-over server, replica acknowledgements, and
//! the configuration it refuses.
//!
//! The shared servers come from `scripts/test` (`IDEM_TEST_REDIS_URL`,
//! `IDEM_TEST_REDIS_CLUSTER_URLS`); the restart, replica and failover tests start servers of
//! their own from `IDEM_REDIS_BINDIR` in a temp dir. Without the variables a test prints why
//! and skips, unless `IDEM_REQUIRE_REDIS=1` makes that a failure.
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{
    ClaimOutcome, ClaimRequest, Completion, Error, Idempotency, Key, OnLocked, RecordState, Store,
    StoreErrorKind,
};
use idem_redis::RedisStore;
use idem_test_support::redis::{fresh_store, redis_bindir, Flavor};
use idem_test_support::Process;
use tokio::time::{sleep, Instant};

const LONG: Duration = Duration::from_secs(30);

fn key(name: &str) -> Key {
    Key::derive("redis-test", "", name).unwrap()
}

fn done(r: &[u8], retention: Duration) -> Completion<'_> {
    Completion {
        response: Some(r),
        is_error: false,
        retention,
        key_retention: Duration::ZERO,
    }
}

fn kind(result: &Result<impl std::fmt::Debug, Error>) -> Option<StoreErrorKind> {
    match result {
        Err(Error::Store(e)) => Some(e.kind()),
        _ => None,
    }
}

async fn stale_owner_is_fenced(flavor: Flavor) {
    let Some(store) = fresh_store(flavor, |b| b).await else {
        return;
    };
    let k = key("stale");
    // A second: long enough that the check just below runs within it on a loaded machine.
    let ClaimOutcome::Claimed(old) = store
        .claim(ClaimRequest::new(&k, Duration::from_secs(1)))
        .await
        .unwrap()
    else {
        panic!("a new key starts");
    };
    // Within the lease the key is held; the server's clock decides when it ends.
    assert!(matches!(
        store.claim(ClaimRequest::new(&k, LONG)).await.unwrap(),
        ClaimOutcome::Locked { .. }
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    let new = loop {
        match store.claim(ClaimRequest::new(&k, LONG)).await.unwrap() {
            ClaimOutcome::Claimed(c) => break c,
            ClaimOutcome::Locked { retry_after } => {
                assert!(retry_after <= Duration::from_secs(1), "{retry_after:?}");
                assert!(Instant::now() < deadline, "the 1 s lease never ended");
                sleep(retry_after.max(Duration::from_millis(5))).await;
            }
            other => panic!("{other:?}"),
        }
    };
    assert!(matches!(
        store.complete(&old, done(b"stale", LONG)).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        store.renew(&old, LONG).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(store.abort(&old).await, Err(Error::LeaseLost)));
    store.complete(&new, done(b"new", LONG)).await.unwrap();
    let ClaimOutcome::Completed(c) = store.claim(ClaimRequest::new(&k, LONG)).await.unwrap() else {
        panic!("the new owner's result replays");
    };
    assert_eq!(c.response.as_deref(), Some(&b"new"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_owner_is_fenced_single() {
    stale_owner_is_fenced(Flavor::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_owner_is_fenced_cluster() {
    stale_owner_is_fenced(Flavor::Cluster).await;
}

/// `result` must be an `InvalidConfig` whose message mentions `about`.
fn assert_invalid_config(result: Result<RedisStore, Error>, about: &str) {
    match result {
        Err(Error::InvalidConfig(m)) if m.contains(about) => {}
        other => panic!("expected InvalidConfig about {about:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_configuration_is_invalid_config() {
    let nowhere = "redis://127.0.0.1:1";
    for prefix in ["", "a{b}", "with space", &"x".repeat(65)] {
        let e = RedisStore::builder().prefix(prefix).connect(nowhere).await;
        assert_invalid_config(e, "prefix");
    }
    let e = RedisStore::connect("http://127.0.0.1:1").await;
    assert_invalid_config(e, "Redis URL");
    let e = RedisStore::builder()
        .wait_for_replicas(0, Duration::from_millis(10))
        .connect(nowhere)
        .await;
    assert_invalid_config(e, "");
    for connections in [0, 65] {
        let e = RedisStore::builder()
            .connections(connections)
            .connect(nowhere)
            .await;
        assert_invalid_config(e, "connections");
    }
    let none: [&str; 0] = [];
    let e = RedisStore::builder().connect_cluster(none).await;
    assert_invalid_config(e, "");
}

/// A port nothing listens on: below the range the OS hands out for port 0, where every test's
/// own HTTP server binds, so only another pick of `free_port` could take it meanwhile.
fn dead_port() -> u16 {
    idem_test_support::free_port()
}

#[tokio::test]
async fn unreachable_server_is_unavailable() {
    let url = format!("redis://127.0.0.1:{}", dead_port());
    let result = RedisStore::connect(&url).await;
    assert_eq!(
        kind(&result),
        Some(StoreErrorKind::Unavailable),
        "{result:?}"
    );
    let result = RedisStore::builder().connect_cluster([url.as_str()]).await;
    assert_eq!(
        kind(&result),
        Some(StoreErrorKind::Unavailable),
        "{result:?}"
    );
}

/// A `redis-server` of the test's own, killed when dropped.
struct Server {
    process: Process,
    port: u16,
}

impl Server {
    fn start(bin: &Path, dir: &Path, port: u16, extra: &[&str]) -> Server {
        let dir = dir.join(port.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new(bin.join("redis-server"))
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--dir"])
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start redis-server");
        let server = Server {
            process: Process::new(child),
            port,
        };
        server.wait_ready(bin);
        server
    }

    fn cli(bin: &Path, port: u16, args: &[&str]) -> String {
        let out = Command::new(bin.join("redis-cli"))
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wait_ready(&self, bin: &Path) {
        for _ in 0..200 {
            if Self::cli(bin, self.port, &["ping"]).contains("PONG") {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on {} did not answer within 5 s", self.port);
    }

    /// `kill -9`: the server dies at once, without saving or telling its replicas.
    fn kill(&mut self) {
        self.process.kill();
    }
}

/// A free port whose cluster bus port (port + 10000) is free too.
fn free_port_pair() -> u16 {
    for _ in 0..200 {
        let port = 20000 + fastrand::u16(..9000);
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10000) {
            return port;
        }
    }
    panic!("no free port pair after 200 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_server_is_unavailable_then_serves_again() {
    let Some(bin) = redis_bindir("restarted_server_is_unavailable_then_serves_again") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_pair();
    let mut server = Server::start(&bin, dir.path(), port, &[]);
    let store = RedisStore::builder()
        .response_timeout(Duration::from_secs(1))
        .connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap();
    let engine = Idempotency::new(store.clone());
    let runs = AtomicUsize::new(0);
    let call = |name: &'static str| {
        let engine = &engine;
        let runs = &runs;
        async move {
            engine
                .call(key(name))
                .run(async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(name.to_owned())
                })
                .await
        }
    };
    call("before").await.unwrap();

    server.kill();
    let down = call("during").await;
    assert_eq!(kind(&down), Some(StoreErrorKind::Unavailable), "{down:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "no work runs without a claim"
    );

    // The same port again: the connection comes back by itself, and the new server, which
    // knows no scripts, is sent them in full.
    let _server = Server::start(&bin, dir.path(), port, &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match call("after").await {
            Ok(out) => {
                assert!(!out.is_replayed());
                break;
            }
            Err(e) => {
                assert_eq!(kind(&Err::<(), _>(e)), Some(StoreErrorKind::Unavailable));
                assert!(Instant::now() < deadline, "no reconnection within 20 s");
                sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(call("after").await.unwrap().is_replayed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledgements_are_checked() {
    let Some(bin) = redis_bindir("replica_acknowledgements_are_checked") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let master = Server::start(&bin, dir.path(), free_port_pair(), &[]);
    let url = format!("redis://127.0.0.1:{}", master.port);

    // No replica: a claim is applied on the master but fails closed, and its work never runs.
    let store = RedisStore::builder()
        .wait_for_replicas(1, Duration::from_millis(50))
        .connect(&url)
        .await
        .unwrap();
    let k = key("unreplicated");
    let ran = std::sync::atomic::AtomicBool::new(false);
    let result = Idempotency::new(store.clone())
        .call(k)
        .run(async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, Error>(1)
        })
        .await;
    assert_eq!(
        kind(&result),
        Some(StoreErrorKind::Unavailable),
        "{result:?}"
    );
    assert!(format!("{:?}", result.unwrap_err()).contains("0 of the 1"));
    assert!(
        !ran.load(Ordering::SeqCst),
        "the work of an unacknowledged claim ran"
    );

    // One replica: claims and completions go through, acknowledged.
    let replica = Server::start(
        &bin,
        dir.path(),
        free_port_pair(),
        &["--replicaof", "127.0.0.1", &master.port.to_string()],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Server::cli(&bin, replica.port, &["info", "replication"])
        .contains("master_link_status:up")
    {
        assert!(
            Instant::now() < deadline,
            "the replica did not sync in 20 s"
        );
        sleep(Duration::from_millis(50)).await;
    }
    // A timeout that a loaded machine's replica meets (it acknowledges at once when asked).
    let store = RedisStore::builder()
        .wait_for_replicas(1, Duration::from_secs(5))
        .connect(&url)
        .await
        .unwrap();
    let engine = Idempotency::new(store.clone());
    let out = engine
        .call(key("replicated"))
        .run(async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    assert!(!out.is_replayed());
    // The replica holds the completed record.
    let on_replica = Server::cli(
        &bin,
        replica.port,
        &["hget", &store.redis_key(&key("replicated")), "s"],
    );
    assert_eq!(on_replica.trim(), "c");

    // WAIT blocks the connection it is sent on, so a store that waits opens 8 connections by
    // default (or as many as asked), and concurrent calls spread over them.
    let clients = || {
        let info = Server::cli(&bin, master.port, &["info", "clients"]);
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse::<i64>().ok())
            .unwrap()
    };
    // The count is the server's, so a store dropped a moment ago may still be counted: each
    // round starts when the server is back to the count it had before the first.
    let base = clients();
    for (asked, opened) in [(None, 8), (Some(3), 3)] {
        assert!(
            idem_test_support::eventually(|| {
                let now = clients();
                async move { now == base }
            })
            .await,
            "the last round's connections were not closed in 10 s"
        );
        let mut builder = RedisStore::builder().wait_for_replicas(1, Duration::from_secs(5));
        if let Some(n) = asked {
            builder = builder.connections(n);
        }
        let pooled = builder.connect(&url).await.unwrap();
        assert_eq!(clients() - base, opened, "connections opened for {asked:?}");
        let engine = Idempotency::new(pooled);
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..16 {
            let engine = engine.clone();
            calls.spawn(async move {
                let out = engine
                    .call(key(&format!("pooled-{opened}-{i}")))
                    .run(async move { Ok::<_, Error>(i) })
                    .await;
                (i, out)
            });
        }
        while let Some(joined) = calls.join_next().await {
            let (i, out) = joined.unwrap();
            let out = out.unwrap();
            assert!(!out.is_replayed());
            assert_eq!(out.into_inner(), i);
        }
    }
}

/// A 3-master, 3-replica cluster of the test's own, with a short node timeout.
struct Cluster {
    nodes: Vec<Server>,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// The arguments of the cluster node on `port`, its config file in `dir`.
    fn node_args(dir: &Path, port: u16) -> Vec<String> {
        let conf = dir.join(format!("nodes-{port}.conf"));
        [
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "1000",
            // A replica takes over however long ago it last heard its master.
            "--cluster-replica-validity-factor",
            "0",
            // Replicas sync at once instead of after Redis's 5 s default delay.
            "--repl-diskless-sync-delay",
            "0",
            "--cluster-config-file",
            conf.to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn node(bin: &Path, dir: &Path, port: u16) -> Server {
        let args = Self::node_args(dir, port);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::start(bin, dir, port, &args)
    }

    fn start(bin: &Path) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<Server> = (0..6)
            .map(|_| Self::node(bin, dir.path(), free_port_pair()))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        Server::cli(bin, nodes[0].port, &args);
        let cluster = Cluster { nodes, dir };
        cluster.wait_ok(bin, Duration::from_secs(30));
        cluster.wait_synced(bin);
        cluster
    }

    /// Waits until every replica has synced with its master.
    fn wait_synced(&self, bin: &Path) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for node in &self.nodes {
            loop {
                let info = Server::cli(bin, node.port, &["info", "replication"]);
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "a replica did not sync within 30 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Starts the node `i` again (after [`Server::kill`]): it rejoins as a replica.
    fn restart(&mut self, bin: &Path, i: usize) {
        let port = self.nodes[i].port;
        self.nodes[i] = Self::node(bin, self.dir.path(), port);
    }

    fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// Waits until every live node reports `cluster_state:ok` and all 3 masters are live.
    fn wait_ok(&self, bin: &Path, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let live: Vec<&Server> = self
                .nodes
                .iter()
                .filter(|n| Server::cli(bin, n.port, &["ping"]).contains("PONG"))
                .collect();
            let ok = live.iter().all(|n| {
                Server::cli(bin, n.port, &["cluster", "info"]).contains("cluster_state:ok")
            });
            if ok && !live.is_empty() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the cluster was not ok within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The index of a live master.
    fn a_master(&self, bin: &Path) -> usize {
        self.nodes
            .iter()
            .position(|n| {
                Server::cli(bin, n.port, &["info", "replication"]).contains("role:master")
            })
            .expect("a master")
    }
}

/// What a storm across a master's death saw.
#[derive(Debug, Default)]
#[allow(dead_code)] // `ran_twice` and `errors` are printed, not asserted.
struct Failover {
    /// Keys whose work ran more than once.
    ran_twice: usize,
    /// Keys that ran again after a call had already returned their result as completed.
    ran_after_ok: usize,
    /// Errors by kind during the storm.
    errors: HashMap<String, usize>,
}

/// Runs 4 tasks over 300 keys against a fresh 3+3 cluster, kills one master with `kill -9`
/// after the first 100 keys, waits for its replica to take over, and then calls every key
/// again until each one answers.
async fn storm_across_failover(bin: &Path, wait: bool) -> Failover {
    let cluster = Cluster::start(bin);
    let mut builder = RedisStore::builder()
        .prefix("failover")
        .response_timeout(Duration::from_millis(500));
    if wait {
        builder = builder.wait_for_replicas(1, Duration::from_millis(500));
    }
    let store = builder.connect_cluster(cluster.urls()).await.unwrap();
    let engine = Arc::new(
        Idempotency::builder(store)
            // Longer than the failover and the old master's return: a completion refused during
            // it is retried by the engine while the key stays claimed.
            .lease(Duration::from_secs(30))
            .on_locked(OnLocked::FailFast)
            .build()
            .unwrap(),
    );
    const KEYS: usize = 300;
    /// What the calls saw, per key where it says so.
    #[derive(Default)]
    struct Seen {
        runs: Vec<AtomicUsize>,
        ok_before_run: Vec<AtomicUsize>,
        errors: Mutex<HashMap<String, usize>>,
        ran_after_ok: AtomicUsize,
    }
    let seen = Arc::new(Seen {
        runs: (0..KEYS).map(|_| AtomicUsize::new(0)).collect(),
        ok_before_run: (0..KEYS).map(|_| AtomicUsize::new(0)).collect(),
        ..Seen::default()
    });

    let call = {
        let (engine, seen) = (engine.clone(), seen.clone());
        move |i: usize| {
            let (engine, seen) = (engine.clone(), seen.clone());
            async move {
                let Seen {
                    runs,
                    ok_before_run,
                    errors,
                    ran_after_ok,
                } = &*seen;
                let result = engine
                    .call(key(&format!("k{i}")))
                    .run(async {
                        if runs[i].fetch_add(1, Ordering::SeqCst) > 0
                            && ok_before_run[i].load(Ordering::SeqCst) > 0
                        {
                            ran_after_ok.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok::<_, Error>(i)
                    })
                    .await;
                match result {
                    Ok(out) => {
                        assert_eq!(out.into_inner(), i);
                        ok_before_run[i].fetch_add(1, Ordering::SeqCst);
                        true
                    }
                    Err(e) => {
                        let what = match &e {
                            Error::Store(s) => format!("{:?}", s.kind()),
                            Error::LeaseLost => "LeaseLost".to_owned(),
                            Error::Locked { .. } => "Locked".to_owned(),
                            other => panic!("an untyped failure across a failover: {other:?}"),
                        };
                        if let Error::Store(s) = &e {
                            assert!(
                                matches!(
                                    s.kind(),
                                    StoreErrorKind::Unavailable | StoreErrorKind::Transient
                                ),
                                "{e:?}"
                            );
                        }
                        *errors.lock().unwrap().entry(what).or_default() += 1;
                        false
                    }
                }
            }
        }
    };

    // Keys 0..100 before the failure, two callers each. On a healthy cluster nearly every key
    // completes; a few may not on a loaded machine (CI runs this binary's tests side by side on
    // 2 cores), where a `WAIT` can outlast its 500 ms: that claim's call ends `Unavailable` with
    // the key still claimed, and its twin `Locked`. Such keys are counted, never retried, and
    // what is under test (no work runs again after a call returned it) is asserted for every key.
    let mut failed_healthy = Vec::new();
    for i in 0..100 {
        let (a, b) = tokio::join!(call(i), call(i));
        if !(a || b) {
            failed_healthy.push(i);
        }
    }
    assert!(
        failed_healthy.len() <= 5,
        "keys {failed_healthy:?} failed on a healthy cluster: {:?}",
        seen.errors.lock().unwrap()
    );
    if !failed_healthy.is_empty() {
        eprintln!("keys {failed_healthy:?} did not complete on the healthy cluster");
    }
    // Keys 100..300 while a master dies: 4 tasks, started before the kill.
    let victim = cluster.a_master(bin);
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let call = call.clone();
            tokio::spawn(async move {
                for i in (100 + t..KEYS).step_by(4) {
                    call(i).await;
                }
            })
        })
        .collect();
    sleep(Duration::from_millis(20)).await;
    let mut cluster = cluster;
    cluster.nodes[victim].kill();
    for t in tasks {
        t.await.expect("no call panics across a failover");
    }
    cluster.wait_ok(bin, Duration::from_secs(60));
    // The dead master comes back as a replica of the one that took over, so that its shard has
    // a replica again (with `wait_for_replicas(1, …)`, a shard without one refuses every claim).
    cluster.restart(bin, victim);
    cluster.wait_ok(bin, Duration::from_secs(60));
    cluster.wait_synced(bin);
    // Every key answers again (its replay, or its first run if its record was lost).
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..KEYS {
        while !call(i).await {
            assert!(
                Instant::now() < deadline,
                "key {i} did not recover within 60 s"
            );
            sleep(Duration::from_millis(50)).await;
        }
    }
    let ran_twice = seen
        .runs
        .iter()
        .filter(|r| r.load(Ordering::SeqCst) > 1)
        .count();
    let errors = seen.errors.lock().unwrap().clone();
    Failover {
        ran_twice,
        ran_after_ok: seen.ran_after_ok.load(Ordering::SeqCst),
        errors,
    }
}

/// A master killed mid-storm: calls in flight fail with typed errors and nothing panics; the
/// replica takes over and every key answers again. Without replica acknowledgements, writes
/// acknowledged just before the kill may be lost (the test prints how many keys ran twice);
/// with `wait_for_replicas(1, …)`, no key whose result a caller received runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_killed_mid_storm() {
    let Some(bin) = redis_bindir("master_killed_mid_storm") else {
        return;
    };
    let plain = storm_across_failover(&bin, false).await;
    eprintln!("failover without WAIT: {plain:?}");
    let waited = storm_across_failover(&bin, true).await;
    eprintln!("failover with wait_for_replicas(1): {waited:?}");
    assert!(
        !plain.errors.is_empty() || !waited.errors.is_empty(),
        "the failover was not felt by any call: {plain:?} {waited:?}"
    );
    assert_eq!(waited.ran_after_ok, 0, "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_and_get_on_a_cluster() {
    let Some(store) = fresh_store(Flavor::Cluster, |b| b).await else {
        return;
    };
    // Keys spread over every master: each record lives in one slot, by its hash tag.
    for i in 0..50 {
        let k = key(&format!("spread-{i}"));
        let ClaimOutcome::Claimed(c) = store.claim(ClaimRequest::new(&k, LONG)).await.unwrap()
        else {
            panic!("new key");
        };
        assert!(matches!(
            store.get(&k).await.unwrap().unwrap().state,
            RecordState::InProgress { .. }
        ));
        store.complete(&c, done(b"r", LONG)).await.unwrap();
        assert!(store.evict(&k).await.unwrap());
        assert!(store.get(&k).await.unwrap().is_none());
    }
}

/// A plain connection to the shared single server, for reading what the store wrote.
async fn raw_single() -> Option<redis::aio::MultiplexedConnection> {
    let urls = idem_test_support::redis::redis_urls(Flavor::Single, "raw")?;
    let client = redis::Client::open(urls[0].as_str()).unwrap();
    Some(client.get_multiplexed_async_connection().await.unwrap())
}

async fn raw<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn).await.unwrap()
}

/// **Tombstones keep no result bytes.** A completion with a `key_retention` keeps its response
/// in a key of its own (`<record>:r`, the record's hash tag) that expires with the retention;
/// the record, without the response, expires with the tombstone. Once the retention has ended
/// the response key is gone and the record's fields hold no byte of the result. Measured with
/// `MEMORY USAGE` under the default prefix `idem` (the figures in docs/stores.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_keeps_no_result_bytes() {
    let Some(urls) = idem_test_support::redis::redis_urls(Flavor::Single, "tombstone") else {
        return;
    };
    let Some(mut conn) = raw_single().await else {
        return;
    };
    // The default prefix, so that the key names (and the bytes measured) are a deployment's;
    // a key of its own, evicted at the end.
    let store = RedisStore::builder()
        .prefix("idem")
        .connect(&urls[0])
        .await
        .unwrap();
    let k = key(&idem_test_support::unique_name("tombstone"));
    let record = store.redis_key(&k);
    let response_key = format!("{record}:r");
    let fingerprint = idem_core::Fingerprint::of_bytes(b"the request");
    let result = vec![0xa5u8; 1000];
    let ClaimOutcome::Claimed(c) = store
        .claim(ClaimRequest::new(&k, LONG).fingerprint(Some(&fingerprint)))
        .await
        .unwrap()
    else {
        panic!("a new key starts");
    };
    let completion = Completion {
        key_retention: Duration::from_secs(60),
        ..done(&result, Duration::from_secs(1))
    };
    store.complete(&c, completion).await.unwrap();
    let fields: HashMap<String, Vec<u8>> = raw(&mut conn, &["HGETALL", &record]).await;
    assert!(!fields.contains_key("r"), "{fields:?}");
    assert_eq!(fields.get("k").map(Vec::as_slice), Some(&b"60"[..]));
    let kept: Vec<u8> = raw(&mut conn, &["GET", &response_key]).await;
    assert_eq!(kept, result);
    let response_ttl: i64 = raw(&mut conn, &["PTTL", &response_key]).await;
    let record_ttl: i64 = raw(&mut conn, &["PTTL", &record]).await;
    assert!((1..=1000).contains(&response_ttl), "{response_ttl}");
    assert!((60_000..=61_000).contains(&record_ttl), "{record_ttl}");
    let completed: i64 = raw(&mut conn, &["MEMORY", "USAGE", &record, "SAMPLES", "0"]).await;
    let response_bytes: i64 = raw(
        &mut conn,
        &["MEMORY", "USAGE", &response_key, "SAMPLES", "0"],
    )
    .await;

    // The retention ends (the server's clock): the record reads as a tombstone.
    let expired = idem_test_support::eventually(|| async {
        matches!(
            store.get(&k).await.unwrap().map(|r| r.state),
            Some(RecordState::Expired { .. })
        )
    })
    .await;
    assert!(expired, "the 1 s retention never ended");
    let exists: i64 = raw(&mut conn, &["EXISTS", &response_key]).await;
    assert_eq!(exists, 0, "the response outlived its retention");
    let fields: HashMap<String, Vec<u8>> = raw(&mut conn, &["HGETALL", &record]).await;
    let names: std::collections::BTreeSet<&str> = fields.keys().map(String::as_str).collect();
    assert_eq!(names, ["e", "f", "k", "s", "t", "x"].into());
    let longest = fields.values().map(Vec::len).max().unwrap_or(0);
    assert!(longest <= 32, "a field keeps {longest} bytes: {fields:?}");
    let tombstone: i64 = raw(&mut conn, &["MEMORY", "USAGE", &record, "SAMPLES", "0"]).await;
    eprintln!(
        "MEMORY USAGE under prefix `idem`: completed record {completed} B + its 1000-byte \
         response {response_bytes} B; tombstone {tombstone} B (its response key gone)"
    );
    assert!(tombstone < 256, "a tombstone takes {tombstone} bytes");
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&k, LONG).fingerprint(Some(&fingerprint)))
            .await
            .unwrap(),
        ClaimOutcome::Expired { .. }
    ));
    assert!(store.evict(&k).await.unwrap());
}

/// **An uncertain claim never expires by itself**: its key has no TTL (`PTTL` -1) from the
/// claim on, through a renewal and a takeover, and gets one again only when a step write sets
/// the claim back to release or it completes; an ordinary claim's key has one throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_claim_has_no_expiry() {
    let Some(store) = fresh_store(Flavor::Single, |b| b).await else {
        return;
    };
    let Some(mut conn) = raw_single().await else {
        return;
    };
    let day = Duration::from_secs(86_400);
    let k = key("uncertain");
    let record = store.redis_key(&k);
    let request = ClaimRequest::new(&k, LONG).on_lapse(idem_core::OnLapse::Uncertain);
    let ClaimOutcome::Claimed(c) = store.claim(request).await.unwrap() else {
        panic!("a new key starts");
    };
    let pttl = |conn: &mut redis::aio::MultiplexedConnection| {
        let record = record.clone();
        let mut conn = conn.clone();
        async move { raw::<i64>(&mut conn, &["PTTL", &record]).await }
    };
    assert_eq!(pttl(&mut conn).await, -1);
    store.renew(&c, LONG).await.unwrap();
    assert_eq!(pttl(&mut conn).await, -1);
    store.begin_steps(&c, day).await.unwrap();
    let step = |on_lapse| idem_core::StepWrite {
        on_lapse: Some(on_lapse),
        ..idem_core::StepWrite::new("charge", 0, None, day)
    };
    store
        .write_step(&c, step(idem_core::OnLapse::Release))
        .await
        .unwrap();
    assert!(pttl(&mut conn).await > LONG.as_millis() as i64);
    store
        .write_step(&c, step(idem_core::OnLapse::Uncertain))
        .await
        .unwrap();
    assert_eq!(pttl(&mut conn).await, -1);
    let completion = Completion {
        key_retention: Duration::from_secs(5),
        ..done(b"ok", LONG)
    };
    store.complete(&c, completion).await.unwrap();
    let left = pttl(&mut conn).await;
    assert!(left > LONG.as_millis() as i64, "{left}");
    let fields: HashMap<String, Vec<u8>> = raw(&mut conn, &["HGETALL", &record]).await;
    assert!(!fields.contains_key("u"), "{fields:?}");

    let ordinary = key("ordinary");
    let ClaimOutcome::Claimed(_) = store
        .claim(ClaimRequest::new(&ordinary, LONG))
        .await
        .unwrap()
    else {
        panic!("a new key starts");
    };
    let left: i64 = raw(&mut conn, &["PTTL", &store.redis_key(&ordinary)]).await;
    assert!(left > LONG.as_millis() as i64, "{left}");
}
