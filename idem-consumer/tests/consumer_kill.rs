//! The acceptance test of queue consumers with exactly-once effects (docs/consumers.md): moto's
//! SQS, and the store on DynamoDB (moto), SQLite (one file shared by the processes) and
//! PostgreSQL. A producer sends N messages (`IDEM_CONSUMER_KILL_N`, 200 by default), 30 % of
//! them twice; the queue's visibility timeout is 2 s and 10 % of the handlers take 3 s; every
//! 20th message's handler fails on its first attempt (and says so in a side table). Four
//! consumer processes (this test binary again, each with `IDEM_CONSUMER_KILL_POLLERS` receive
//! loops of 10 messages at once: 8 by default, 2 on DynamoDB; and on SQLite once more with one
//! loop of 16, the default) run the SQS consumer with [`SqsConsumer::run_steps`],
//! each message's effect one transactional step (a row, or an item, in a business table); the
//! producer keeps at most 400 messages waiting. The first process is killed with SIGKILL while
//! its handlers run (in the one-loop case, more than 10 of them: more than one receive hands
//! out; there it runs alone until then, and the other three start after the kill), once it has
//! applied N/16 effects. The survivors drain the queue. Then:
//!
//! - every message's effect is in the business table exactly once (and nothing else is);
//! - every planned failure happened (its side-table row) and its message was redelivered and
//!   applied later: a message deleted while its handler failed would have no effect;
//! - the queue is empty (visible + not visible), within a bounded wait.
//!
//! The figures are printed (`consumer_kill <store>: ...`) for bench-results.
#![cfg(feature = "sqs")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use idem::{
    DynamoSteps, DynamoStore, Error, Idempotency, PostgresStore, SqlSteps, SqliteStore, Steps,
};
use idem_consumer::sqs::aws_sdk_sqs::types::{
    Message as SqsMessage, QueueAttributeName, SendMessageBatchRequestEntry,
};
use idem_consumer::sqs::aws_sdk_sqs::Client;
use idem_consumer::sqs::SqsConsumer;
use idem_consumer::Consumer;
use idem_test_support::Process;
use serde::{Deserialize, Serialize};

mod support;
use support::sqs::{client as sqs, endpoint, left_in_queue};

/// Set in a child: its settings, as `KEY=VALUE` lines (see [`Setup`]).
const CHILD: &str = "IDEM_CONSUMER_KILL_CHILD";
const PROCESSES: usize = 4;
/// How the consumer processes run, and when the first is killed.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Shape {
    /// SQS receive loops per process.
    pollers: usize,
    /// Messages each loop runs at once (`Consumer::concurrency`), in overlapping batches.
    concurrency: usize,
    /// The fewest handlers running in the first process when it is killed.
    running_at_kill: u64,
    /// How long every handler works before its step, beside the slow ones' 3 s.
    work_ms: u64,
    /// Whether the first process runs alone until it is killed (the others start then): it
    /// takes every message, so its room fills whatever else the machine runs.
    alone_until_kill: bool,
}

impl Shape {
    /// Loops of 10 at once (5 on DynamoDB): `IDEM_CONSUMER_KILL_POLLERS` of them a process,
    /// else 8, and 2 on DynamoDB (moto answers its DynamoDB requests one at a time: more
    /// handlers at once only wait longer for it, and their leases run short; 5 a loop drained in
    /// 26-31 s alone, 10 in 41 s); killed with a handler running.
    fn many_loops(store: &str) -> Shape {
        let pollers = std::env::var("IDEM_CONSUMER_KILL_POLLERS")
            .ok()
            .map(|n| n.parse().expect("IDEM_CONSUMER_KILL_POLLERS is a number"))
            .unwrap_or(if store == "dynamodb" { 2 } else { 8 });
        Shape {
            pollers,
            concurrency: if store == "dynamodb" { 5 } else { 10 },
            running_at_kill: 1,
            work_ms: 0,
            alone_until_kill: false,
        }
    }

    /// One loop a process at the default concurrency, 16, every handler working 2 s, the first
    /// process alone until it is killed (so that its loop's room fills): killed with more than
    /// 10 handlers running, more than one SQS receive gives, so with a batch filled past one
    /// receive or batches overlapping in hand. The other three start then and drain the queue.
    fn one_loop_past_ten() -> Shape {
        Shape {
            pollers: 1,
            concurrency: 16,
            running_at_kill: 11,
            work_ms: 2_000,
            alone_until_kill: true,
        }
    }
}

