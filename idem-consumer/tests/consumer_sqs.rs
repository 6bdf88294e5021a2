//! The long-running SQS consumer against moto's SQS (the server scripts/test starts for
//! DynamoDB serves SQS too: IDEM_TEST_DYNAMODB_URL), standard and FIFO queues, on SQLite.
#![cfg(feature = "sqs")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{Idempotency, Key, SqliteStore, Store};
use idem_consumer::sqs::aws_sdk_sqs::types::{
    Message as SqsMessage, MessageSystemAttributeName, QueueAttributeName,
};
use idem_consumer::sqs::aws_sdk_sqs::Client;
use idem_consumer::sqs::SqsConsumer;
use idem_consumer::Consumer;
use tokio::sync::Semaphore;

mod support;
use std::sync::atomic::Ordering;
use support::sqs::{client, counting_client, endpoint, left_in_queue, FillReceives};
use support::AllAtOnce;

async fn queue(client: &Client, fifo: bool) -> String {
    let mut name = idem_test_support::unique_name("orders");
    let mut create = client.create_queue();
    if fifo {
        name.push_str(".fifo");
        create = create
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
    }
    create
        .queue_name(name)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap()
}

async fn send(client: &Client, url: &str, body: &str, group: Option<&str>) -> String {
    let mut send = client.send_message().queue_url(url).message_body(body);
    if let Some(group) = group {
        send = send.message_group_id(group).message_deduplication_id(body);
    }
    send.send().await.unwrap().message_id.unwrap()
}

/// The business table, a gate for "slow" orders, and orders that fail their first run.
#[derive(Clone)]
struct Shop {
    charges: idem_test_support::Tally,
    /// The orders in the order they were charged.
    log: Arc<Mutex<Vec<String>>>,
    failing: Arc<Mutex<Vec<String>>>,
    gate: Arc<Semaphore>,
}

