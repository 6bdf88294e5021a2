//! The multi-process storm, for any store a worker opens by URL: 4 worker processes × 64
//! tasks ([`TASKS`]; fewer against an emulator that answers one request at a time) × 100 keys,
//! every task calling every key. Exactly 100 executions happen across the processes, and every
//! caller in every process gets the stored result of every key, the same one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::key_name;
use crate::worker::Worker;

const PROCESSES: usize = 4;
/// Tasks per process of a storm against a server that answers requests side by side.
pub const TASKS: usize = 64;
const KEYS: usize = 100;
/// Generous bounds for a loaded 2-core machine and an emulator answering one request at a time;
/// the storm never asserts speed.
const STARTUP: Duration = Duration::from_secs(60);
const RUN: Duration = Duration::from_secs(480);
/// The lease of every claim. The storm's workers call the store directly, with no heartbeat, so
/// a claim's lease must outlast the time from its claim to its completion, or another process
/// takes the key over and the key runs twice by design. Against moto, which answers one request
/// at a time, a completion queues behind the other 255 tasks' polls: 10 s was once not enough
/// on a loaded CI machine (`lost k80`). The lease never slows the storm (a locked key is asked
/// again within 100 ms), so it is long.
const LEASE: Duration = Duration::from_secs(60);

/// Runs the storm with the worker binary `worker` against the store at `url` (see
/// [`stores::open`](crate::stores::open)), its records under `namespace`, `tasks` tasks in each
/// of the 4 processes; panics with what went wrong.
///
/// ```no_run
/// # #[tokio::main] async fn main() {
/// idem_stress::storm::four_processes(
///     "target/debug/idem-stress-worker",
///     "redis://127.0.0.1:6379",
///     "idem_storm",
///     idem_stress::storm::TASKS,
/// ).await;
/// # }
/// ```
pub async fn four_processes(worker: &str, url: &str, namespace: &str, tasks: usize) {
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|p| {
            let name = format!("w{p}");
            let args: Vec<String> = [
                "storm-kv",
                "--url",
                url,
                "--namespace",
                namespace,
                "--name",
                &name,
                "--keys",
                &KEYS.to_string(),
                "--tasks",
                &tasks.to_string(),
                "--lease-ms",
                &LEASE.as_millis().to_string(),
                "--deadline-ms",
                &RUN.as_millis().to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            Worker::spawn(&name, worker, &args, &[])
        })
        .collect();
    // Every process opens the store (the first creates the table) before any starts.
    for w in &mut workers {
        w.wait_for("ready", STARTUP).await;
    }
    for w in &mut workers {
        w.send("go").await;
    }

    let mut executions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut responses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for w in workers {
        let name = w.name().to_owned();
        let lines = w.finish(RUN + STARTUP).await;
        let mut per_key: BTreeMap<String, usize> = BTreeMap::new();
        for line in &lines {
            let mut parts = line.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("exec"), Some(k), Some(token)) => executions
                    .entry(k.to_owned())
                    .or_default()
                    .push(format!("{name}:{token}")),
                (Some("resp"), Some(k), Some(r)) => {
                    *per_key.entry(k.to_owned()).or_default() += 1;
                    responses
                        .entry(k.to_owned())
                        .or_default()
                        .insert(r.to_owned());
                }
                (Some("lost" | "error"), ..) => panic!("{name}: {line}"),
                _ => {}
            }
        }
        assert!(lines.iter().any(|l| l == "done"), "{name} did not finish");
        // Every task of this process got a response for every key.
        for i in 0..KEYS {
            assert_eq!(
                per_key.get(&key_name(i)).copied(),
                Some(tasks),
                "{name}: responses for {}",
                key_name(i)
            );
        }
    }

    let total: usize = executions.values().map(Vec::len).sum();
    assert_eq!(total, KEYS, "executions: {executions:?}");
    for i in 0..KEYS {
        let k = key_name(i);
        let runs = &executions[&k];
        assert_eq!(runs.len(), 1, "{k} ran {runs:?}");
        // The one stored result, from the one execution, reached every caller of every process.
        let seen = &responses[&k];
        assert_eq!(seen.len(), 1, "{k}: callers saw {seen:?}");
        let (node, token) = runs[0].split_once(':').unwrap();
        assert_eq!(seen.iter().next().unwrap(), &format!("{k}|{node}|{token}"));
    }
    assert_eq!(responses.len(), KEYS);
}