const VISIBILITY: Duration = Duration::from_secs(2);
const SLOW: Duration = Duration::from_secs(3);

fn messages() -> u64 {
    std::env::var("IDEM_CONSUMER_KILL_N")
        .ok()
        .map(|n| n.parse().expect("IDEM_CONSUMER_KILL_N is a number"))
        .unwrap_or(200)
}

/// Message `n` is sent twice (30 %).
fn twice(n: u64) -> bool {
    n % 10 < 3
}

/// Message `n`'s handler takes 3 s (10 %).
fn slow(n: u64) -> bool {
    n % 10 == 5
}

/// Message `n`'s handler fails on its first attempt (5 %, all sent once: a failed message that
/// were deleted has no twin to apply it).
fn fails_first(n: u64) -> bool {
    n % 20 == 7
}

/// What a consumer process is given.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Setup {
    /// `sqlite`, `postgres` or `dynamodb`.
    store: String,
    /// The SQLite file, the PostgreSQL URL, or unused.
    db: String,
    endpoint: String,
    queue: String,
    /// The records table (PostgreSQL, DynamoDB) and the prefix of the business tables.
    prefix: String,
    shape: Shape,
}

impl Setup {
    fn to_env(&self) -> String {
        serde_json::to_string(self).unwrap()
    }

    fn from_env(text: &str) -> Setup {
        serde_json::from_str(text).unwrap()
    }
}

/// The store and the business tables, as the processes and the checks reach them.
#[derive(Clone)]
enum Shop {
    Sqlite(SqliteStore, String),
    Postgres(PostgresStore, String),
    Dynamo(DynamoStore, String),
}

/// A DynamoDB request's error as the handlers' (idem's).
fn dynamo_error(e: impl std::fmt::Display) -> Error {
    Error::InvalidConfig(e.to_string())
}

/// The effect of message `id` as one transactional step on a SQL store: a row in the business
/// table, written and recorded in one transaction begun with `$begin`.
macro_rules! sql_effect {
    ($store:expr, $steps:expr, $effects:expr, $id:expr, $begin:literal) => {{
        use sqlx::Connection;
        let (store, id) = ($store, $id.to_owned());
        let sql = format!("INSERT INTO {} (id, process) VALUES ($1, $2)", $effects);
        let mut conn = store.pool().acquire().await.map_err(idem::sql_error)?;
        let mut tx = conn.begin_with($begin).await.map_err(idem::sql_error)?;
        $steps
            .tx(store, &mut tx, "effect", |tx| {
                Box::pin(async move {
                    sqlx::query(&sql)
                        .bind(id)
                        .bind(i64::from(std::process::id()))
                        .execute(&mut *tx)
                        .await
                        .map_err(idem::sql_error)?;
                    Ok::<_, Error>(())
                })
            })
            .await?;
        tx.commit().await.map_err(idem::sql_error)?;
        Ok(())
    }};
}

/// `sql` on the pool and table prefix of a SQL store (written once for both pool types), or
/// `dynamo` on the DynamoDB store and business table.
macro_rules! on_sql {
    ($shop:expr, |$pool:ident, $p:ident| $sql:expr, |$s:ident, $t:ident| $dynamo:expr $(,)?) => {
        match $shop {
            Shop::Sqlite(s, $p) => {
                let $pool = s.pool();
                $sql
            }
            Shop::Postgres(s, $p) => {
                let $pool = s.pool();
                $sql
            }
            Shop::Dynamo($s, $t) => $dynamo,
        }
    };
}

impl Shop {
    async fn open(s: &Setup) -> Shop {
        match s.store.as_str() {
            "sqlite" => Shop::Sqlite(SqliteStore::open(&s.db).await.unwrap(), s.prefix.clone()),
            "postgres" => Shop::Postgres(
                PostgresStore::builder()
                    .table(&s.prefix)
                    .pruner(None)
                    .connect(&s.db)
                    .await
                    .unwrap(),
                s.prefix.clone(),
            ),
            _ => Shop::Dynamo(
                DynamoStore::builder()
                    .table(&s.prefix)
                    .create_table_if_missing(true)
                    .build(DynamoStore::client_from_env(&s.endpoint).unwrap())
                    .await
                    .unwrap(),
                format!("{}-effects", s.prefix),
            ),
        }
    }

