//! The Kafka consumer against librdkafka's own mock cluster (`rdkafka::mocking::MockCluster`:
//! the Kafka protocol, consumer groups and offset commits included, served in-process by the
//! librdkafka the consumer links), so nothing is to be started and no test skips: in-order
//! processing per partition, a redelivery after a consumer died before committing, a committed
//! offset that never passes a message not final, a twin in flight retried until it completes
//! or lapses, poison to the dead-letter topic or stopping its partition, and `run_steps`.
//!
//! Every wait is a bounded poll of an observable fact (a handler's count, the group's
//! committed offset, an engine event), never a sleep for things to settle.
#![cfg(feature = "kafka")]

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{CallEvent, Idempotency, Key, ManualClock, MemoryStore, Stage};
use idem_consumer::kafka::rdkafka::config::ClientConfig;
use idem_consumer::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _, StreamConsumer};
use idem_consumer::kafka::rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use idem_consumer::kafka::rdkafka::mocking::MockCluster;
use idem_consumer::kafka::rdkafka::producer::{
    DefaultProducerContext, FutureProducer, FutureRecord,
};
use idem_consumer::kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use idem_consumer::kafka::rdkafka::Message as _;
use idem_consumer::kafka::KafkaConsumer;
use idem_consumer::Consumer;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;

const TOPIC: &str = "orders";
const DEAD: &str = "orders.dead";

/// A mock cluster of 3 brokers with `orders` (of `partitions` partitions) and `orders.dead`,
/// and a producer to it.
struct Cluster {
    mock: MockCluster<'static, DefaultProducerContext>,
    producer: FutureProducer,
}

impl Cluster {
    fn new(partitions: i32) -> Cluster {
        let mock = MockCluster::new(3).unwrap();
        mock.create_topic(TOPIC, partitions, 3).unwrap();
        mock.create_topic(DEAD, 1, 3).unwrap();
        let producer = ClientConfig::new()
            .set("bootstrap.servers", mock.bootstrap_servers())
            .create()
            .unwrap();
        Cluster { mock, producer }
    }

    /// Produces `payload` to a partition of `orders` (with an `idem-id` header if given);
    /// returns its offset.
    async fn send(&self, partition: i32, payload: &str, id: Option<&str>) -> i64 {
        let mut record = FutureRecord::<(), str>::to(TOPIC)
            .partition(partition)
            .payload(payload);
        if let Some(id) = id {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: "idem-id",
                value: Some(id),
            }));
        }
        let delivery = self.producer.send(record, Duration::from_secs(10)).await;
        delivery.map_err(|(e, _)| e).unwrap().offset
    }

    /// A consumer of the group `group` subscribed to `topic`.
    fn stream(&self, group: &str, topic: &str) -> Arc<StreamConsumer> {
        let stream: StreamConsumer =
            KafkaConsumer::<idem::JsonCodec>::client_config(&self.mock.bootstrap_servers(), group)
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "200")
                .create()
                .unwrap();
        stream.subscribe(&[topic]).unwrap();
        Arc::new(stream)
    }

    /// The offset the group committed for a partition of `orders`, if any. A client of its
    /// own that never joins the group: it only asks the coordinator.
    async fn committed(&self, group: &str, partition: i32) -> Option<i64> {
        let reader: BaseConsumer =
            KafkaConsumer::<idem::JsonCodec>::client_config(&self.mock.bootstrap_servers(), group)
                .create()
                .unwrap();
        tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(TOPIC, partition);
            let committed = reader
                .committed_offsets(tpl, Duration::from_secs(10))
                .ok()?;
            match committed.find_partition(TOPIC, partition)?.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            }
        })
        .await
        .unwrap()
    }

    /// Every record of the dead-letter topic, read by a group of its own until `n` came.
    async fn dead_letters(&self, n: usize) -> Vec<OwnedMessage> {
        let stream = self.stream("dead-reader", DEAD);
        let mut out = Vec::new();
        while out.len() < n {
            let next = tokio::time::timeout(Duration::from_secs(30), stream.recv()).await;
            out.push(next.expect("a dead letter in time").unwrap().detach());
        }
        out
    }
}

