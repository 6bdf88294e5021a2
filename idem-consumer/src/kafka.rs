//! A Kafka consumer (feature `kafka`, over `rdkafka`): reads a consumer group's partitions from
//! a `StreamConsumer`, runs each partition's messages through a [`Consumer`] in order, and
//! commits each partition's offset only past messages whose outcome is final.
//!
//! | outcome | what happens |
//! |---|---|
//! | done, replayed, not retained, closed | final: the partition's offset is committed past it |
//! | in flight elsewhere | retried after `retry_after` (at most [`max_backoff`](KafkaConsumer::max_backoff)): the partition is paused and sought back to it; nothing after it runs or is committed |
//! | failed | retried the same way, after a backoff doubling from [`backoff`](KafkaConsumer::backoff) up to `max_backoff` |
//! | poison, uncertain | with a [`dead_letter`](KafkaConsumer::dead_letter) topic: produced there (its delivery awaited), then final; without one: the partition **stops** there (paused, [`stopped`](KafkaConsumer::stopped), logged as an error), never skipped |
//!
//! Kafka has no per-message acknowledgement: a partition's committed offset says that every
//! message before it is done. So the messages of a partition run one after another, in offset
//! order (the [`Consumer`] in [ordered](Consumer::ordered) mode, one group per partition;
//! partitions run in parallel, up to the consumer's [`concurrency`](Consumer::concurrency)), a
//! partition stops at its first message that is not final, and its offset is committed up to
//! that message. That message is then retried (a pause, a seek back to it, a resume when its
//! delay is over), never skipped: a twin running elsewhere gets its result replayed, or runs
//! once the twin fails or its claim lapses.
//!
//! A message's key is its `idem-id` header ([`ID_HEADER`]: the deduplication id a producer or
//! an outbox sets), else its topic, partition and offset (which a redelivery keeps);
//! [`keyed_by`](KafkaConsumer::keyed_by) takes a business id from the payload instead.
//!
//! Build the `StreamConsumer` with [`KafkaConsumer::client_config`] (or set `group.id`,
//! `enable.auto.commit=false` and `enable.auto.offset.store=false` yourself: an automatic
//! commit would pass messages that are not final) and subscribe it to your topics.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer as _, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::ClientConfig;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::{Broker, Consumer, Disposition, Message, MessageHandler, Received};
use idem_core::{Codec, Key, Steps};

/// The rdkafka (0.39) whose `StreamConsumer` and `FutureProducer` a [`KafkaConsumer`] uses.
pub use rdkafka;

/// The header whose value keys a message by default: a deduplication id set by its producer
/// (an outbox dispatcher sets it to the outbox row's id), so a producer's second send of one
/// event is caught as well as a redelivery.
///
/// ```
/// assert_eq!(idem::consumer::kafka::ID_HEADER, "idem-id");
/// ```
pub const ID_HEADER: &str = "idem-id";

/// Headers a dead-lettered record carries besides the original's: where it came from.
const SOURCE_HEADERS: [&str; 3] = [
    "idem-source-topic",
    "idem-source-partition",
    "idem-source-offset",
];

/// How a message's key is found.
type KeyOf = Arc<dyn Fn(&OwnedMessage) -> Option<String> + Send + Sync>;

/// A topic and partition.
type Partition = (String, i32);