impl Shop {
    fn new(failing: &[&str]) -> Shop {
        Shop {
            charges: Default::default(),
            log: Arc::default(),
            failing: Arc::new(Mutex::new(failing.iter().map(|s| s.to_string()).collect())),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    fn charged(&self, order: &str) -> u32 {
        self.charges.count(order)
    }

    fn handler(
        &self,
    ) -> impl Fn(
        SqsMessage,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
           + Clone
           + use<> {
        let shop = self.clone();
        move |m: SqsMessage| {
            let shop = shop.clone();
            let order = m.body().unwrap_or_default().to_owned();
            Box::pin(async move {
                {
                    let mut failing = shop.failing.lock().unwrap();
                    if let Some(at) = failing.iter().position(|f| *f == order) {
                        failing.remove(at);
                        return Err(format!("{order} failed once"));
                    }
                }
                if order.starts_with("slow") {
                    shop.gate.acquire().await.unwrap().forget();
                }
                shop.charges.add(&order);
                shop.log.lock().unwrap().push(order.clone());
                Ok(format!("charged {order}"))
            })
        }
    }
}

/// One receive from the queue at `url`: up to 10 messages, with their system attributes (the
/// FIFO group among them), waiting up to `wait_s` for one and hiding what it gets for
/// `visibility_s`.
async fn receive(client: &Client, url: &str, wait_s: i32, visibility_s: i32) -> Vec<SqsMessage> {
    client
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(wait_s)
        .visibility_timeout(visibility_s)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default()
}

async fn store() -> Arc<dyn Store> {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    std::mem::forget(dir);
    Arc::new(store)
}

fn consumer_on(client: &Client, url: &str, store: Arc<dyn Store>) -> SqsConsumer<idem::JsonCodec> {
    let consumer = Consumer::new(Idempotency::from_arc(store), "orders").unwrap();
    SqsConsumer::new(client.clone(), url, consumer)
        .visibility(Duration::from_secs(2))
        .wait(Duration::from_secs(1))
}

/// Runs `consumers` until every order is charged and the queue is empty (bounded), then shuts
/// them down gracefully.
async fn drain(
    consumers: Vec<SqsConsumer<idem::JsonCodec>>,
    shop: &Shop,
    client: &Client,
    url: &str,
    orders: &[&str],
) {
    let (stop, _) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for consumer in consumers {
        let mut stopped = stop.subscribe();
        let handler = shop.handler();
        tasks.push(tokio::spawn(async move {
            consumer
                .run(handler, async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        }));
    }
    let mut drained = false;
    for _ in 0..300 {
        if orders.iter().all(|o| shop.charged(o) >= 1) && left_in_queue(client, url).await == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send_replace(true);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a consumer did not shut down")
            .unwrap();
    }
    assert!(
        drained,
        "the queue was not drained: {:?}",
        shop.charges.snapshot()
    );
    for order in orders {
        assert_eq!(shop.charged(order), 1, "{order}");
    }
}

/// Two consumers (two engines over one store: two processes), a visibility timeout of 2 s and a
/// handler held for 3 s: the visibility is extended while it runs, so its message never goes
/// to the other consumer; a failure is left and runs again when it reappears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_queue_every_order_once_with_a_handler_longer_than_the_visibility() {
    let Some(endpoint) = endpoint() else { return };
    let client = client(&endpoint);
    let url = queue(&client, false).await;
    let orders = ["o1", "o2", "slow-3", "o4", "o5"];
    for order in orders {
        send(&client, &url, order, None).await;
    }
    let shop = Shop::new(&["o4"]);
    let store = store().await;
    let gate = shop.gate.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        gate.add_permits(1);
    });
    let consumers = vec![
        consumer_on(&client, &url, store.clone()),
        consumer_on(&client, &url, store),
    ];
    drain(consumers, &shop, &client, &url, &orders).await;
}

/// A message whose twin runs elsewhere is not deleted: its visibility is set to `retry_after`,
/// and once the other run stored its result it comes back and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_in_flight_elsewhere_comes_back_after_retry_after() {
    let Some(endpoint) = endpoint() else { return };
    let client = client(&endpoint);
    let url = queue(&client, false).await;
    let id = send(&client, &url, "o1", None).await;
    let store = store().await;
    // Another process holds the message's key.
    let elsewhere = Idempotency::from_arc(store.clone());
    let key = Key::derive("orders", "", &id).unwrap();
    let held = Arc::new(Semaphore::new(0));
    let claimed = Arc::new(Semaphore::new(0));
    let holder = {
        let (held, claimed) = (held.clone(), claimed.clone());
        tokio::spawn(async move {
            elsewhere
                .call(key)
                .run_detached(async move {
                    claimed.add_permits(1);
                    held.acquire().await.unwrap().forget();
                    Ok::<_, idem::Error>("charged o1".to_owned())
                })
                .await
                .unwrap()
        })
    };
    // Its work runs once its claim is won: from here the key is held.
    claimed.acquire().await.unwrap().forget();
    let shop = Shop::new(&[]);
    let consumer = consumer_on(&client, &url, store);
    let received = receive(&client, &url, 1, 2).await;
    assert_eq!(received.len(), 1);
    let outcomes = consumer.process(received, &shop.handler()).await;
    assert_eq!(outcomes[0].as_str(), "in_flight");
    assert_eq!(
        left_in_queue(&client, &url).await,
        1,
        "an in-flight twin was deleted"
    );
    held.add_permits(1);
    assert!(!holder.await.unwrap().is_replayed());
    // It comes back after retry_after, replays the other run's result, and is deleted.
    drain(vec![consumer], &shop, &client, &url, &[]).await;
    assert_eq!(
        shop.charged("o1"),
        0,
        "the handler ran although the other run had stored its result"
    );
}

/// A FIFO queue: a group stops at its failed message; it and its successors stay in the queue
/// (not deleted) and run when they come back; every order once. (moto does not keep a group's
/// order on redelivery as SQS does, so the order after the failure is not checked here; the
/// batch API's FIFO tests check the stop itself.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_queue_stops_a_group_at_its_failure() {
    let Some(endpoint) = endpoint() else { return };
    let client = client(&endpoint);
    let url = queue(&client, true).await;
    let orders = ["a1", "a2", "a3", "b1", "b2"];
    for order in orders {
        send(&client, &url, order, Some(&order[..1])).await;
    }
    let shop = Shop::new(&["a2"]);
    let consumer = consumer_on(&client, &url, store().await);
    let received = receive(&client, &url, 1, 2).await;
    let bodies: Vec<&str> = received
        .iter()
        .map(|m| m.body().unwrap_or_default())
        .collect();
    assert_eq!(bodies, orders);
    let outcomes = consumer.process(received, &shop.handler()).await;
    let names: Vec<&str> = outcomes.iter().map(|o| o.as_str()).collect();
    assert_eq!(names, ["done", "failed", "not_processed", "done", "done"]);
    assert_eq!(
        left_in_queue(&client, &url).await,
        2,
        "a2 and a3 stay in the queue"
    );
    drain(vec![consumer], &shop, &client, &url, &orders).await;
}