/// Polls `fact` until it holds: every 20 ms, for 30 s at most.
async fn until<F: Future<Output = bool>>(what: &str, mut fact: impl FnMut() -> F) {
    for _ in 0..1500 {
        if fact().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting until {what}");
}

type Work = Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;

/// The business side: how often each payload's handler ran and finished, in what order per
/// partition; payloads in `failing` fail while it is set, those in `gated` wait for the gate.
#[derive(Clone)]
struct Shop {
    started: Arc<Mutex<HashMap<String, u32>>>,
    charged: Arc<Mutex<HashMap<String, u32>>>,
    order: Arc<Mutex<HashMap<i32, Vec<i64>>>>,
    failing: Arc<Mutex<Vec<String>>>,
    gated: Arc<Mutex<Vec<String>>>,
    gate: Arc<Semaphore>,
}

impl Default for Shop {
    fn default() -> Shop {
        Shop {
            started: Arc::default(),
            charged: Arc::default(),
            order: Arc::default(),
            failing: Arc::default(),
            gated: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Shop {
    fn started(&self, payload: &str) -> u32 {
        self.started
            .lock()
            .unwrap()
            .get(payload)
            .copied()
            .unwrap_or(0)
    }

    fn charged(&self, payload: &str) -> u32 {
        self.charged
            .lock()
            .unwrap()
            .get(payload)
            .copied()
            .unwrap_or(0)
    }

    fn handler(&self) -> impl Fn(OwnedMessage) -> Work + Send + Sync + Clone + 'static + use<> {
        let shop = self.clone();
        move |m: OwnedMessage| {
            let shop = shop.clone();
            let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            Box::pin(async move {
                *shop
                    .started
                    .lock()
                    .unwrap()
                    .entry(payload.clone())
                    .or_default() += 1;
                if shop.gated.lock().unwrap().contains(&payload) {
                    shop.gate.acquire().await.unwrap().forget();
                }
                if shop.failing.lock().unwrap().contains(&payload) {
                    return Err(format!("{payload} failed"));
                }
                let mut order = shop.order.lock().unwrap();
                order.entry(m.partition()).or_default().push(m.offset());
                *shop
                    .charged
                    .lock()
                    .unwrap()
                    .entry(payload.clone())
                    .or_default() += 1;
                Ok(format!("charged {payload}"))
            })
        }
    }
}

/// Counts the engine's events by stage.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<HashMap<String, u32>>>);

impl Events {
    fn count(&self, stage: Stage) -> u32 {
        let name = format!("{stage:?}");
        self.0.lock().unwrap().get(&name).copied().unwrap_or(0)
    }

    fn engine(&self, store: MemoryStore) -> Idempotency {
        let events = self.clone();
        Idempotency::builder(store)
            .observer(move |e: &CallEvent<'_>| {
                *events
                    .0
                    .lock()
                    .unwrap()
                    .entry(format!("{:?}", e.stage()))
                    .or_default() += 1;
            })
            .build()
            .unwrap()
    }
}

/// A running `KafkaConsumer::run`, stopped by `stop`.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    fn start(
        kafka: KafkaConsumer<idem::JsonCodec>,
        stream: Arc<StreamConsumer>,
        shop: &Shop,
    ) -> Running {
        let (stop, stopped) = oneshot::channel::<()>();
        let handler = shop.handler();
        let task = tokio::spawn(async move {
            kafka
                .run(&stream, handler, async {
                    let _ = stopped.await;
                })
                .await
        });
        Running { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the consumer stopped in time")
            .unwrap();
    }
}

/// A Kafka consumer of scope `charge`, quick to retry.
fn kafka(engine: Idempotency) -> KafkaConsumer<idem::JsonCodec> {
    KafkaConsumer::new(Consumer::new(engine, "charge").unwrap())
        .backoff(Duration::from_millis(5))
        .max_backoff(Duration::from_millis(20))
}

/// Three partitions of 30 messages each: each partition's messages run one after another in
/// offset order, each once, and each partition's offset is committed to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_partition_runs_in_order() {
    let cluster = Cluster::new(3);
    for i in 0..30 {
        for p in 0..3 {
            cluster.send(p, &format!("p{p}-{i}"), None).await;
        }
    }
    let shop = Shop::default();
    let engine = Idempotency::new(MemoryStore::new());
    let running = Running::start(
        kafka(engine).batch(7),
        cluster.stream("charger", TOPIC),
        &shop,
    );
    for p in 0..3 {
        until("every partition is committed to its end", || async {
            cluster.committed("charger", p).await == Some(30)
        })
        .await;
    }
    running.stop().await;
    let order = shop.order.lock().unwrap().clone();
    for p in 0..3 {
        assert_eq!(
            order[&p],
            (0..30).collect::<Vec<i64>>(),
            "partition {p} out of order"
        );
        for i in 0..30 {
            assert_eq!(shop.charged(&format!("p{p}-{i}")), 1);
        }
    }
}