/// Runs a Kafka consumer group's messages through a [`Consumer`], in order per partition,
/// committing each partition's offset only past final outcomes. Cheap to clone; clones share
/// the [`stopped`](Self::stopped) list.
///
/// An example against librdkafka's in-process mock cluster (a real cluster only differs by its
/// bootstrap servers):
///
/// ```
/// use std::time::Duration;
/// use idem::consumer::kafka::rdkafka::consumer::{Consumer as _, StreamConsumer};
/// use idem::consumer::kafka::rdkafka::mocking::MockCluster;
/// use idem::consumer::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
/// use idem::consumer::kafka::rdkafka::{ClientConfig, Message as _};
/// use idem::consumer::kafka::KafkaConsumer;
/// use idem::consumer::Consumer;
/// use idem::{Idempotency, MemoryStore};
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cluster = MockCluster::new(1)?;
/// cluster.create_topic("orders", 1, 1)?;
/// let producer: FutureProducer = ClientConfig::new()
///     .set("bootstrap.servers", cluster.bootstrap_servers())
///     .create()?;
/// for order in ["order-1", "order-2", "order-1"] { // order-1 sent twice
///     let record = FutureRecord::<(), _>::to("orders").payload(order);
///     producer.send(record, Duration::from_secs(5)).await.map_err(|(e, _)| e)?;
/// }
///
/// let stream: StreamConsumer =
///     KafkaConsumer::<idem::JsonCodec>::client_config(&cluster.bootstrap_servers(), "charger").create()?;
/// stream.subscribe(&["orders"])?;
/// let engine = Idempotency::new(MemoryStore::new());
/// let orders = KafkaConsumer::new(Consumer::new(engine, "charge")?)
///     // One charge per order, whatever the copies: keyed by the order in the payload.
///     .keyed_by(|m| Some(String::from_utf8_lossy(m.payload()?).into_owned()));
/// let charged = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
/// let counter = charged.clone();
/// let handler = move |m: idem::consumer::kafka::rdkafka::message::OwnedMessage| {
///     let counter = counter.clone();
///     async move {
///         counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///         Ok::<_, std::io::Error>(m.offset())
///     }
/// };
/// // Runs until every copy is committed (a service stops on a signal).
/// let done = async {
///     for _ in 0..500 {
///         let committed = stream.committed(Duration::from_secs(5)).ok();
///         let at = committed.and_then(|c| c.find_partition("orders", 0).map(|p| p.offset()));
///         if at == Some(idem::consumer::kafka::rdkafka::Offset::Offset(3)) { return; }
///         tokio::time::sleep(Duration::from_millis(20)).await;
///     }
/// };
/// orders.run(&stream, handler, done).await;
/// assert_eq!(charged.load(std::sync::atomic::Ordering::SeqCst), 2);
/// # Ok(()) }
/// ```
pub struct KafkaConsumer<C> {
    consumer: Consumer<C>,
    lease: Duration,
    batch: usize,
    wait: Duration,
    backoff: Duration,
    max_backoff: Duration,
    key: Option<KeyOf>,
    dead_letter: Option<DeadLetter>,
    stopped: Arc<Mutex<Vec<Stopped>>>,
}

/// Where poison and uncertain messages go.
#[derive(Clone)]
struct DeadLetter {
    producer: FutureProducer,
    topic: String,
}

impl<C> Clone for KafkaConsumer<C> {
    fn clone(&self) -> Self {
        KafkaConsumer {
            consumer: self.consumer.clone(),
            lease: self.lease,
            batch: self.batch,
            wait: self.wait,
            backoff: self.backoff,
            max_backoff: self.max_backoff,
            key: self.key.clone(),
            dead_letter: self.dead_letter.clone(),
            stopped: self.stopped.clone(),
        }
    }
}

impl<C> fmt::Debug for KafkaConsumer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConsumer")
            .field("lease", &self.lease)
            .field("batch", &self.batch)
            .field("wait", &self.wait)
            .field("backoff", &self.backoff)
            .field("max_backoff", &self.max_backoff)
            .field(
                "dead_letter",
                &self.dead_letter.as_ref().map(|d| d.topic.as_str()),
            )
            .finish_non_exhaustive()
    }
}

/// A partition a [`KafkaConsumer`] stopped: its message at `offset` is poison or uncertain and
/// no dead-letter topic is set, so nothing at or after it runs or is committed. Route the
/// message (or resolve its operation: `idem resolve`), then restart the consumer: it starts
/// again from that offset.
///
/// ```
/// # use idem::consumer::kafka::Stopped;
/// fn alert(stopped: &[Stopped]) {
///     for s in stopped {
///         eprintln!("{}/{} stopped at {} (key {:?})", s.topic, s.partition, s.offset, s.key);
///     }
/// }
/// # alert(&[]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stopped {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset of the message it stopped at; the committed offset.
    pub offset: i64,
    /// The message's key, if it had one (its outcome's error is logged with it).
    pub key: Option<String>,
}

impl<C: Codec> KafkaConsumer<C> {
    /// Partitions through `consumer` (turned to [ordered](Consumer::ordered) mode: one group per
    /// partition), with a lease of 30 s, batches of up to 100 messages, failures retried after
    /// 100 ms doubling up to 30 s, and no dead-letter topic.
    ///
    /// ```
    /// use idem::consumer::kafka::KafkaConsumer;
    /// use idem::consumer::Consumer;
    /// use idem::{Idempotency, MemoryStore};
    /// let orders = KafkaConsumer::new(Consumer::new(Idempotency::new(MemoryStore::new()), "charge")?);
    /// # let _ = orders; Ok::<(), idem::Error>(())
    /// ```
    pub fn new(consumer: Consumer<C>) -> KafkaConsumer<C> {
        KafkaConsumer {
            consumer: consumer.ordered(true),
            lease: Duration::from_secs(30),
            batch: 100,
            wait: Duration::from_millis(10),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            key: None,
            dead_letter: None,
            stopped: Arc::default(),
        }
    }