/// SQS gives at most 10 messages a receive, and a batch runs whole before the next: the
/// consumer fills its batch up to its concurrency with receives that do not wait, so 16 handlers
/// run at once. Each waits (bounded) until all 16 have started; with batches of 10 none would
/// get there. The batch of 16 is then settled in requests of at most 10, and the queue drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_fills_up_to_the_consumers_concurrency() {
    const AT_ONCE: usize = 16;
    let Some(endpoint) = endpoint() else { return };
    let client = client(&endpoint);
    let url = queue(&client, false).await;
    let orders: Vec<String> = (0..AT_ONCE).map(|i| format!("o{i}")).collect();
    for order in &orders {
        send(&client, &url, order, None).await;
    }
    let consumer = Consumer::new(Idempotency::from_arc(store().await), "orders")
        .unwrap()
        .concurrency(AT_ONCE);
    let fills = FillReceives::default();
    let consumer = SqsConsumer::new(counting_client(&endpoint, &fills), &url, consumer)
        .visibility(Duration::from_secs(2))
        .wait(Duration::from_secs(1));
    let shop = AllAtOnce::new(AT_ONCE);
    let handler = {
        let shop = shop.clone();
        move |m: SqsMessage| {
            let shop = shop.clone();
            async move { shop.meet(m.body().unwrap_or_default().to_owned()).await }
        }
    };
    let (stop, run) =
        support::spawn_run(move |shutdown| async move { consumer.run(handler, shutdown).await });
    let mut drained = false;
    for _ in 0..600 {
        if shop.alone() > 0 {
            break;
        }
        if shop.each_once(&orders) && left_in_queue(&client, &url).await == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    support::stop(stop, run).await;
    assert_eq!(
        shop.alone(),
        0,
        "handlers waited in vain for {AT_ONCE} at once"
    );
    assert!(
        drained,
        "the queue was not drained: {:?}",
        shop.charges.snapshot()
    );
    assert!(
        fills.0.load(Ordering::SeqCst) >= 1,
        "no receive filled the batch"
    );
}

/// A slow message holds up its own batch's settling, not the queue: the consumer runs four at
/// once, and "slow" (sent first) waits, bounded, until the ten orders sent after it are
/// charged. The loop receives them while it waits, as the messages of its batch that finished
/// free their room; were a batch to run whole before the next receive, they would never come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_message_holds_up_its_batch_not_the_queue() {
    let Some(endpoint) = endpoint() else { return };
    let client = client(&endpoint);
    let url = queue(&client, false).await;
    let orders: Vec<String> = (0..10).map(|i| format!("o{i}")).collect();
    send(&client, &url, "slow", None).await;
    for order in &orders {
        send(&client, &url, order, None).await;
    }
    let consumer = Consumer::new(Idempotency::from_arc(store().await), "orders")
        .unwrap()
        .concurrency(4);
    let consumer = SqsConsumer::new(client.clone(), &url, consumer)
        .visibility(Duration::from_secs(30))
        .wait(Duration::from_secs(1));
    let charges = idem_test_support::Tally::default();
    let others = Arc::new(Semaphore::new(0));
    let handler = {
        let (charges, others) = (charges.clone(), others.clone());
        move |m: SqsMessage| {
            let (charges, others) = (charges.clone(), others.clone());
            async move {
                let order = m.body().unwrap_or_default().to_owned();
                if order == "slow" {
                    let bound = idem::conformance::scaled(Duration::from_secs(20));
                    match tokio::time::timeout(bound, others.acquire_many(10)).await {
                        Ok(Ok(permits)) => permits.forget(),
                        _ => {
                            charges.add("waited in vain");
                            return Err(format!("{order}: the other ten never ran"));
                        }
                    }
                } else {
                    others.add_permits(1);
                }
                charges.add(&order);
                Ok::<_, String>(order)
            }
        }
    };
    let (stop, run) =
        support::spawn_run(move |shutdown| async move { consumer.run(handler, shutdown).await });
    let mut all: Vec<String> = orders.clone();
    all.push("slow".to_owned());
    let mut drained = false;
    for _ in 0..600 {
        if charges.count("waited in vain") > 0 {
            break;
        }
        if all.iter().all(|o| charges.count(o) == 1) && left_in_queue(&client, &url).await == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    support::stop(stop, run).await;
    assert_eq!(
        charges.count("waited in vain"),
        0,
        "the orders after the slow one were not received while it ran"
    );
    assert!(
        drained,
        "the queue was not drained: {:?}",
        charges.snapshot()
    );
}