/// A consumer that dies after its handlers ran but before it committed: the next consumer of
/// the group gets the messages again, and they replay without running the handler again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_replays() {
    let cluster = Cluster::new(1);
    for i in 0..5 {
        cluster.send(0, &format!("o-{i}"), None).await;
    }
    let shop = Shop::default();
    shop.gated.lock().unwrap().push("o-4".into());
    let events = Events::default();
    let engine = events.engine(MemoryStore::new());
    // The first consumer runs o-0..o-3 and is killed while o-4's handler runs: o-4's batch is
    // never settled, so its offset is never committed.
    let first = Running::start(
        kafka(engine.clone()),
        cluster.stream("charger", TOPIC),
        &shop,
    );
    until("o-4's handler started", || async {
        shop.started("o-4") == 1
    })
    .await;
    first.task.abort();
    let _ = first.task.await;
    let committed = cluster.committed("charger", 0).await.unwrap_or(0);
    assert!(
        committed <= 4,
        "committed past a message still running: {committed}"
    );
    // The handler was detached: it finishes and stores its result with no consumer left.
    shop.gate.add_permits(1);
    until("o-4's result is stored", || async {
        events.count(Stage::Completed) == 5
    })
    .await;

    let second = Running::start(kafka(engine), cluster.stream("charger", TOPIC), &shop);
    until("the group is committed to its end", || async {
        cluster.committed("charger", 0).await == Some(5)
    })
    .await;
    second.stop().await;
    for i in 0..5 {
        assert_eq!(shop.started(&format!("o-{i}")), 1, "o-{i} ran twice");
    }
    let redelivered = 5 - committed as u32;
    assert_eq!(
        events.count(Stage::Replayed),
        redelivered,
        "each message redelivered (from offset {committed}) replays"
    );
}

/// A handler that fails: the partition's committed offset stays before the failed message, and
/// nothing after it runs, while it is retried with a backoff; once a retry succeeds the offset
/// moves past it and the rest runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_committed_offset_never_passes_a_failed_message() {
    let cluster = Cluster::new(1);
    for i in 0..6 {
        cluster.send(0, &format!("o-{i}"), None).await;
    }
    let shop = Shop::default();
    shop.failing.lock().unwrap().push("o-2".into());
    let engine = Idempotency::new(MemoryStore::new());
    let running = Running::start(kafka(engine), cluster.stream("charger", TOPIC), &shop);
    until("o-2 failed three times", || async {
        shop.started("o-2") >= 3
    })
    .await;
    until("o-0 and o-1 are committed", || async {
        cluster.committed("charger", 0).await == Some(2)
    })
    .await;
    until("o-2 failed twice more", || async {
        shop.started("o-2") >= 5
    })
    .await;
    assert_eq!(
        cluster.committed("charger", 0).await,
        Some(2),
        "committed past a failure"
    );
    assert_eq!(shop.started("o-3"), 0, "a message after the failure ran");

    shop.failing.lock().unwrap().clear();
    until("the partition is committed to its end", || async {
        cluster.committed("charger", 0).await == Some(6)
    })
    .await;
    running.stop().await;
    assert_eq!(shop.order.lock().unwrap()[&0], (0..6).collect::<Vec<i64>>());
    for i in 0..6 {
        assert_eq!(shop.charged(&format!("o-{i}")), 1);
    }
}