    /// A client configuration for the `StreamConsumer` a [`KafkaConsumer`] reads: the
    /// bootstrap servers, the group, no automatic commit and no automatic offset store (the
    /// consumer commits, and only past final outcomes), and a new group starting at the
    /// earliest offset. Add your own settings (TLS, SASL, `session.timeout.ms`) before
    /// `create()`.
    ///
    /// ```
    /// use idem::consumer::kafka::KafkaConsumer;
    /// let config = KafkaConsumer::<idem::JsonCodec>::client_config("localhost:9092", "charger");
    /// assert_eq!(config.get("enable.auto.commit"), Some("false"));
    /// assert_eq!(config.get("group.id"), Some("charger"));
    /// ```
    pub fn client_config(bootstrap_servers: &str, group_id: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap_servers)
            .set("group.id", group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest");
        config
    }

    /// The claims' lease (at least 3 ms; 30 s by default). Kafka holds no single message, so
    /// nothing else moves with it: the engine renews each claim every third of it while its
    /// handler runs, and a consumer that dies leaves its claims to end one lease later, when
    /// the partition's next owner meets them as in flight and retries them.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn doc(orders: idem::consumer::kafka::KafkaConsumer<idem::JsonCodec>) {
    /// let orders = orders.lease(Duration::from_secs(60));
    /// # }
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(3));
        self
    }

    /// How many messages a batch holds at most (at least 1; 100 by default). A batch runs
    /// whole before the next is read, and the stream is not polled meanwhile: keep a batch's
    /// time under the consumer's `max.poll.interval.ms` (5 min by default), or librdkafka
    /// leaves the group.
    ///
    /// ```
    /// # fn doc(orders: idem::consumer::kafka::KafkaConsumer<idem::JsonCodec>) {
    /// let orders = orders.batch(20);
    /// # }
    /// ```
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// How long a receive waits for more messages once one came (10 ms by default).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn doc(orders: idem::consumer::kafka::KafkaConsumer<idem::JsonCodec>) {
    /// let orders = orders.wait(Duration::ZERO); // only what is already fetched
    /// # }
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The delay before a failed message's first retry (100 ms by default); it doubles with
    /// each failure of the same message, up to [`max_backoff`](Self::max_backoff).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn doc(orders: idem::consumer::kafka::KafkaConsumer<idem::JsonCodec>) {
    /// let orders = orders.backoff(Duration::from_secs(1)).max_backoff(Duration::from_secs(60));
    /// # }
    /// ```
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// The longest a message waits for its retry (30 s by default): a failure's backoff, and a
    /// twin's `retry_after` (the twin's remaining lease, an estimate), are cut to it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn doc(orders: idem::consumer::kafka::KafkaConsumer<idem::JsonCodec>) {
    /// let orders = orders.max_backoff(Duration::from_secs(5));
    /// # }
    /// ```
    pub fn max_backoff(mut self, max_backoff: Duration) -> Self {
        self.max_backoff = max_backoff;
        self
    }

    /// How each message's key is found (`None`: no deduplication), instead of its `idem-id`
    /// header or its position: a business id from the payload, which catches every copy of
    /// the operation.
    ///
    /// ```
    /// use idem::consumer::kafka::rdkafka::Message as _;
    /// # fn doc(orders: idem::consumer::kafka::KafkaConsumer<idem::JsonCodec>) {
    /// let orders = orders.keyed_by(|m| m.key().map(|k| String::from_utf8_lossy(k).into_owned()));
    /// # }
    /// ```
    pub fn keyed_by(
        mut self,
        key: impl Fn(&OwnedMessage) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// Sends poison and uncertain messages to `topic` through `producer`: the original key,
    /// payload and headers, plus `idem-source-topic`, `idem-source-partition` and
    /// `idem-source-offset`. Once Kafka acknowledged the record, the message is final and the
    /// partition goes on past it; a failed send is retried as a failure is. Without a
    /// dead-letter topic such a message stops its partition ([`stopped`](Self::stopped)).
    /// Each received message is copied to be dead-lettered if it must be, while its batch runs.
    ///
    /// ```
    /// use idem::consumer::kafka::rdkafka::producer::FutureProducer;
    /// use idem::consumer::kafka::rdkafka::ClientConfig;
    /// # fn doc(orders: idem::consumer::kafka::KafkaConsumer<idem::JsonCodec>) -> Result<(), Box<dyn std::error::Error>> {
    /// let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", "localhost:9092").create()?;
    /// let orders = orders.dead_letter(producer, "orders.dead");
    /// # Ok(()) }
    /// ```
    pub fn dead_letter(mut self, producer: FutureProducer, topic: impl Into<String>) -> Self {
        self.dead_letter = Some(DeadLetter {
            producer,
            topic: topic.into(),
        });
        self
    }

    /// The partitions stopped at a poison or uncertain message (no dead-letter topic is set),
    /// since this consumer or a clone of it started; an entry goes once its partition's offset
    /// is committed past it. Alert on any.
    ///
    /// ```
    /// # fn doc(orders: idem::consumer::kafka::KafkaConsumer<idem::JsonCodec>) {
    /// for stopped in orders.stopped() {
    ///     eprintln!("{}/{} stopped at offset {}", stopped.topic, stopped.partition, stopped.offset);
    /// }
    /// # }
    /// ```
    pub fn stopped(&self) -> Vec<Stopped> {
        self.stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads `stream` (subscribed, built as [`client_config`](Self::client_config) says) and
    /// runs its messages through `handler`, committing each partition's offset past final
    /// outcomes, until `shutdown` resolves; then stops reading, finishes the batch in hand
    /// (handlers, dead letters, commits) and returns. A failed read is logged and tried again
    /// after a second. The loop is [`Consumer::run`]'s, over the stream as a [`Broker`].
    ///
    /// ```no_run
    /// use idem::consumer::kafka::rdkafka::consumer::{Consumer as _, StreamConsumer};
    /// use idem::consumer::kafka::rdkafka::message::OwnedMessage;
    /// use idem::consumer::kafka::rdkafka::Message as _;
    /// use idem::consumer::kafka::KafkaConsumer;
    /// use idem::consumer::Consumer;
    /// use idem::{Idempotency, SqliteStore};
    /// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
    /// let stream: StreamConsumer =
    ///     KafkaConsumer::<idem::JsonCodec>::client_config("localhost:9092", "charger").create()?;
    /// stream.subscribe(&["orders"])?;
    /// let engine = Idempotency::new(SqliteStore::open("idem.db").await?);
    /// let orders = KafkaConsumer::new(Consumer::new(engine, "charge")?);
    /// let handler = |m: OwnedMessage| async move { Ok::<_, std::io::Error>(m.payload().map_or(0, <[u8]>::len)) };
    /// // Runs until `stop` fires (a signal handler's sender), then finishes the batch in hand.
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// # drop(stop);
    /// orders.run(&stream, handler, async { let _ = stopped.await; }).await;
    /// # Ok(()) }
    /// ```
    pub async fn run<X, R, H>(
        &self,
        stream: &StreamConsumer<X, R>,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) where
        X: ConsumerContext + 'static,
        R: Send + Sync,
        H: MessageHandler<OwnedMessage>,
        H::Error: fmt::Display,
    {
        let broker = self.partitions(stream);
        self.consumer.run(&broker, handler, shutdown).await
    }

    /// [`run`](Self::run) with exactly-once effects: each batch goes through
    /// [`Consumer::process_steps`], whose handler gets the message and its `Steps` and applies
    /// the message's effect as one transactional step.
    ///
    /// ```no_run
    /// use idem::consumer::kafka::rdkafka::consumer::StreamConsumer;
    /// use idem::consumer::kafka::rdkafka::message::OwnedMessage;
    /// use idem::consumer::kafka::rdkafka::Message as _;
    /// use idem::consumer::kafka::KafkaConsumer;
    /// use idem::consumer::Consumer;
    /// use idem::{Error, Idempotency, SqlSteps, SqliteStore};
    /// use sqlx::Connection;
    /// # async fn doc(stream: StreamConsumer) -> Result<(), Error> {
    /// let store = SqliteStore::open("shop.db").await?;
    /// let orders = KafkaConsumer::new(Consumer::new(Idempotency::new(store.clone()), "charge")?);
    /// let store = &store;
    /// let handler = |m: OwnedMessage, steps: idem::Steps| async move {
    ///     let order = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
    ///     let mut conn = store.pool().acquire().await.map_err(idem::sql_error)?;
    ///     let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(idem::sql_error)?;
    ///     steps.tx(store, &mut tx, "charge", |tx| Box::pin(async move {
    ///         sqlx::query("INSERT INTO charges (order_id) VALUES (?)").bind(order).execute(&mut *tx).await.map_err(idem::sql_error)?;
    ///         Ok::<_, Error>(())
    ///     })).await?;
    ///     tx.commit().await.map_err(idem::sql_error)?;
    ///     Ok::<_, Error>(())
    /// };
    /// orders.run_steps(&stream, handler, std::future::pending()).await;
    /// # Ok(()) }
    /// ```
    pub async fn run_steps<X, R, T, E, H, F>(
        &self,
        stream: &StreamConsumer<X, R>,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) where
        X: ConsumerContext + 'static,
        R: Send + Sync,
        H: Fn(OwnedMessage, Steps<C>) -> F,
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
    {
        let broker = self.partitions(stream);
        self.consumer.run_steps(&broker, handler, shutdown).await
    }

    fn partitions<'a, X: ConsumerContext + 'static, R>(
        &'a self,
        stream: &'a StreamConsumer<X, R>,
    ) -> Partitions<'a, C, X, R> {
        Partitions {
            stream,
            kafka: self,
            state: Mutex::default(),
        }
    }
}

