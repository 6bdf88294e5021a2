//! The system of the article idem started from: orders arrive on a queue that delivers at least
//! once, consumers charge each order, and an idempotency table makes every order one charge.
//! Duplicates come from everywhere at once here: the producer sends 30 % of the orders twice, the
//! visibility timeout (1 s) is shorter than 10 % of the handlers (1.5 s), and one of the four
//! consumers is killed mid-batch (its runtime torn down with its handlers running, as a process
//! killed with SIGKILL). It prints `N orders, N charges`.
//!
//! With no flags it runs on its own: an in-process queue that hides received messages for their
//! visibility timeout and delivers them again when it ends, and an embedded SQLite store.
//!
//! ```text
//! cargo run --example sqs_consumer --features sqs,sqlite
//! ```
//!
//! Against SQS and DynamoDB (credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; any
//! endpoint, moto's too), with a queue (created if missing; start with an empty one) and a store
//! URL (the DynamoDB table is created if missing):
//!
//! ```text
//! cargo run --example sqs_consumer --features sqs,dynamodb -- \
//!     --sqs-endpoint https://sqs.eu-west-1.amazonaws.com --queue orders \
//!     --store dynamodb+https://dynamodb.eu-west-1.amazonaws.com
//! ```
//!
//! There, the four consumers run in this process and none is killed (kill one yourself: run two).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::consumer::sqs::{aws_sdk_sqs, SqsConsumer};
use idem::consumer::{Consumer, Disposition, Message};
use idem::store::url::{ConnectOptions, StoreUrl};
use idem::{Idempotency, Store};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

const ORDERS: usize = 200;
const CONSUMERS: usize = 4;
const VISIBILITY: Duration = Duration::from_secs(1);

#[derive(Serialize, Deserialize)]
struct Order {
    order_id: String,
    cents: u64,
    /// How long charging this order takes.
    millis: u64,
}

/// The payment provider: counts the charges it made, per order.
#[derive(Clone, Default)]
struct Payments(Arc<Mutex<HashMap<String, u32>>>);

impl Payments {
    fn charges(&self) -> u32 {
        self.0.lock().map(|m| m.values().sum()).unwrap_or(0)
    }

    fn orders(&self) -> usize {
        self.0.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// The handler: charges an order once per run.
    async fn charge(self, body: String) -> Result<String, String> {
        let order: Order = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(order.millis)).await;
        let mut charged = self.0.lock().map_err(|e| e.to_string())?;
        *charged.entry(order.order_id.clone()).or_default() += 1;
        Ok(format!(
            "charged {} cents for {}",
            order.cents, order.order_id
        ))
    }
}

/// The orders as the producer sends them: 30 % twice, 10 % slower than the visibility timeout.
fn orders() -> Vec<String> {
    let mut sent = Vec::new();
    for i in 0..ORDERS {
        let millis = if i % 10 == 3 { 1_500 } else { 50 };
        let order = Order {
            order_id: format!("order-{i}"),
            cents: 100 + i as u64,
            millis,
        };
        let body = serde_json::to_string(&order).unwrap_or_default();
        if i % 10 < 3 {
            sent.push(body.clone());
        }
        sent.push(body);
    }
    sent
}