/// Messages whose twins run elsewhere: retried (the engine meets them locked again and again),
/// never committed past or skipped; one replays once its twin stored its result, the other
/// runs once its twin's claim lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_in_flight_is_retried_until_it_completes_or_lapses() {
    let cluster = Cluster::new(1);
    for id in ["order-6", "order-7", "order-8", "order-9"] {
        cluster.send(0, id, Some(id)).await;
    }
    let clock = ManualClock::new();
    let events = Events::default();
    let engine = events.engine(MemoryStore::with_clock(clock.clone()));
    // Elsewhere: order-7 runs now (until `finish`), and order-8's claim is held by a process
    // that will die.
    let (finish, claimed) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let twin = {
        let (engine, finish, claimed) = (engine.clone(), finish.clone(), claimed.clone());
        tokio::spawn(async move {
            engine
                .call(Key::derive("charge", "", "order-7").unwrap())
                .run_detached(async move {
                    claimed.add_permits(1);
                    finish.acquire().await.unwrap().forget();
                    Ok::<_, idem::Error>("charged order-7 elsewhere".to_owned())
                })
                .await
                .unwrap()
        })
    };
    claimed.acquire().await.unwrap().forget();
    let idem::CallClaim::Claimed(_dead) = engine
        .call(Key::derive("charge", "", "order-8").unwrap())
        .lease(Duration::from_secs(30))
        .claim()
        .await
        .unwrap()
    else {
        panic!("a new key is claimed")
    };

    let shop = Shop::default();
    let running = Running::start(kafka(engine), cluster.stream("charger", TOPIC), &shop);
    // The partition waits at `offset` (order-7, then order-8): committed up to it, retried
    // (met locked) again and again, and nothing after it runs.
    let waits_at = |offset: i64| {
        let (cluster, events, shop) = (&cluster, &events, &shop);
        async move {
            until("the messages before the twin are committed", || async {
                cluster.committed("charger", 0).await == Some(offset)
            })
            .await;
            let locked = events.count(Stage::Locked);
            until("the twin was retried three more times", || async {
                events.count(Stage::Locked) >= locked + 3
            })
            .await;
            let committed = cluster.committed("charger", 0).await;
            assert_eq!(committed, Some(offset), "committed past a twin");
            let later = shop.started("order-8") + shop.started("order-9");
            assert_eq!(later, 0, "skipped a twin");
        }
    };
    waits_at(1).await;
    // The twin of order-7 finishes: order-7 replays its result; order-8 meets its twin's claim.
    finish.add_permits(1);
    twin.await.unwrap();
    waits_at(2).await;

    // order-8's twin died: its claim lapses with its lease, and the retry runs it.
    clock.advance(Duration::from_secs(31));
    until("the partition is committed to its end", || async {
        cluster.committed("charger", 0).await == Some(4)
    })
    .await;
    running.stop().await;
    assert_eq!(
        shop.started("order-7"),
        0,
        "order-7 ran although its twin stored a result"
    );
    assert_eq!(shop.charged("order-8"), 1);
    assert_eq!(shop.charged("order-9"), 1);
    assert_eq!(shop.order.lock().unwrap()[&0], vec![0, 2, 3]);
}