impl<C> KafkaConsumer<C> {
    /// The key of a message: the key function's, else its `idem-id` header, else its position.
    fn key_of(&self, message: &OwnedMessage) -> Option<String> {
        match &self.key {
            Some(key) => key(message),
            None => Some(id_header(message).unwrap_or_else(|| position_key(message))),
        }
    }
}

/// The last `idem-id` header of a message, as text (bytes that are not UTF-8 are replaced, and
/// so make an invalid key: the message is poison).
fn id_header(message: &OwnedMessage) -> Option<String> {
    let headers = message.headers()?;
    let header = headers.iter().filter(|h| h.key == ID_HEADER).last()?;
    Some(String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned())
}

/// `topic/partition/offset`; for a topic name too long for a key (over about 220 bytes), a
/// digest of it instead of the name.
fn position_key(message: &OwnedMessage) -> String {
    let (topic, partition, offset) = (message.topic(), message.partition(), message.offset());
    let key = format!("{topic}/{partition}/{offset}");
    if key.len() <= 255 {
        return key;
    }
    match Key::derive("kafka-topic", "", topic) {
        Ok(digest) => format!("{}/{partition}/{offset}", digest.provider_key(None)),
        // A topic name is at most 249 bytes of ASCII: this is never reached, and a key too
        // long makes the message poison rather than a key shared with another.
        Err(_) => key,
    }
}

