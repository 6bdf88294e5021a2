//! Exactly-once effects on SQS: `SqsConsumer::run_steps` (docs/consumers.md, "Exactly-once
//! effects"). Orders arrive on a queue that delivers at least once; an order's effect is its
//! charge, a row in the `charges` table of the SQLite database that also keeps the idempotency
//! records, written as one transactional step: the row and the step's record commit together,
//! fenced by the message's claim. The producer sends 30 % of the orders twice, and one of the
//! three consumers is killed right after its first commit, before its message is deleted or its
//! result stored (its runtime torn down with its handlers running, as a process killed with
//! SIGKILL). The redelivery finds that step done and replays it without writing. It prints
//! `N orders, N charges` and fails if any order was charged twice or not at all.
//!
//! It needs SQS, or anything that speaks it (moto: `scripts/dynamo-server.sh` starts one that
//! serves SQS too), with credentials in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (AWS_REGION,
//! default us-east-1). The queue is created, used and deleted; the database is a file in a
//! temporary directory.
//!
//! ```text
//! AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
//!     cargo run --example sqs_steps --features sqs,sqlite -- --sqs-endpoint http://127.0.0.1:5000
//! ```

use std::sync::Mutex;
use std::time::Duration;

use idem::consumer::sqs::aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use idem::consumer::sqs::aws_sdk_sqs::types::{Message, QueueAttributeName};
use idem::consumer::sqs::aws_sdk_sqs::{Client, Config};
use idem::consumer::sqs::SqsConsumer;
use idem::consumer::Consumer;
use idem::sqlx::{self, Connection};
use idem::{Error, Idempotency, SqlSteps, SqliteStore, Steps};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

const ORDERS: usize = 60;
const CONSUMERS: usize = 3;
/// The messages' visibility timeout, and so the claims' lease.
const VISIBILITY: Duration = Duration::from_secs(2);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The handler: the order's charge, one row written in one transactional step. Its value (the
/// row's id) is the step's result, which a redelivery replays.
async fn charge(store: &SqliteStore, message: Message, steps: Steps) -> Result<i64, Error> {
    let order_id = message.body.unwrap_or_default();
    // The slow part (asking the payment provider, say) goes here, before the transaction:
    // SQLite holds its write lock from BEGIN IMMEDIATE to the commit.
    let mut conn = store.pool().acquire().await.map_err(idem::sql_error)?;
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(idem::sql_error)?;
    let charge_id = steps
        .tx(store, &mut tx, "charge", |tx| {
            Box::pin(async move {
                let row = sqlx::query("INSERT INTO charges (order_id) VALUES (?)")
                    .bind(order_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(idem::sql_error)?;
                Ok::<_, Error>(row.last_insert_rowid())
            })
        })
        .await?;
    tx.commit().await.map_err(idem::sql_error)?;
    Ok(charge_id)
}

/// A consumer of the queue until `stop` says so. With `killed`, every handler stops for good
/// after its commit, and the first says so on `killed`: the consumer to kill.
async fn consume(
    client: Client,
    queue_url: String,
    store: SqliteStore,
    killed: Option<oneshot::Sender<()>>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    let consumer = Consumer::new(Idempotency::new(store.clone()), "charge")?;
    let consumer = SqsConsumer::new(client, queue_url, consumer)
        // The order id: the producer's second send is a new message with the same key.
        .keyed_by(|m| m.body.clone())
        .visibility(VISIBILITY)
        .wait(Duration::from_secs(1));
    let doomed = killed.is_some();
    let killed = Mutex::new(killed);
    let (store, killed) = (&store, &killed);
    let handler = |message: Message, steps: Steps| async move {
        let charged = charge(store, message, steps).await?;
        if doomed {
            if let Some(killed) = killed.lock().ok().and_then(|mut k| k.take()) {
                let _ = killed.send(());
            }
            std::future::pending::<()>().await;
        }
        Ok::<_, Error>(charged)
    };
    consumer
        .run_steps(handler, async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        })
        .await;
    Ok(())
}

/// The messages left in the queue, visible or not.
async fn left(client: &Client, queue_url: &str) -> Result<u64, BoxError> {
    let out = client
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await?;
    let mut left = 0;
    for count in out.attributes.unwrap_or_default().values() {
        left += count.parse::<u64>()?;
    }
    Ok(left)
}