    fn engine(&self) -> Idempotency {
        let builder = match self {
            Shop::Sqlite(s, _) => Idempotency::builder(s.clone()),
            Shop::Postgres(s, _) => Idempotency::builder(s.clone()),
            Shop::Dynamo(s, _) => Idempotency::builder(s.clone()),
        };
        builder.lease(VISIBILITY).build().unwrap()
    }

    /// Creates the business tables (in the parent, before the consumers start).
    async fn create_tables(&self) {
        on_sql!(
            self,
            |pool, p| {
                sqlx::raw_sql(&ddl(p)).execute(pool).await.unwrap();
            },
            |s, t| DynamoStore::create_table(s.client(), t).await.unwrap()
        )
    }

    /// Records the first failure of message `id`; whether this attempt is its first.
    async fn first_failure(&self, id: &str) -> Result<bool, Error> {
        let sql =
            |p: &str| format!("INSERT INTO {p}_failures (id) VALUES ($1) ON CONFLICT DO NOTHING");
        Ok(on_sql!(
            self,
            |pool, p| sqlx::query(&sql(p))
                .bind(id)
                .execute(pool)
                .await
                .map_err(idem::sql_error)?
                .rows_affected()
                == 1,
            |s, t| {
                let put = s
                    .client()
                    .put_item()
                    .table_name(t)
                    .item("pk", AttributeValue::S(format!("failed:{id}")))
                    .condition_expression("attribute_not_exists(pk)")
                    .send()
                    .await;
                match put {
                    Ok(_) => true,
                    Err(e)
                        if e.as_service_error()
                            .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
                    {
                        false
                    }
                    Err(e) => {
                        return Err(dynamo_error(
                            idem::aws_sdk_dynamodb::error::DisplayErrorContext(e),
                        ))
                    }
                }
            }
        ))
    }

    /// Applies message `id`'s effect as the step "effect" of its operation.
    async fn apply(&self, steps: &Steps, id: &str) -> Result<(), Error> {
        match self {
            Shop::Sqlite(store, p) => {
                sql_effect!(store, steps, format!("{p}_effects"), id, "BEGIN IMMEDIATE")
            }
            Shop::Postgres(store, p) => {
                sql_effect!(store, steps, format!("{p}_effects"), id, "BEGIN")
            }
            Shop::Dynamo(store, t) => {
                let update = Update::builder()
                    .table_name(t)
                    .key("pk", AttributeValue::S(id.to_owned()))
                    .update_expression("ADD applied :one SET process = :process")
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .expression_attribute_values(
                        ":process",
                        AttributeValue::N(std::process::id().to_string()),
                    )
                    .build()
                    .map_err(dynamo_error)?;
                let write = TransactWriteItem::builder().update(update).build();
                steps
                    .dynamo_tx(store, "effect", || async {
                        Ok::<_, Error>(((), vec![write]))
                    })
                    .await
            }
        }
    }

    /// Each message's count of effects, and the failures recorded.
    async fn effects(&self) -> (BTreeMap<String, i64>, Vec<String>) {
        let (rows, failures): (Vec<(String, i64)>, Vec<String>) = on_sql!(
            self,
            |pool, p| (
                sqlx::query_as(&counts(p)).fetch_all(pool).await.unwrap(),
                sqlx::query_scalar(&format!("SELECT id FROM {p}_failures"))
                    .fetch_all(pool)
                    .await
                    .unwrap(),
            ),
            |s, t| {
                let (mut rows, mut failures) = (Vec::new(), Vec::new());
                let mut pages = s
                    .client()
                    .scan()
                    .table_name(t)
                    .consistent_read(true)
                    .into_paginator()
                    .items()
                    .send();
                while let Some(item) = pages.next().await {
                    let item = item.unwrap();
                    let Some(AttributeValue::S(pk)) = item.get("pk") else {
                        panic!("an item without pk: {item:?}")
                    };
                    match pk.strip_prefix("failed:") {
                        Some(id) => failures.push(id.to_owned()),
                        None => {
                            let n = match item.get("applied") {
                                Some(AttributeValue::N(n)) => n.parse().unwrap(),
                                other => panic!("{pk}: applied is {other:?}"),
                            };
                            rows.push((pk.clone(), n));
                        }
                    }
                }
                (rows, failures)
            }
        );
        (rows.into_iter().collect(), failures)
    }
}