/// A received message's place, and what dead-lettering it needs.
#[derive(Debug)]
struct Held {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<String>,
    /// The message, copied only when a dead-letter topic is set.
    copy: Option<OwnedMessage>,
}

/// What one run remembers of its partitions: the paused ones, when each resumes, and how many
/// times the message each waits at was retried.
#[derive(Debug, Default)]
struct State {
    resume_at: HashMap<Partition, Instant>,
    attempts: HashMap<Partition, (i64, u32)>,
}

/// A `StreamConsumer` as a [`Broker`]: reads batches, holds nothing (the lease is the
/// claims'), commits past final outcomes, pauses and seeks back to retry, dead-letters.
struct Partitions<'a, C, X: ConsumerContext + 'static, R> {
    stream: &'a StreamConsumer<X, R>,
    kafka: &'a KafkaConsumer<C>,
    state: Mutex<State>,
}

/// What settling a partition's messages comes to.
struct Settled {
    /// The offset to commit: the first message not final (or past the last).
    commit: Option<i64>,
    /// Retry from this offset after this delay.
    retry: Option<(i64, Duration)>,
}

impl<C: Codec, X: ConsumerContext + 'static, R: Send + Sync> Partitions<'_, C, X, R> {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resumes the partitions whose retry is due; returns when the next one is.
    fn resume_due(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut state = self.state();
        let due: Vec<Partition> = state
            .resume_at
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(p, _)| p.clone())
            .collect();
        for partition in due {
            state.resume_at.remove(&partition);
            if let Err(e) = self.stream.resume(&list(&partition)) {
                tracing::warn!(
                    topic = partition.0,
                    partition = partition.1,
                    "resuming a Kafka partition failed: {e}"
                );
            }
        }
        state.resume_at.values().min().copied()
    }

    /// A received message as a batch message, grouped by its partition, with what settles it.
    fn held(&self, message: OwnedMessage) -> (Message<OwnedMessage>, Held) {
        let partition: Partition = (message.topic().to_owned(), message.partition());
        // A message from a partition waiting for its retry: it was assigned anew (a rebalance
        // resumes it from its committed offset), so the wait is over.
        self.state().resume_at.remove(&partition);
        let key = self.kafka.key_of(&message);
        let held = Held {
            topic: partition.0.clone(),
            partition: partition.1,
            offset: message.offset(),
            key: key.clone(),
            copy: self.kafka.dead_letter.as_ref().map(|_| message.clone()),
        };
        let group = format!("{}/{}", partition.0, partition.1);
        let message = match key {
            Some(key) => Message::keyed(message, key),
            None => Message::unkeyed(message),
        };
        (message.group(group), held)
    }

    /// Settles one partition's messages (in offset order): commits past the final ones, and
    /// dead-letters, retries or stops at the first one that is not.
    async fn settle_partition(&self, messages: Vec<(Held, Disposition)>) -> Settled {
        let mut settled = Settled {
            commit: None,
            retry: None,
        };
        let mut after_dead_letter = false;
        for (held, disposition) in messages {
            match disposition {
                Disposition::Acknowledge => settled.commit = Some(held.offset + 1),
                Disposition::DeadLetter => match &self.kafka.dead_letter {
                    Some(dead) => {
                        if self.send_dead(dead, &held).await {
                            settled.commit = Some(held.offset + 1);
                            after_dead_letter = true;
                        } else {
                            let delay = self.backoff(&held, None);
                            settled.retry = Some((held.offset, delay));
                            break;
                        }
                    }
                    None => {
                        self.stop(&held);
                        return settled;
                    }
                },
                Disposition::Redeliver { after } => {
                    // After a dead letter the rest of the partition did not run (the lane
                    // stopped there): it runs now. Otherwise this message failed, or its twin
                    // is in flight.
                    let delay = if after_dead_letter {
                        Duration::ZERO
                    } else {
                        self.backoff(&held, after)
                    };
                    settled.retry = Some((held.offset, delay));
                    break;
                }
            }
        }
        settled
    }

    /// The delay before `held`'s next try: `after` (a twin's estimate) or the doubling
    /// backoff of its failures, at most `max_backoff`.
    fn backoff(&self, held: &Held, after: Option<Duration>) -> Duration {
        let partition = (held.topic.clone(), held.partition);
        let mut state = self.state();
        let attempts = state.attempts.entry(partition).or_insert((held.offset, 0));
        if attempts.0 != held.offset {
            *attempts = (held.offset, 0);
        }
        attempts.1 = attempts.1.saturating_add(1);
        let doubled = self
            .kafka
            .backoff
            .saturating_mul(1u32 << (attempts.1 - 1).min(16));
        after.unwrap_or(doubled).min(self.kafka.max_backoff)
    }

    /// Produces `held` to the dead-letter topic and waits for Kafka's acknowledgement.
    async fn send_dead(&self, dead: &DeadLetter, held: &Held) -> bool {
        let Some(message) = &held.copy else {
            return false;
        };
        let mut headers = match message.headers() {
            Some(h) => h.clone(),
            None => OwnedHeaders::new(),
        };
        let (partition, offset) = (held.partition.to_string(), held.offset.to_string());
        for (name, value) in SOURCE_HEADERS
            .iter()
            .zip([&held.topic, &partition, &offset])
        {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_str()),
            });
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&dead.topic).headers(headers);
        if let Some(payload) = message.payload() {
            record = record.payload(payload);
        }
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        let sent = dead.producer.send(record, self.kafka.lease).await;
        let span = tracing::info_span!(
            "dead_letter",
            topic = held.topic,
            partition = held.partition,
            offset = held.offset,
            dead_letter_topic = dead.topic
        );
        let _in_span = span.enter();
        match &sent {
            Ok(_) => tracing::info!("message sent to the dead-letter topic"),
            Err((e, _)) => tracing::warn!("sending to the dead-letter topic failed, retrying: {e}"),
        }
        sent.is_ok()
    }

    /// Stops the partition at `held`: pauses it (for good, until it is assigned anew) and
    /// reports it.
    fn stop(&self, held: &Held) {
        let partition = (held.topic.clone(), held.partition);
        self.pause_at(&partition, held.offset);
        tracing::error!(
            topic = held.topic,
            partition = held.partition,
            offset = held.offset,
            key = held.key.as_deref().unwrap_or("-"),
            "Kafka partition stopped: its message at this offset is to be dead-lettered and no \
             dead-letter topic is set; route it (or resolve its operation), then restart"
        );
        let stopped = Stopped {
            topic: held.topic.clone(),
            partition: held.partition,
            offset: held.offset,
            key: held.key.clone(),
        };
        let mut list = self
            .kafka
            .stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        list.retain(|s| (s.topic.as_str(), s.partition) != (held.topic.as_str(), held.partition));
        list.push(stopped);
    }

    /// Pauses a partition and seeks it back to `offset`, where it resumes.
    fn pause_at(&self, partition: &Partition, offset: i64) {
        let tpl = list(partition);
        if let Err(e) = self.stream.pause(&tpl) {
            tracing::warn!(
                topic = partition.0,
                partition = partition.1,
                "pausing a Kafka partition failed: {e}"
            );
        }
        self.seek(partition, offset);
    }

    /// Seeks a partition to `offset` (without waiting: librdkafka drops what it fetched past
    /// it).
    fn seek(&self, partition: &Partition, offset: i64) {
        let sought = self.stream.seek(
            &partition.0,
            partition.1,
            Offset::Offset(offset),
            Duration::ZERO,
        );
        if let Err(e) = sought {
            // Not assigned any more: its next owner starts from the committed offset.
            tracing::warn!(
                topic = partition.0,
                partition = partition.1,
                offset,
                "seeking a Kafka partition back failed: {e}"
            );
        }
    }

    /// Commits `commits` (asynchronously: a commit lost brings its messages back, and they
    /// replay) and forgets what they pass.
    fn commit(&self, commits: Vec<(Partition, i64)>) {
        if commits.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (partition, offset) in &commits {
            let _ = tpl.add_partition_offset(&partition.0, partition.1, Offset::Offset(*offset));
        }
        if let Err(e) = self.stream.commit(&tpl, CommitMode::Async) {
            tracing::warn!(
                "committing Kafka offsets failed; those messages come back and replay: {e}"
            );
        }
        let mut state = self.state();
        let mut stopped = self
            .kafka
            .stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (partition, offset) in commits {
            if state.attempts.get(&partition).is_some_and(|a| a.0 < offset) {
                state.attempts.remove(&partition);
            }
            stopped.retain(|s| {
                !(s.topic == partition.0 && s.partition == partition.1 && s.offset < offset)
            });
        }
    }
}