/// The order id in a message: its key, so the producer's second send is caught too.
fn order_id(body: &str) -> Option<String> {
    serde_json::from_str::<Order>(body).ok().map(|o| o.order_id)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut message = e.to_string();
            let mut source = e.source();
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("sqs_consumer: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let runtime = tokio::runtime::Runtime::new()?;
    match (flag("--sqs-endpoint"), flag("--queue")) {
        (Some(endpoint), Some(queue)) => {
            let store = flag("--store").ok_or("--store URL is needed with --queue")?;
            runtime.block_on(on_sqs(&endpoint, &queue, &store))
        }
        (None, None) => on_local_queue(&runtime),
        _ => Err("give both --sqs-endpoint and --queue, or neither".into()),
    }
}

/// SQS and the store at `store`: four `SqsConsumer`s until every order is charged (or five
/// minutes pass).
async fn on_sqs(endpoint: &str, queue: &str, store: &str) -> Result<(), BoxError> {
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    let var = |name: &str| std::env::var(name).ok();
    let (id, secret) = var("AWS_ACCESS_KEY_ID")
        .zip(var("AWS_SECRET_ACCESS_KEY"))
        .ok_or("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")?;
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(
            var("AWS_REGION").unwrap_or_else(|| "us-east-1".into()),
        ))
        .credentials_provider(Credentials::new(
            id,
            secret,
            var("AWS_SESSION_TOKEN"),
            None,
            "env",
        ))
        .endpoint_url(endpoint)
        .build();
    let client = aws_sdk_sqs::Client::from_conf(config);
    let created = client.create_queue().queue_name(queue).send().await;
    let queue_url = created?.queue_url.ok_or("SQS returned no queue URL")?;
    let queue_url = queue_url.as_str();
    let options = ConnectOptions::new().create_table_if_missing(true);
    let store = StoreUrl::parse(store)?
        .connect(&options)
        .await?
        .into_store();
    for body in orders() {
        client
            .send_message()
            .queue_url(queue_url)
            .message_body(body)
            .send()
            .await?;
    }
    let payments = Payments::default();
    let (stop, _) = tokio::sync::watch::channel(false);
    let mut running = Vec::new();
    for _ in 0..CONSUMERS {
        let engine = Idempotency::from_arc(store.clone());
        let consumer =
            SqsConsumer::new(client.clone(), queue_url, Consumer::new(engine, "charge")?)
                .keyed_by(|m| m.body().and_then(order_id))
                .visibility(VISIBILITY)
                .wait(Duration::from_secs(1));
        let payments = payments.clone();
        let mut stopped = stop.subscribe();
        running.push(tokio::spawn(async move {
            let handler = move |m: aws_sdk_sqs::types::Message| {
                payments.clone().charge(m.body.unwrap_or_default())
            };
            consumer
                .run(handler, async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        }));
    }
    let give_up = Instant::now() + Duration::from_secs(300);
    while payments.orders() < ORDERS && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.send_replace(true);
    for consumer in running {
        consumer.await?;
    }
    println!(
        "{} orders, {} charges",
        payments.orders(),
        payments.charges()
    );
    Ok(())
}

/// An in-process queue with SQS's visibility timeout: a received message is hidden until its
/// timeout ends (or is extended), then delivered again unless it was deleted.
#[derive(Default)]
struct LocalQueue {
    messages: Mutex<Vec<Queued>>,
}

struct Queued {
    body: String,
    visible_at: Instant,
}

impl LocalQueue {
    fn send(&self, body: String) {
        if let Ok(mut q) = self.messages.lock() {
            q.push(Queued {
                body,
                visible_at: Instant::now(),
            });
        }
    }

    /// Up to 10 visible messages, as (index, body), hidden for `visibility`.
    fn receive(&self, visibility: Duration) -> Vec<(usize, String)> {
        let now = Instant::now();
        let Ok(mut q) = self.messages.lock() else {
            return Vec::new();
        };
        q.iter_mut()
            .enumerate()
            .filter(|(_, m)| m.visible_at <= now)
            .take(10)
            .map(|(i, m)| {
                m.visible_at = now + visibility;
                (i, m.body.clone())
            })
            .collect()
    }

    fn set_visibility(&self, index: usize, timeout: Duration) {
        if let Some(m) = self
            .messages
            .lock()
            .ok()
            .as_mut()
            .and_then(|q| q.get_mut(index))
        {
            m.visible_at = Instant::now() + timeout;
        }
    }

    /// Deleted messages are never visible again.
    fn delete(&self, index: usize) {
        self.set_visibility(index, Duration::from_secs(365 * 24 * 3600));
    }

    fn left(&self) -> usize {
        let far = Instant::now() + Duration::from_secs(24 * 3600);
        self.messages
            .lock()
            .map(|q| q.iter().filter(|m| m.visible_at < far).count())
            .unwrap_or(0)
    }
}

/// One consumer of the local queue, until it is drained: the loop `SqsConsumer` runs on SQS,
/// on the in-process queue.
async fn consume_local(
    queue: Arc<LocalQueue>,
    store: Arc<dyn Store>,
    payments: Payments,
    started: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<(), idem::Error> {
    let consumer = Consumer::new(Idempotency::from_arc(store), "charge")?.lease(VISIBILITY);
    // The first handler to start says so (the consumer to be killed waits for it).
    let started = Arc::new(Mutex::new(started));
    while queue.left() > 0 {
        let batch = queue.receive(VISIBILITY);
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let messages = batch
            .iter()
            .map(|(_, body)| match order_id(body) {
                Some(key) => Message::keyed(body.clone(), key),
                None => Message::unkeyed(body.clone()),
            })
            .collect();
        let (payments, started) = (payments.clone(), started.clone());
        let run = consumer.process(messages, move |body| {
            if let Some(started) = started.lock().ok().and_then(|mut s| s.take()) {
                let _ = started.send(());
            }
            payments.clone().charge(body)
        });
        let mut run = std::pin::pin!(run);
        let mut tick = tokio::time::interval_at(Instant::now() + VISIBILITY / 3, VISIBILITY / 3);
        // The visibility is extended as the engine renews the claims.
        let outcomes = loop {
            tokio::select! {
                outcomes = &mut run => break outcomes,
                _ = tick.tick() => batch.iter().for_each(|(i, _)| queue.set_visibility(*i, VISIBILITY)),
            }
        };
        for ((index, _), outcome) in batch.iter().zip(&outcomes) {
            match outcome.disposition() {
                Disposition::Acknowledge => queue.delete(*index),
                Disposition::Redeliver { after: Some(after) } => {
                    queue.set_visibility(*index, after)
                }
                Disposition::Redeliver { after: None } | Disposition::DeadLetter => {}
            }
        }
    }
    Ok(())
}

/// The in-process queue and SQLite: four consumers, one killed mid-batch.
fn on_local_queue(runtime: &tokio::runtime::Runtime) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("idem.db");
    let queue = Arc::new(LocalQueue::default());
    for body in orders() {
        queue.send(body);
    }
    let payments = Payments::default();

    // The consumer to be killed runs on a runtime of its own, with a store of its own over the
    // same file: a process of its own, as far as the store can tell.
    let doomed = tokio::runtime::Runtime::new()?;
    let (started, first_batch) = tokio::sync::oneshot::channel();
    {
        let (queue, payments, path) = (queue.clone(), payments.clone(), path.clone());
        doomed.spawn(async move {
            let store = idem::SqliteStore::open(&path).await?;
            consume_local(queue, Arc::new(store), payments, Some(started)).await
        });
    }
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(idem::SqliteStore::open(&path).await?);
        // Killed as its first batch's handlers run: what it claimed stays claimed until the
        // leases end, and what it received reappears when the visibility timeout ends.
        let _ = first_batch.await;
        doomed.shutdown_background();
        let mut consumers = Vec::new();
        for _ in 1..CONSUMERS {
            let run = consume_local(queue.clone(), store.clone(), payments.clone(), None);
            consumers.push(tokio::spawn(run));
        }
        for consumer in consumers {
            consumer.await??;
        }
        Ok::<_, BoxError>(())
    })?;
    println!(
        "{} orders, {} charges",
        payments.orders(),
        payments.charges()
    );
    Ok(())
}