fn ddl(p: &str) -> String {
    format!(
        "CREATE TABLE {p}_effects (id TEXT NOT NULL, process BIGINT NOT NULL); \
         CREATE TABLE {p}_failures (id TEXT PRIMARY KEY)"
    )
}

fn counts(p: &str) -> String {
    format!("SELECT id, COUNT(*) FROM {p}_effects GROUP BY id")
}

/// One message through a consumer process: says when it starts and ends on stdout (the parent
/// kills the first process while its handlers run).
async fn handle(
    shop: &Shop,
    work: Duration,
    message: SqsMessage,
    steps: Steps,
) -> Result<(), Error> {
    let id = message.body().unwrap_or_default().to_owned();
    let n: u64 = id
        .strip_prefix("m-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    println!("START {id}");
    let out = async {
        if fails_first(n) && shop.first_failure(&id).await? {
            return Err(Error::InvalidConfig(format!(
                "{id} failed on its first attempt, as planned"
            )));
        }
        // The slow part comes before the step's transaction (SQLite's write lock).
        tokio::time::sleep(work).await;
        if slow(n) {
            tokio::time::sleep(SLOW).await;
        }
        shop.apply(&steps, &id).await
    }
    .await;
    println!("{} {id}", if out.is_ok() { "APPLIED" } else { "FAILED" });
    out
}

/// A consumer process: runs until its stdin closes, then finishes its batches and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_kill_child_entry() {
    let Ok(text) = std::env::var(CHILD) else {
        return;
    };
    let s = Setup::from_env(&text);
    let shop = Shop::open(&s).await;
    // Ten at once per receive loop: what each loop ran before its batches were filled and
    // overlapped up to the concurrency (16 by default). The loops share one pool and one moto,
    // and 8 loops × 16 handlers queued on both; the kill and the drain are what this test is
    // about. Each loop's batches overlap: a kill finds batches in hand in several states.
    let consumer = Consumer::new(shop.engine(), "consume")
        .unwrap()
        .concurrency(s.shape.concurrency);
    let consumer = SqsConsumer::new(sqs(&s.endpoint), &s.queue, consumer)
        .visibility(VISIBILITY)
        .wait(Duration::from_secs(1))
        .keyed_by(|m| m.body().map(str::to_owned));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
        stop.send_replace(true);
    });
    let pollers = (0..s.shape.pollers).map(|_| {
        let (shop, consumer, mut stopped) = (shop.clone(), consumer.clone(), stopped.clone());
        async move {
            let shop = &shop;
            let work = Duration::from_millis(s.shape.work_ms);
            let handler = |m: SqsMessage, steps: Steps| Box::pin(handle(shop, work, m, steps));
            consumer
                .run_steps(handler, async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        }
    });
    println!("READY");
    futures_util::future::join_all(pollers).await;
    std::io::stdout().flush().unwrap();
}

/// What the parent reads of a consumer process's output.
#[derive(Default)]
struct Seen {
    started: AtomicU64,
    ended: AtomicU64,
    applied: AtomicU64,
    failed: AtomicU64,
}

/// A consumer process (killed when dropped), its stdin (closing it stops the process
/// gracefully) and what it says.
fn spawn(s: &Setup) -> (Process, Option<ChildStdin>, Arc<Seen>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "consumer_kill_child_entry", "--nocapture"])
        .env(CHILD, s.to_env())
        // The SDK's futures are large in a debug build.
        .env("RUST_MIN_STACK", "16777216")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (stdin, stdout) = (child.stdin.take(), child.stdout.take().unwrap());
    let seen = Arc::new(Seen::default());
    let counts = seen.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let counter = match line.split_once(' ').map(|(word, _)| word) {
                Some("START") => &counts.started,
                Some("APPLIED") => {
                    counts.applied.fetch_add(1, Ordering::SeqCst);
                    &counts.ended
                }
                Some("FAILED") => {
                    counts.failed.fetch_add(1, Ordering::SeqCst);
                    &counts.ended
                }
                _ => continue,
            };
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    (Process::new(child), stdin, seen)
}

/// Fails the test at once if a consumer process has exited (its stderr is in the test's).
fn alive(children: &mut [(Process, Option<ChildStdin>, Arc<Seen>)]) {
    for (child, _, _) in children {
        if let Some(status) = child.exited() {
            panic!("a consumer process exited with {status}: its output is above");
        }
    }
}