/// A list of one partition.
fn list(partition: &Partition) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&partition.0, partition.1);
    tpl
}

impl<C: Codec, X: ConsumerContext + 'static, R: Send + Sync> Broker for Partitions<'_, C, X, R> {
    type Body = OwnedMessage;
    type Receipt = Held;
    type Error = KafkaError;

    fn hold(&self) -> Duration {
        self.kafka.lease
    }

    fn name(&self) -> &str {
        "Kafka"
    }

    async fn receive(&self) -> Result<Received<Self>, KafkaError> {
        let first = loop {
            let next_resume = self.resume_due();
            match next_resume {
                Some(at) => tokio::select! {
                    received = self.stream.recv() => break received?.detach(),
                    _ = tokio::time::sleep_until(at) => {}
                },
                None => break self.stream.recv().await?.detach(),
            }
        };
        let mut batch = vec![self.held(first)];
        let until = Instant::now() + self.kafka.wait;
        while batch.len() < self.kafka.batch {
            match tokio::time::timeout_at(until, self.stream.recv()).await {
                Ok(Ok(message)) => {
                    let message = message.detach();
                    batch.push(self.held(message));
                }
                Ok(Err(e)) => {
                    tracing::warn!("reading from Kafka failed: {e}");
                    break;
                }
                Err(_) => break,
            }
        }
        Ok(batch)
    }

