//! One node of the outbox loop (`tests/outbox_kill.rs`), run as a process so a test can
//! SIGKILL it.
//!
//! ```text
//! idem-outbox-node dispatch --producer sqlite:<path>, postgres:<url> or dynamodb:<endpoint>
//!                           --records T --outbox T
//!                           --broker sqs:<endpoint>|<queue url>, nats:<url>|<stream>
//!                                    or kafka:<bootstrap servers>|<topic>
//!                           [--lease-ms 2000] [--interval-ms 20]
//!     publishes the producer's outbox to the broker with a Dispatcher (spawned, under its
//!     lease), printing `ready`, then `published <n>` (this process's running total) after
//!     each run that published, until killed.
//! idem-outbox-node apply --broker … --pg <url> --records T --effects T [--lease-ms 5000]
//!     the receiving service: consumes the broker (SQS: the queue; NATS: the stream's durable
//!     consumer `apply`; Kafka: the topic, as the group `apply`), keyed by the outbox id, and applies each message's effect (a row in
//!     the effects table) in the same PostgreSQL transaction as its step record
//!     (`run_steps` + `steps.tx`), so a kill at any point applies it once. Prints `ready`,
//!     then runs until killed.
//! ```

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use idem::consumer::kafka::{rdkafka, KafkaConsumer, ID_HEADER};
use idem::consumer::nats::{async_nats, NatsConsumer};
use idem::consumer::sqs::aws_sdk_sqs::types::Message as SqsMessage;
use idem::consumer::sqs::{SqsConsumer, ID_ATTRIBUTE};
use idem::consumer::Consumer;
use idem::SqlSteps;
use idem_core::{Dispatcher, DispatcherConfig, Error, Idempotency, Steps};
use idem_sql::PostgresStore;
use idem_stress::outbox_loop::{sqs_client, BrokerSpec, Producer};

fn flags() -> Result<(String, HashMap<String, String>), String> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().ok_or("missing mode: dispatch or apply")?;
    let mut flags = HashMap::new();
    while let Some(flag) = args.next() {
        let name = flag
            .strip_prefix("--")
            .ok_or_else(|| format!("expected a --flag, got {flag:?}"))?;
        let value = args
            .next()
            .ok_or_else(|| format!("--{name} needs a value"))?;
        flags.insert(name.to_owned(), value);
    }
    Ok((mode, flags))
}

fn flag<'a>(flags: &'a HashMap<String, String>, name: &str) -> Result<&'a str, String> {
    flags
        .get(name)
        .map(String::as_str)
        .ok_or_else(|| format!("missing --{name}"))
}

