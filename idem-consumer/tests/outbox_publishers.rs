//! The outbox publishers against real brokers: SQS on moto (a FIFO queue and a standard one)
//! and NATS JetStream on nats-server. The dispatcher publishes a SQLite outbox's messages; one is
//! then published again, as a dispatcher that crashed after the broker's acknowledgement and
//! before marking it sent would. The FIFO queue and the stream drop the second copy by its id;
//! the standard queue delivers it, and the consumer, keyed by the outbox id by default, replays
//! it instead of applying it twice. Every effect happens once, each aggregate's in order.
#![cfg(all(feature = "sqs", feature = "nats"))]

use std::sync::Arc;
use std::time::Duration;

use idem::consumer::Consumer;
use idem::{
    Dispatcher, DispatcherConfig, Idempotency, Key, MessageId, OutboxMessage, OutboxSource,
    Publisher, SqliteOutbox, SqliteStore,
};
use idem_consumer::nats::NatsPublisher;
use idem_consumer::sqs::aws_sdk_sqs::types::{Message as SqsMessage, QueueAttributeName};
use idem_consumer::sqs::{SqsConsumer, SqsPublisher, ID_ATTRIBUTE};

mod support;
use support::sqs::{client, endpoint};

/// A SQLite store (for the dispatcher's lease and the consumer's records) and its outbox with
/// two messages of order o-1 and one of o-2, committed.
async fn outbox(dir: &std::path::Path) -> (SqliteStore, Arc<SqliteOutbox>, Vec<OutboxMessage>) {
    let store = SqliteStore::open(dir.join("idem.db")).await.unwrap();
    let outbox = SqliteOutbox::new(store.pool().clone(), "outbox")
        .await
        .unwrap();
    let key = |op: &str| Key::derive("orders", "", op).unwrap();
    let messages = vec![
        OutboxMessage::new(
            MessageId::derive(&key("op-1"), "placed"),
            "order",
            "o-1",
            "placed",
            br#"{"order":"o-1","n":1}"#.to_vec(),
        )
        .unwrap(),
        OutboxMessage::new(
            MessageId::derive(&key("op-2"), "paid"),
            "order",
            "o-1",
            "paid",
            br#"{"order":"o-1","n":2}"#.to_vec(),
        )
        .unwrap(),
        OutboxMessage::new(
            MessageId::derive(&key("op-3"), "placed"),
            "order",
            "o-2",
            "placed",
            br#"{"order":"o-2","n":1}"#.to_vec(),
        )
        .unwrap(),
    ];
    let mut tx = store.pool().begin().await.unwrap();
    assert_eq!(outbox.add(&mut tx, &messages).await.unwrap(), 3);
    tx.commit().await.unwrap();
    (store, Arc::new(outbox), messages)
}

/// Publishes the outbox, then the first message once more (the crash's re-publish).
async fn dispatch(
    store: &SqliteStore,
    outbox: &Arc<SqliteOutbox>,
    publisher: Arc<dyn Publisher>,
    first: &OutboxMessage,
) {
    let dispatcher = Dispatcher::new(
        Arc::new(store.clone()),
        outbox.clone(),
        publisher.clone(),
        DispatcherConfig::new(),
    )
    .unwrap();
    let report = dispatcher.run_once().await.unwrap();
    assert_eq!((report.published, report.failed), (3, 0));
    assert!(outbox.pending(10).await.unwrap().is_empty());
    publisher.publish(first).await.unwrap();
}

/// Everything in `url`: receives until two receives in a row come back empty (bounded).
async fn drain(client: &idem_consumer::sqs::aws_sdk_sqs::Client, url: &str) -> Vec<SqsMessage> {
    let mut got = Vec::new();
    let mut empty = 0;
    for _ in 0..20 {
        let out = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .message_attribute_names(ID_ATTRIBUTE)
            .send()
            .await
            .unwrap();
        let batch = out.messages.unwrap_or_default();
        if batch.is_empty() {
            empty += 1;
            if empty == 2 {
                break;
            }
            continue;
        }
        empty = 0;
        got.extend(batch);
    }
    got
}

/// What the receiving service applied: each body, counted.
fn applied(effects: &idem_test_support::Tally, bodies: &[&str]) -> Vec<u32> {
    bodies.iter().map(|b| effects.count(b)).collect()
}