    async fn extend(&self, _held: &[Held]) {
        // Kafka holds no single message: a partition is held while this consumer is in the
        // group, and the claims' lease is renewed by the engine.
    }

    async fn settle(&self, settled: Vec<(Held, Disposition)>) {
        let mut partitions: Vec<(Partition, Vec<(Held, Disposition)>)> = Vec::new();
        for (held, disposition) in settled {
            let partition = (held.topic.clone(), held.partition);
            match partitions.iter_mut().find(|(p, _)| *p == partition) {
                Some((_, messages)) => messages.push((held, disposition)),
                None => partitions.push((partition, vec![(held, disposition)])),
            }
        }
        let mut commits = Vec::new();
        for (partition, messages) in partitions {
            let settled = self.settle_partition(messages).await;
            if let Some(offset) = settled.commit {
                commits.push((partition.clone(), offset));
            }
            match settled.retry {
                Some((offset, delay)) if delay.is_zero() => self.seek(&partition, offset),
                Some((offset, delay)) => {
                    self.pause_at(&partition, offset);
                    self.state()
                        .resume_at
                        .insert(partition, Instant::now() + delay);
                }
                None => {}
            }
        }
        self.commit(commits);
    }
}

/// Publishes outbox messages to Kafka (the [`Dispatcher`](idem_core::Dispatcher)'s
/// [`Publisher`](idem_core::Publisher)): one produce per message, awaited until the broker
/// acknowledged it, to the topic its route names (one topic by default), with the aggregate id
/// as the record key (so an aggregate's messages share a partition, in order), the outbox id in
/// the header [`ID_HEADER`] (which a [`KafkaConsumer`] keys by) and the type in `idem-type`.
/// Build the producer with [`KafkaPublisher::producer_config`]: the idempotent producer
/// (`enable.idempotence=true`, `acks=all`), so a retried send inside one producer session is
/// written once; a re-publish after a dispatcher's crash is a new send, which the consumer's
/// key absorbs.
///
/// ```no_run
/// use std::sync::Arc;
/// use idem::consumer::kafka::{rdkafka, KafkaPublisher};
/// use idem::{Dispatcher, DispatcherConfig, SqliteOutbox, SqliteStore};
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// let producer: rdkafka::producer::FutureProducer =
///     KafkaPublisher::producer_config("127.0.0.1:9092").create()?;
/// let store = SqliteStore::open("idem.db").await?;
/// let outbox = SqliteOutbox::new(store.pool().clone(), "outbox").await?;
/// let publisher = KafkaPublisher::new(producer, "orders");
/// let dispatcher = Dispatcher::new(Arc::new(store), Arc::new(outbox), Arc::new(publisher), DispatcherConfig::new())?;
/// # let _ = dispatcher;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
    route: Arc<dyn Fn(&idem_core::OutboxMessage) -> String + Send + Sync>,
    timeout: Duration,
}