/// A receive that comes back short (3 messages where 10 were asked for) ends the batch: a
/// shallow queue costs no receive beyond the long poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_receive_is_not_topped_up() {
    let Some(endpoint) = endpoint() else { return };
    let client = client(&endpoint);
    let url = queue(&client, false).await;
    let orders = ["o1", "o2", "o3"];
    for order in orders {
        send(&client, &url, order, None).await;
    }
    let fills = FillReceives::default();
    let consumer = Consumer::new(Idempotency::from_arc(store().await), "orders").unwrap();
    let consumer = SqsConsumer::new(counting_client(&endpoint, &fills), &url, consumer)
        .visibility(Duration::from_secs(2))
        .wait(Duration::from_secs(1));
    let shop = Shop::new(&[]);
    drain(vec![consumer], &shop, &client, &url, &orders).await;
    assert_eq!(
        fills.0.load(Ordering::SeqCst),
        0,
        "receives made to top up a batch that came back short"
    );
}

/// While a handler runs past the visibility timeout (2 s; held 5 s), its message stays
/// invisible: the consumer extends the visibility as the engine renews the claim. Without the
/// extension a receive would get the message after 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_handler_keeps_its_message_invisible() {
    let Some(endpoint) = endpoint() else { return };
    let client = client(&endpoint);
    let url = queue(&client, false).await;
    send(&client, &url, "slow-1", None).await;
    let shop = Shop::new(&[]);
    let consumer = consumer_on(&client, &url, store().await);
    let received = receive(&client, &url, 1, 2).await;
    assert_eq!(received.len(), 1);
    let handler = shop.handler();
    let batch = tokio::spawn(async move { consumer.process(received, &handler).await });
    // Another consumer polls for 5 s, 2.5 visibility timeouts, while the handler is held.
    let watched_until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < watched_until {
        let seen = receive(&client, &url, 0, 0).await;
        assert!(
            seen.is_empty(),
            "the message reappeared while its handler ran"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    shop.gate.add_permits(1);
    let outcomes = batch.await.unwrap();
    assert_eq!(outcomes[0].as_str(), "done", "{:?}", outcomes[0]);
    assert_eq!(
        left_in_queue(&client, &url).await,
        0,
        "the done message was not deleted"
    );
    assert_eq!(shop.charged("slow-1"), 1);
}

/// A message whose key was left uncertain by a consumer that died mid-charge (its claim made
/// with `OnLapse::Uncertain`, lapsed with no result): the redelivery is `uncertain`, its
/// handler does not run and it is not deleted (the queue's redrive policy moves it to the
/// dead-letter queue; nothing acknowledges it). Once an operator resolves the operation as
/// failed, the next delivery runs it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_message_is_dead_lettered_until_resolved() {
    let Some(endpoint) = endpoint() else { return };
    let client = client(&endpoint);
    let url = queue(&client, false).await;
    let id = send(&client, &url, "o1", None).await;
    let store = store().await;
    let lease = Duration::from_millis(300);
    // The consumer that died inside the charge.
    let dead = Idempotency::builder(store.clone())
        .lease(lease)
        .build()
        .unwrap();
    let key = Key::derive("orders", "", &id).unwrap();
    let idem::CallClaim::Claimed(_) = dead
        .call(key)
        .on_lapse(idem::OnLapse::Uncertain)
        .claim()
        .await
        .unwrap()
    else {
        panic!("a new key is claimed")
    };
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let shop = Shop::new(&[]);
    let consumer = consumer_on(&client, &url, store.clone());
    let received = receive(&client, &url, 1, 1).await;
    assert_eq!(received.len(), 1);
    let outcomes = consumer.process(received, &shop.handler()).await;
    assert_eq!(outcomes[0].as_str(), "uncertain");
    assert!(matches!(
        outcomes[0].disposition(),
        idem_consumer::Disposition::DeadLetter
    ));
    assert_eq!(shop.charged("o1"), 0, "an uncertain message ran");
    assert_eq!(
        left_in_queue(&client, &url).await,
        1,
        "an uncertain message was deleted"
    );
    dead.resolve(&key, idem::Resolution::Failed).await.unwrap();
    drain(vec![consumer], &shop, &client, &url, &["o1"]).await;
}