/// Most messages the producer lets wait in the queue: moto's SQS costs time in proportion to
/// a queue's length on every request, so the producer keeps pace with the consumers, as a
/// live one does.
const BACKLOG: u64 = 400;

/// Sends message `m-<n>` for every n < `total`, and a second copy of 30 % of them 37 messages
/// later (so that twins meet in other batches and processes, some while the first runs), never
/// more than [`BACKLOG`] ahead of the consumers; returns how many were sent twice.
async fn produce(client: &Client, url: &str, total: u64, deadline: Instant) -> u64 {
    let mut sends: Vec<(u64, String)> = (0..total)
        .flat_map(|n| {
            let again = twice(n).then(|| ((n + 37) * 2 + 1, format!("m-{n}")));
            std::iter::once((n * 2, format!("m-{n}"))).chain(again)
        })
        .collect();
    sends.sort();
    for chunk in sends.chunks(10) {
        wait_until(
            deadline,
            "the consumers did not keep up with the producer",
            || async {
                match left_in_queue(client, url).await {
                    n if n < BACKLOG => Ok(()),
                    n => Err(format!("{n} messages waiting")),
                }
            },
        )
        .await;
        let entries = chunk.iter().enumerate().map(|(i, (_, body))| {
            SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body)
                .build()
                .unwrap()
        });
        let out = client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries.collect()))
            .send()
            .await
            .unwrap();
        assert!(out.failed.is_empty(), "sends failed: {:?}", out.failed);
    }
    sends.len() as u64 - total
}