impl fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// Publishes every message to `topic`.
    pub fn new(producer: FutureProducer, topic: impl Into<String>) -> KafkaPublisher {
        let topic: String = topic.into();
        KafkaPublisher::routed(producer, move |_| topic.clone())
    }

    /// Publishes each message to the topic `route` gives it.
    ///
    /// ```no_run
    /// # fn doc(producer: idem::consumer::kafka::rdkafka::producer::FutureProducer) {
    /// use idem::consumer::kafka::KafkaPublisher;
    /// let publisher = KafkaPublisher::routed(producer, |m| format!("{}-events", m.aggregate_type));
    /// # }
    /// ```
    pub fn routed(
        producer: FutureProducer,
        route: impl Fn(&idem_core::OutboxMessage) -> String + Send + Sync + 'static,
    ) -> KafkaPublisher {
        KafkaPublisher {
            producer,
            route: Arc::new(route),
            timeout: Duration::from_secs(30),
        }
    }

    /// How long one message may wait in the producer's queue before its publish fails (and
    /// the message stays unsent): 30 s by default.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn doc(publisher: idem::consumer::kafka::KafkaPublisher) {
    /// let publisher = publisher.timeout(Duration::from_secs(5));
    /// # }
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> KafkaPublisher {
        self.timeout = timeout;
        self
    }

    /// A producer's configuration for `bootstrap_servers`: the idempotent producer
    /// (`enable.idempotence=true`, which sets `acks=all` and keeps order per partition across
    /// retries).
    ///
    /// ```
    /// let config = idem::consumer::kafka::KafkaPublisher::producer_config("127.0.0.1:9092");
    /// assert_eq!(config.get("enable.idempotence"), Some("true"));
    /// ```
    pub fn producer_config(bootstrap_servers: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all");
        config
    }
}

#[async_trait::async_trait]
impl idem_core::Publisher for KafkaPublisher {
    async fn publish(&self, m: &idem_core::OutboxMessage) -> Result<(), idem_core::BoxError> {
        let id = m.id.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: ID_HEADER,
                value: Some(id.as_str()),
            })
            .insert(Header {
                key: "idem-type",
                value: Some(m.kind.as_str()),
            });
        let topic = (self.route)(m);
        let record = FutureRecord::to(&topic)
            .key(m.aggregate_id.as_str())
            .payload(m.payload.as_slice())
            .headers(headers);
        self.producer
            .send(record, self.timeout)
            .await
            .map_err(|(e, _)| e)?;
        Ok(())
    }
}