async fn sqs_loop(fifo: bool) {
    let Some(endpoint) = endpoint() else { return };
    let client = client(&endpoint);
    let mut name = idem_test_support::unique_name("events");
    let mut create = client.create_queue();
    if fifo {
        name.push_str(".fifo");
        create = create
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
    }
    let url = create
        .queue_name(name)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (store, outbox, messages) = outbox(dir.path()).await;
    let publisher = Arc::new(SqsPublisher::new(client.clone(), &url));
    dispatch(&store, &outbox, publisher, &messages[0]).await;

    let received = drain(&client, &url).await;
    let ids: Vec<&str> = received
        .iter()
        .filter_map(|m| m.message_attributes()?.get(ID_ATTRIBUTE)?.string_value())
        .collect();
    assert_eq!(
        ids.len(),
        if fifo { 3 } else { 4 },
        "FIFO drops the second copy: {ids:?}"
    );
    let bodies: Vec<&str> = received.iter().filter_map(|m| m.body()).collect();
    if fifo {
        let o1: Vec<&&str> = bodies.iter().filter(|b| b.contains("o-1")).collect();
        assert_eq!(
            o1,
            [&r#"{"order":"o-1","n":1}"#, &r#"{"order":"o-1","n":2}"#]
        );
    }

    // The receiving service, keyed by the outbox id (the default), applies each effect once.
    let effects = idem_test_support::Tally::default();
    let consumer = SqsConsumer::new(
        client.clone(),
        &url,
        Consumer::new(Idempotency::new(store.clone()), "apply").unwrap(),
    );
    let counted = effects.clone();
    let handler = move |m: SqsMessage| {
        let counted = counted.clone();
        async move {
            counted.add(m.body().unwrap_or_default());
            Ok::<_, std::io::Error>(())
        }
    };
    consumer.process(received, &handler).await;
    let want = [
        r#"{"order":"o-1","n":1}"#,
        r#"{"order":"o-1","n":2}"#,
        r#"{"order":"o-2","n":1}"#,
    ];
    assert_eq!(applied(&effects, &want), [1, 1, 1]);
}

#[tokio::test]
async fn sqs_fifo_drops_the_republished_copy() {
    sqs_loop(true).await;
}

#[tokio::test]
async fn sqs_standard_consumer_replays_the_republished_copy() {
    sqs_loop(false).await;
}

#[tokio::test]
async fn nats_stream_drops_the_republished_copy() {
    use idem_consumer::nats::async_nats::{self, jetstream};
    use idem_consumer::nats::NatsConsumer;
    let Some(url) = idem_test_support::setting(
        "nats_stream_drops_the_republished_copy",
        "IDEM_TEST_NATS_URL",
        "IDEM_REQUIRE_NATS",
    ) else {
        return;
    };
    let js = jetstream::new(async_nats::connect(&url).await.unwrap());
    let prefix = idem_test_support::unique_name("events").replace(['-', '.'], "_");
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: prefix.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (store, outbox, messages) = outbox(dir.path()).await;
    let publisher = Arc::new(NatsPublisher::new(js.clone(), &prefix));
    dispatch(&store, &outbox, publisher, &messages[0]).await;
    let mut stream = stream;
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        3,
        "the stream drops the copy"
    );

    let pull = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("apply".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut fetched = Vec::new();
    for _ in 0..10 {
        use futures_util::StreamExt;
        let mut batch = pull
            .fetch()
            .max_messages(10)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .unwrap();
        while let Some(m) = batch.next().await {
            fetched.push(m.unwrap());
        }
        if fetched.len() >= 3 {
            break;
        }
    }
    let subjects: Vec<String> = fetched.iter().map(|m| m.subject.to_string()).collect();
    assert!(
        subjects.iter().all(|s| *s == format!("{prefix}.order")),
        "{subjects:?}"
    );
    let effects = idem_test_support::Tally::default();
    let counted = effects.clone();
    let handler = move |m: async_nats::Message| {
        let counted = counted.clone();
        async move {
            counted.add(&String::from_utf8_lossy(&m.payload));
            Ok::<_, std::io::Error>(())
        }
    };
    let consumer = NatsConsumer::new(Consumer::new(Idempotency::new(store), "apply").unwrap());
    consumer.process(fetched, &handler).await;
    let want = [
        r#"{"order":"o-1","n":1}"#,
        r#"{"order":"o-1","n":2}"#,
        r#"{"order":"o-2","n":1}"#,
    ];
    assert_eq!(applied(&effects, &want), [1, 1, 1]);
}