fn millis(flags: &HashMap<String, String>, name: &str, default: u64) -> Result<Duration, String> {
    match flags.get(name) {
        None => Ok(Duration::from_millis(default)),
        Some(v) => v
            .parse()
            .map(Duration::from_millis)
            .map_err(|e| format!("--{name}: {e}")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let run = async {
        let (mode, flags) = flags()?;
        match mode.as_str() {
            "dispatch" => dispatch(&flags).await,
            "apply" => apply(&flags).await,
            other => Err(format!("unknown mode {other:?}: dispatch or apply")),
        }
    };
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem-outbox-node: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(flags: &HashMap<String, String>) -> Result<(), String> {
    let producer = Producer::parse(flag(flags, "producer")?)?;
    let broker = BrokerSpec::parse(flag(flags, "broker")?)?;
    let (store, outbox) = producer
        .open(flag(flags, "records")?, flag(flags, "outbox")?)
        .await
        .map_err(|e| e.to_string())?;
    let config = DispatcherConfig::new()
        .lease(millis(flags, "lease-ms", 2000)?)
        .interval(millis(flags, "interval-ms", 20)?);
    let dispatcher = Dispatcher::new(store, outbox, broker.publisher().await?, config)
        .map_err(|e| e.to_string())?;
    let mut handle = dispatcher.spawn();
    println!("ready");
    let mut total = 0;
    while let Some(report) = handle.next_report().await {
        if report.published > 0 {
            total += report.published;
            println!("published {total}");
        }
    }
    Err("the dispatcher stopped".into())
}

/// Applies one message's effect, once: its row in the effects table, committed with the
/// step's record.
async fn effect(
    store: &PostgresStore,
    effects: &str,
    steps: Steps,
    id: String,
    body: String,
) -> Result<(), Error> {
    let mut tx = store.pool().begin().await.map_err(idem::sql_error)?;
    let sql = format!("INSERT INTO \"{effects}\" (message_id, body) VALUES ($1, $2)");
    steps
        .tx(store, &mut tx, "apply", |tx| {
            Box::pin(async move {
                sqlx::query(&sql)
                    .bind(id)
                    .bind(body)
                    .execute(&mut *tx)
                    .await
                    .map_err(idem::sql_error)?;
                Ok::<(), Error>(())
            })
        })
        .await?;
    tx.commit().await.map_err(idem::sql_error)?;
    Ok(())
}

async fn apply(flags: &HashMap<String, String>) -> Result<(), String> {
    let broker = BrokerSpec::parse(flag(flags, "broker")?)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(flag(flags, "pg")?)
        .await
        .map_err(|e| e.to_string())?;
    let store = PostgresStore::builder()
        .pruner(None)
        .table(flag(flags, "records")?)
        .from_pool(pool)
        .await
        .map_err(|e| e.to_string())?;
    let lease = millis(flags, "lease-ms", 5000)?;
    let engine = Idempotency::builder(store.clone())
        .lease(lease)
        .build()
        .map_err(|e| e.to_string())?;
    let consumer = Consumer::new(engine, "apply")
        .map_err(|e| e.to_string())?
        .concurrency(16);
    let effects = flag(flags, "effects")?.to_owned();
    match broker {
        BrokerSpec::Sqs { endpoint, queue } => {
            let sqs = SqsConsumer::new(sqs_client(&endpoint), queue, consumer)
                .visibility(lease)
                .wait(Duration::from_secs(1));
            println!("ready");
            let handler = |m: SqsMessage, steps: Steps| {
                let id = m
                    .message_attributes()
                    .and_then(|a| a.get(ID_ATTRIBUTE))
                    .and_then(|v| v.string_value())
                    .unwrap_or_default()
                    .to_owned();
                let body = m.body().unwrap_or_default().to_owned();
                let (store, effects) = (store.clone(), effects.clone());
                async move { effect(&store, &effects, steps, id, body).await }
            };
            sqs.run_steps(handler, std::future::pending()).await;
        }
        BrokerSpec::Nats { url, stream } => {
            let client = async_nats::connect(&url).await.map_err(|e| e.to_string())?;
            let js = async_nats::jetstream::new(client);
            let pull = js
                .get_stream(&stream)
                .await
                .map_err(|e| e.to_string())?
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>("apply")
                .await
                .map_err(|e| e.to_string())?;
            let nats = NatsConsumer::new(consumer)
                .ack_wait(lease)
                .wait(Duration::from_secs(1));
            println!("ready");
            let handler = |m: async_nats::Message, steps: Steps| {
                let id = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                let body = String::from_utf8_lossy(&m.payload).into_owned();
                let (store, effects) = (store.clone(), effects.clone());
                async move { effect(&store, &effects, steps, id, body).await }
            };
            nats.run_steps(&pull, handler, std::future::pending()).await;
        }
        BrokerSpec::Kafka { servers, topic } => {
            use rdkafka::consumer::Consumer as _;
            use rdkafka::message::{Headers, Message as _};
            let stream: rdkafka::consumer::StreamConsumer =
                KafkaConsumer::<idem::JsonCodec>::client_config(&servers, "apply")
                    .set("session.timeout.ms", "6000")
                    .set("heartbeat.interval.ms", "200")
                    .create()
                    .map_err(|e| e.to_string())?;
            stream.subscribe(&[&topic]).map_err(|e| e.to_string())?;
            let kafka = KafkaConsumer::new(consumer).lease(lease);
            println!("ready");
            let handler = |m: rdkafka::message::OwnedMessage, steps: Steps| {
                let id = m
                    .headers()
                    .and_then(|h| h.iter().find(|h| h.key == ID_HEADER))
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                let body = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                let (store, effects) = (store.clone(), effects.clone());
                async move { effect(&store, &effects, steps, id, body).await }
            };
            kafka
                .run_steps(&stream, handler, std::future::pending())
                .await;
        }
    }
    Err("the consumer stopped".into())
}