/// Waits (bounded by `deadline`) until `done`, polling every 200 ms; panics with `what` and
/// the last state otherwise.
async fn wait_until<F, Fut>(deadline: Instant, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    loop {
        match done().await {
            Ok(()) => return,
            Err(state) if Instant::now() >= deadline => panic!("{what}: {state}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn consume_with_a_kill(
    store: &str,
    db: String,
    endpoint: String,
    prefix: String,
    shape: Shape,
) {
    let total = messages();
    let scale = idem::conformance::time_scale();
    let client = sqs(&endpoint);
    let queue = client
        .create_queue()
        .queue_name(idem_test_support::unique_name("kill"))
        .attributes(QueueAttributeName::VisibilityTimeout, "2")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let setup = Setup {
        store: store.to_owned(),
        db,
        endpoint,
        queue: queue.clone(),
        prefix,
        shape,
    };
    let shop = Shop::open(&setup).await;
    shop.create_tables().await;
    let began = Instant::now();
    let first = if shape.alone_until_kill { 1 } else { PROCESSES };
    let mut children: Vec<_> = (0..first).map(|_| spawn(&setup)).collect();
    let limit = Instant::now() + Duration::from_secs_f64(scale * (120.0 + total as f64 * 0.1));
    // The first process is killed while its handlers run (at least `running_at_kill` of them),
    // once it applied 1/16 of the effects, as the producer goes on.
    let kill_after = (total / 16).max(1);
    let victim = children[0].2.clone();
    let children_ref = &mut children;
    let kill_point = async {
        wait_until(
            limit,
            "the first consumer never reached its kill point",
            || {
                alive(children_ref);
                let victim = victim.clone();
                async move {
                    let (started, ended) = (
                        victim.started.load(Ordering::SeqCst),
                        victim.ended.load(Ordering::SeqCst),
                    );
                    let applied = victim.applied.load(Ordering::SeqCst);
                    if applied >= kill_after && started - ended >= shape.running_at_kill {
                        Ok(())
                    } else {
                        Err(format!("{applied} applied, {} running", started - ended))
                    }
                }
            },
        )
        .await;
        children_ref[0].0.kill();
        (
            victim.applied.load(Ordering::SeqCst),
            victim.started.load(Ordering::SeqCst) - victim.ended.load(Ordering::SeqCst),
            began.elapsed(),
        )
    };
    let (killed_at, duplicates) = tokio::join!(kill_point, produce(&client, &queue, total, limit));
    children.extend((first..PROCESSES).map(|_| spawn(&setup)));

    // The survivors drain the queue.
    wait_until(limit, "the queue was not drained", || {
        alive(&mut children[1..]);
        let (shop, client, queue) = (&shop, &client, &queue);
        async move {
            // The queue first: reading the effects costs more.
            let left = left_in_queue(client, queue).await;
            if left > 0 {
                return Err(format!("{left} messages left in the queue"));
            }
            let (effects, _) = shop.effects().await;
            if effects.len() as u64 == total {
                Ok(())
            } else {
                Err(format!(
                    "{} of {total} messages applied, {left} messages left in the queue",
                    effects.len()
                ))
            }
        }
    })
    .await;
    let elapsed = began.elapsed();
    for (_, stdin, _) in &mut children[1..] {
        drop(stdin.take());
    }
    let stop_by = Instant::now() + Duration::from_secs_f64(scale * 30.0);
    for (child, _, _) in &mut children[1..] {
        loop {
            if let Some(status) = child.exited() {
                assert!(status.success(), "a consumer exited with {status}");
                break;
            }
            assert!(
                Instant::now() < stop_by,
                "a consumer did not shut down within {} s of its stdin closing",
                scale * 30.0
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let (effects, failures) = shop.effects().await;
    let counted: i64 = effects.values().sum();
    let twice_applied: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice_applied.is_empty(),
        "{store}: effects applied more than once: {twice_applied:?}"
    );
    for n in 0..total {
        assert!(
            effects.contains_key(&format!("m-{n}")),
            "{store}: m-{n} was never applied"
        );
    }
    assert_eq!(
        effects.len() as u64,
        total,
        "{store}: effects of unknown messages"
    );
    let planned: Vec<String> = (0..total)
        .filter(|n| fails_first(*n))
        .map(|n| format!("m-{n}"))
        .collect();
    let mut failures = failures;
    failures.sort();
    let mut expected = planned.clone();
    expected.sort();
    assert_eq!(
        failures, expected,
        "{store}: the planned first-attempt failures"
    );
    assert_eq!(
        left_in_queue(&client, &queue).await,
        0,
        "{store}: the queue is not empty"
    );
    let handled: u64 = children
        .iter()
        .map(|(_, _, s)| s.started.load(Ordering::SeqCst))
        .sum();
    println!(
        "consumer_kill {store}: {PROCESSES} processes of {} SQS receive loops of {} at once; {total} messages, {duplicates} sent twice ({} deliveries), \
         {counted} effects counted ({} messages, each exactly once), {} planned first-attempt \
         failures redelivered and applied once, {handled} handler runs; process 1 of {PROCESSES} \
         killed after {} effects with {} handlers running at {:.1} s; drained in {:.1} s",
        shape.pollers,
        shape.concurrency,
        total + duplicates,
        effects.len(),
        planned.len(),
        killed_at.0,
        killed_at.1,
        killed_at.2.as_secs_f64(),
        elapsed.as_secs_f64(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_every_effect_once_across_a_killed_consumer() {
    let Some(endpoint) = endpoint() else { return };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shop.db").to_string_lossy().into_owned();
    consume_with_a_kill(
        "sqlite",
        db,
        endpoint,
        "shop".into(),
        Shape::many_loops("sqlite"),
    )
    .await;
}

/// The same with one receive loop a process at the default concurrency (16), the first process
/// killed with more than 10 handlers running: more than one SQS receive hands out, so what it
/// held was a batch filled by receives that do not wait, or batches overlapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_every_effect_once_across_a_consumer_killed_past_ten_at_once() {
    let Some(endpoint) = endpoint() else { return };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shop.db").to_string_lossy().into_owned();
    let shape = Shape::one_loop_past_ten();
    consume_with_a_kill("sqlite", db, endpoint, "shop".into(), shape).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_every_effect_once_across_a_killed_consumer() {
    let Some(endpoint) = endpoint() else { return };
    let Some(url) = idem_test_support::setting(
        &idem_test_support::current_test(),
        "IDEM_TEST_PG_URL",
        "IDEM_REQUIRE_PG",
    ) else {
        return;
    };
    let prefix = idem_test_support::unique_name("kill").replace('-', "_");
    let shape = Shape::many_loops("postgres");
    consume_with_a_kill("postgres", url, endpoint, prefix, shape).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_every_effect_once_across_a_killed_consumer() {
    let Some(endpoint) = endpoint() else { return };
    let prefix = idem_test_support::unique_name("kill");
    let shape = Shape::many_loops("dynamodb");
    consume_with_a_kill("dynamodb", String::new(), endpoint, prefix, shape).await;
}