/// A poison message (its `idem-id` is no key: 300 bytes) with a dead-letter topic: produced
/// there with its source, then passed; the partition goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_goes_to_the_dead_letter_topic() {
    let cluster = Cluster::new(1);
    let bad_id = "x".repeat(300);
    cluster.send(0, "o-0", None).await;
    cluster.send(0, "poison", Some(&bad_id)).await;
    cluster.send(0, "o-2", None).await;
    let shop = Shop::default();
    let kafka =
        kafka(Idempotency::new(MemoryStore::new())).dead_letter(cluster.producer.clone(), DEAD);
    let running = Running::start(kafka.clone(), cluster.stream("charger", TOPIC), &shop);
    until("the partition is committed to its end", || async {
        cluster.committed("charger", 0).await == Some(3)
    })
    .await;
    running.stop().await;
    assert_eq!(shop.started("poison"), 0);
    assert_eq!((shop.charged("o-0"), shop.charged("o-2")), (1, 1));
    assert!(kafka.stopped().is_empty());
    let dead = cluster.dead_letters(1).await;
    assert_eq!(dead[0].payload(), Some(&b"poison"[..]));
    let headers = dead[0].headers().expect("the dead letter's headers");
    let header = |name: &str| {
        headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("idem-id"), Some(bad_id));
    assert_eq!(header("idem-source-topic").as_deref(), Some(TOPIC));
    assert_eq!(header("idem-source-partition").as_deref(), Some("0"));
    assert_eq!(header("idem-source-offset").as_deref(), Some("1"));
}

/// A poison message without a dead-letter topic: its partition stops there (nothing after it
/// runs, its offset is not passed) and is reported; the other partition goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_without_a_dead_letter_topic_stops_its_partition() {
    let cluster = Cluster::new(2);
    cluster.send(0, "o-0", None).await;
    cluster.send(0, "poison", Some("")).await;
    cluster.send(0, "o-2", None).await;
    for i in 0..3 {
        cluster.send(1, &format!("p1-{i}"), None).await;
    }
    let shop = Shop::default();
    let kafka = kafka(Idempotency::new(MemoryStore::new()));
    let running = Running::start(kafka.clone(), cluster.stream("charger", TOPIC), &shop);
    until("the other partition is committed to its end", || async {
        cluster.committed("charger", 1).await == Some(3)
    })
    .await;
    until("the poison partition is reported", || async {
        !kafka.stopped().is_empty()
    })
    .await;
    until("o-0 is committed", || async {
        cluster.committed("charger", 0).await == Some(1)
    })
    .await;
    running.stop().await;
    let stopped = kafka.stopped();
    assert_eq!(
        (
            stopped[0].topic.as_str(),
            stopped[0].partition,
            stopped[0].offset
        ),
        (TOPIC, 0, 1)
    );
    assert_eq!(stopped[0].key.as_deref(), Some(""));
    assert_eq!(cluster.committed("charger", 0).await, Some(1));
    assert_eq!((shop.started("poison"), shop.started("o-2")), (0, 0));
}