/// `(orders charged, charges made)`.
async fn charged(store: &SqliteStore) -> Result<(i64, i64), Error> {
    let counts = "SELECT COUNT(DISTINCT order_id), COUNT(*) FROM charges";
    Ok(sqlx::query_as(counts)
        .fetch_one(store.pool())
        .await
        .map_err(idem::sql_error)?)
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sqs_steps: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A runtime whose threads have room for the SDK's futures, large in a debug build.
fn new_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(16 << 20)
        .build()
}

fn run() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let endpoint = args
        .iter()
        .position(|a| a == "--sqs-endpoint")
        .and_then(|i| args.get(i + 1))
        .ok_or("give the SQS endpoint: --sqs-endpoint URL")?;
    let var = |name: &str| std::env::var(name).ok();
    let (id, secret) = var("AWS_ACCESS_KEY_ID")
        .zip(var("AWS_SECRET_ACCESS_KEY"))
        .ok_or("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")?;
    let region = var("AWS_REGION").unwrap_or_else(|| "us-east-1".into());
    let client = Client::from_conf(
        Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(Credentials::new(
                id,
                secret,
                var("AWS_SESSION_TOKEN"),
                None,
                "env",
            ))
            .endpoint_url(endpoint)
            .build(),
    );
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop.db");
    let runtime = new_runtime()?;
    let queue = format!("idem-sqs-steps-{}", std::process::id());
    let queue_url = runtime.block_on(async {
        let store = SqliteStore::open(&path).await?;
        sqlx::query("CREATE TABLE charges (id INTEGER PRIMARY KEY, order_id TEXT NOT NULL)")
            .execute(store.pool())
            .await?;
        let created = client.create_queue().queue_name(&queue).send().await?;
        let queue_url = created.queue_url.ok_or("SQS returned no queue URL")?;
        for i in 0..ORDERS {
            let order = format!("order-{i}");
            let copies = if i % 10 < 3 { 2 } else { 1 };
            for _ in 0..copies {
                let send = client.send_message().queue_url(&queue_url);
                send.message_body(&order).send().await?;
            }
        }
        Ok::<_, BoxError>(queue_url)
    })?;

    // The consumer to kill runs on a runtime of its own, with a store of its own over the same
    // file: a process of its own, as far as SQS and the store can tell.
    let (stop, _) = watch::channel(false);
    let doomed = new_runtime()?;
    let (killed, first_commit) = oneshot::channel();
    {
        let (client, queue_url, stopped) = (client.clone(), queue_url.clone(), stop.subscribe());
        let path = path.clone();
        doomed.spawn(async move {
            let store = SqliteStore::open(&path).await?;
            consume(client, queue_url, store, Some(killed), stopped).await
        });
    }
    let outcome = runtime.block_on(async {
        let store = SqliteStore::open(&path).await?;
        let mut running = Vec::new();
        for _ in 1..CONSUMERS {
            let run = consume(
                client.clone(),
                queue_url.clone(),
                store.clone(),
                None,
                stop.subscribe(),
            );
            running.push(tokio::spawn(run));
        }
        // Killed after its first commit: that message reappears when its visibility ends, and
        // the consumer that receives it takes the claim over, finds the step done, replays it.
        first_commit.await?;
        doomed.shutdown_background();
        println!("killed a consumer after its first commit");
        let give_up = Instant::now() + Duration::from_secs(120);
        while left(&client, &queue_url).await? > 0 {
            if Instant::now() > give_up {
                return Err("the queue was not drained within 2 minutes".into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.send_replace(true);
        for consumer in running {
            consumer.await??;
        }
        client.delete_queue().queue_url(&queue_url).send().await?;
        Ok::<_, BoxError>(charged(&store).await?)
    });
    let (orders, charges) = outcome?;
    println!("{orders} orders, {charges} charges");
    if (orders, charges) != (ORDERS as i64, ORDERS as i64) {
        return Err(
            format!("{ORDERS} orders sent, {orders} charged, {charges} charges made").into(),
        );
    }
    Ok(())
}