/// `run_steps`: each order's charge is a row written in one transactional step with its
/// record, on SQLite. Orders sent twice (the same `idem-id` on two partitions) are charged
/// once, and a second group reading everything again charges nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_steps_applies_each_effect_once() {
    use idem::sqlx::{self, Connection};
    use idem::{Error, SqlSteps, SqliteStore, Steps};

    let cluster = Cluster::new(2);
    for i in 0..10 {
        let id = format!("order-{i}");
        cluster.send(i % 2, &id, Some(&id)).await;
        if i % 3 == 0 {
            cluster.send((i + 1) % 2, &id, Some(&id)).await; // sent twice
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("shop.db")).await.unwrap();
    sqlx::query("CREATE TABLE charges (order_id TEXT)")
        .execute(store.pool())
        .await
        .unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let charge = {
        let (store, runs) = (store.clone(), runs.clone());
        move |m: OwnedMessage, steps: Steps| {
            let (store, runs) = (store.clone(), runs.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let order = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                let mut conn = store.pool().acquire().await.map_err(idem::sql_error)?;
                let mut tx = conn
                    .begin_with("BEGIN IMMEDIATE")
                    .await
                    .map_err(idem::sql_error)?;
                steps
                    .tx(&store, &mut tx, "charge", |tx| {
                        Box::pin(async move {
                            sqlx::query("INSERT INTO charges (order_id) VALUES (?)")
                                .bind(order)
                                .execute(&mut *tx)
                                .await
                                .map_err(idem::sql_error)?;
                            Ok::<_, Error>(())
                        })
                    })
                    .await?;
                tx.commit().await.map_err(idem::sql_error)?;
                Ok::<_, Error>(())
            }
        }
    };
    let ends = [
        cluster.send(0, "end-0", None).await + 1,
        cluster.send(1, "end-1", None).await + 1,
    ];
    let engine = Idempotency::new(store.clone());
    for group in ["charger", "auditor"] {
        let stream = cluster.stream(group, TOPIC);
        let kafka = kafka(engine.clone());
        let done = AtomicBool::new(false);
        let drained = async {
            for p in 0..2 {
                until("every partition is committed to its end", || async {
                    cluster.committed(group, p).await == Some(ends[p as usize])
                })
                .await;
            }
            done.store(true, Ordering::SeqCst);
        };
        kafka.run_steps(&stream, &charge, drained).await;
        assert!(done.load(Ordering::SeqCst));
        let charges: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM charges WHERE order_id LIKE 'order-%'")
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(
            charges, 10,
            "group {group}: an order charged twice or not at all"
        );
    }
    // 10 orders and the 2 end markers ran once each: every other delivery replayed.
    assert_eq!(runs.load(Ordering::SeqCst), 12);
}

/// **The outbox to Kafka.** A dispatcher publishes a memory outbox (two orders' messages) through
/// `KafkaPublisher`; one message is published again, as after a dispatcher's crash between the
/// broker's acknowledgement and marking it sent. The records carry the outbox id in `idem-id`
/// and the aggregate as their key (one partition per aggregate, in order); the consumer, keyed
/// by `idem-id`, applies every message once and replays the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_publishes_once_per_id_through_the_consumer() {
    use idem::{Dispatcher, DispatcherConfig, MemoryOutbox, MessageId};
    use idem::{OutboxMessage, Publisher};
    use idem_consumer::kafka::KafkaPublisher;
    let cluster = Cluster::new(3);
    let outbox = Arc::new(MemoryOutbox::new());
    let mut messages = Vec::new();
    for (order, step) in [("o-1", "placed"), ("o-2", "placed"), ("o-1", "paid")] {
        let key = Key::derive("orders", "", &format!("{order}-{step}")).unwrap();
        let m = OutboxMessage::new(
            MessageId::derive(&key, step),
            "order",
            order,
            step,
            format!("{order} {step}").into_bytes(),
        )
        .unwrap();
        outbox.add(m.clone());
        messages.push(m);
    }
    let producer: FutureProducer =
        KafkaPublisher::producer_config(&cluster.mock.bootstrap_servers())
            .create()
            .unwrap();
    let publisher = Arc::new(KafkaPublisher::new(producer, TOPIC));
    let dispatcher = Dispatcher::new(
        Arc::new(MemoryStore::new()),
        outbox.clone(),
        publisher.clone(),
        DispatcherConfig::new(),
    )
    .unwrap();
    assert_eq!(dispatcher.run_once().await.unwrap().published, 3);
    publisher.publish(&messages[0]).await.unwrap();

    let shop = Shop::default();
    let events = Events::default();
    let running = Running::start(
        kafka(events.engine(MemoryStore::new())),
        cluster.stream("outbox-readers", TOPIC),
        &shop,
    );
    let payloads = ["o-1 placed", "o-2 placed", "o-1 paid"];
    until("every outbox message is applied", || async {
        payloads.iter().all(|p| shop.charged(p) == 1)
    })
    .await;
    until("the copy is replayed", || async {
        events.count(Stage::Replayed) >= 1
    })
    .await;
    running.stop().await;
    for p in payloads {
        assert_eq!(shop.charged(p), 1, "{p}");
    }
}
