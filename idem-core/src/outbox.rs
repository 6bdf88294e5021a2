//! The transactional outbox's shared parts (docs/outbox.md): the message a caller adds in its own
//! transaction ([`OutboxMessage`], with an id derived from the operation, [`MessageId`]), what
//! the [`Dispatcher`](crate::Dispatcher) reads and marks through a store's outbox
//! ([`OutboxSource`]), and what it publishes to ([`Publisher`]). The stores' outboxes (SQLite
//! and PostgreSQL, DynamoDB) and the brokers' publishers live in their crates; a
//! [`MemoryOutbox`] and a [`ChannelPublisher`] serve one process and the tests.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::error::{BoxError, Error};
use crate::key::Key;

/// The namespace of [`MessageId::derive`]'s UUIDs (version 5).
const NAMESPACE: uuid::Uuid = uuid::Uuid::from_bytes([
    0x6f, 0x1d, 0x0e, 0x5a, 0x3c, 0x2b, 0x4e, 0x71, 0x9a, 0x55, 0x0c, 0x4d, 0x2e, 0x8b, 0x11, 0xd3,
]);

/// The longest aggregate type, aggregate id and message type, in bytes.
pub const MAX_OUTBOX_NAME_LEN: usize = 255;

/// The largest payload an [`OutboxMessage`] takes: 256 KiB, what SQS takes in one message
/// (Kafka's and NATS's defaults are 1 MiB).
pub const MAX_OUTBOX_PAYLOAD: usize = 256 * 1024;

/// A message's id: a UUID derived from the operation's [`Key`] and the message's name, so an
/// operation that runs again (a retry, a takeover) writes the same id, which the outbox keeps
/// once, and which each publisher passes on as the broker's deduplication id (SQS FIFO's
/// `MessageDeduplicationId`, NATS JetStream's `Nats-Msg-Id`, a Kafka header `idem-id`), so a
/// consumer on the other side can key its own idempotency by it.
///
/// ```
/// use idem::{Key, MessageId};
/// let key = Key::derive("orders", "shop-1", "req-9")?;
/// let placed = MessageId::derive(&key, "order-placed");
/// assert_eq!(placed, MessageId::derive(&key, "order-placed"));
/// assert_ne!(placed, MessageId::derive(&key, "invoice-sent"));
/// assert_eq!(placed.to_string().len(), 36);
/// assert_eq!(placed.to_string().parse::<MessageId>()?, placed);
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(uuid::Uuid);

impl MessageId {
    /// The id of the message `name` of the operation `key`.
    pub fn derive(key: &Key, name: &str) -> MessageId {
        let mut seed = Vec::with_capacity(32 + name.len());
        seed.extend_from_slice(key.as_bytes());
        seed.extend_from_slice(name.as_bytes());
        MessageId(uuid::Uuid::new_v5(&NAMESPACE, &seed))
    }

    /// The id as a UUID (what a `uuid` column keeps).
    ///
    /// ```
    /// use idem::{Key, MessageId};
    /// let id = MessageId::derive(&Key::derive("s", "", "k")?, "m");
    /// assert_eq!(MessageId::from_uuid(id.as_uuid()), id);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// The id a store kept as a UUID.
    pub fn from_uuid(id: uuid::Uuid) -> MessageId {
        MessageId(id)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl std::str::FromStr for MessageId {
    type Err = Error;

    fn from_str(s: &str) -> Result<MessageId, Error> {
        uuid::Uuid::parse_str(s)
            .map(MessageId)
            .map_err(|e| Error::InvalidConfig(format!("{s:?} is not a message id (a UUID): {e}")))
    }
}

/// A message to publish, as the caller adds it to the outbox in its own transaction. Its
/// columns are those of Debezium's outbox event router (`id`, `aggregatetype`, `aggregateid`,
/// `type`, `payload`), so a team that reads the outbox with change data capture can. Messages
/// of one aggregate (`aggregate_type`, `aggregate_id`) are published in the order they were
/// added; the publisher picks the destination (topic, queue, subject) from `aggregate_type`.
///
/// ```
/// use idem::{Key, MessageId, OutboxMessage};
/// let key = Key::derive("orders", "shop-1", "req-9")?;
/// let placed = OutboxMessage::new(
///     MessageId::derive(&key, "order-placed"),
///     "order",
///     "order-17",
///     "OrderPlaced",
///     br#"{"total":4200}"#.to_vec(),
/// )?;
/// assert!(OutboxMessage::new(placed.id, "", "order-17", "OrderPlaced", Vec::new()).is_err());
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// Its id: derived from the operation, so a retry writes the same one.
    pub id: MessageId,
    /// What kind of thing it is about (`order`): the destination is chosen from it.
    pub aggregate_type: String,
    /// Which one (`order-17`): messages of one aggregate are published in order.
    pub aggregate_id: String,
    /// What happened (`OrderPlaced`).
    pub kind: String,
    /// The body, as the caller encoded it.
    pub payload: Vec<u8>,
}

impl OutboxMessage {
    /// A message, checked: the three names 1 to [`MAX_OUTBOX_NAME_LEN`] bytes, the payload at
    /// most [`MAX_OUTBOX_PAYLOAD`]; otherwise [`Error::InvalidConfig`] and nothing is written.
    pub fn new(
        id: MessageId,
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        kind: impl Into<String>,
        payload: Vec<u8>,
    ) -> Result<OutboxMessage, Error> {
        let message = OutboxMessage {
            id,
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            kind: kind.into(),
            payload,
        };
        message.check()?;
        Ok(message)
    }

    /// Checks what [`new`](Self::new) checks, for a message built field by field.
    ///
    /// ```
    /// use idem::{Key, MessageId, OutboxMessage};
    /// let id = MessageId::derive(&Key::derive("s", "", "k")?, "m");
    /// let mut m = OutboxMessage::new(id, "order", "1", "Placed", Vec::new())?;
    /// m.kind = "x".repeat(300);
    /// assert!(m.check().is_err());
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        for (what, value) in [
            ("aggregate type", &self.aggregate_type),
            ("aggregate id", &self.aggregate_id),
            ("type", &self.kind),
        ] {
            if value.is_empty() || value.len() > MAX_OUTBOX_NAME_LEN {
                return Err(Error::InvalidConfig(format!(
                    "an outbox message's {what} is 1 to {MAX_OUTBOX_NAME_LEN} bytes, not {} \
                     (message {})",
                    value.len(),
                    self.id
                )));
            }
        }
        if self.payload.len() > MAX_OUTBOX_PAYLOAD {
            return Err(Error::InvalidConfig(format!(
                "an outbox message's payload is at most {MAX_OUTBOX_PAYLOAD} bytes, not {} \
                 (message {}): store the body elsewhere and send its reference",
                self.payload.len(),
                self.id
            )));
        }
        Ok(())
    }
}

/// An unsent message as the dispatcher reads it: its place in the outbox's order and when it
/// was added (for the lag the dispatcher reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMessage {
    /// Its position in the outbox: messages are published in this order within an aggregate.
    pub seq: u64,
    /// When it was added, on the store's clock.
    pub added_at: SystemTime,
    /// The message.
    pub message: OutboxMessage,
}

/// A store's outbox as the [`Dispatcher`](crate::Dispatcher) reads it: the unsent messages in
/// order, marking them sent, and deleting sent ones once they are old. Each store's outbox
/// implements it (idem-sql's `SqlOutbox`, idem-dynamodb's `DynamoOutbox`, [`MemoryOutbox`]);
/// adding a message is the store's own call, in the caller's transaction.
///
/// ```
/// use idem::{MemoryOutbox, OutboxSource};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let outbox = MemoryOutbox::new();
/// assert!(outbox.pending(10).await?.is_empty());
/// # Ok(()) }
/// ```
#[async_trait]
pub trait OutboxSource: Send + Sync + 'static {
    /// Up to `limit` unsent messages, in outbox order (`seq` ascending).
    async fn pending(&self, limit: u32) -> Result<Vec<PendingMessage>, Error>;

    /// Marks these messages sent: the dispatcher calls it once the broker acknowledged them.
    /// Marking a message already sent (or gone) changes nothing. Returns how many were marked.
    async fn mark_sent(&self, ids: &[MessageId]) -> Result<u64, Error>;

    /// Deletes up to `limit` messages sent more than `age` ago; returns how many.
    async fn prune_sent(&self, age: Duration, limit: u32) -> Result<u64, Error>;
}

/// Where the [`Dispatcher`](crate::Dispatcher) publishes: a broker. `publish` returns once the
/// broker has acknowledged the message (it is durable there); an error leaves the message
/// unsent, to be published again with the same id. Publishers for SQS, NATS JetStream and Kafka
/// are in idem-consumer (features `sqs`, `nats`, `kafka`); [`ChannelPublisher`] hands messages
/// to a channel in this process.
///
/// ```
/// use async_trait::async_trait;
/// use idem::{BoxError, OutboxMessage, Publisher};
///
/// /// Prints each message: a publisher of your own is this small.
/// struct Print;
///
/// #[async_trait]
/// impl Publisher for Print {
///     async fn publish(&self, m: &OutboxMessage) -> Result<(), BoxError> {
///         println!("{} {} {}", m.aggregate_type, m.kind, m.id);
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `message`, with its id as the broker's deduplication id where it has one.
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError>;
}

/// An outbox in this process's memory: for tests and examples, and for the memory store,
/// which has no transactions (a message is added on its own).
///
/// ```
/// use idem::{Key, MemoryOutbox, MessageId, OutboxMessage, OutboxSource};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let outbox = MemoryOutbox::new();
/// let id = MessageId::derive(&Key::derive("orders", "", "o-1")?, "placed");
/// let m = OutboxMessage::new(id, "order", "o-1", "Placed", b"{}".to_vec())?;
/// assert!(outbox.add(m.clone()));
/// assert!(!outbox.add(m), "a retry's copy is not added again");
/// assert_eq!(outbox.pending(10).await?.len(), 1);
/// assert_eq!(outbox.mark_sent(&[id]).await?, 1);
/// assert!(outbox.pending(10).await?.is_empty());
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct MemoryOutbox {
    inner: Mutex<MemoryMessages>,
}

#[derive(Debug, Default)]
struct MemoryMessages {
    next: u64,
    /// By seq: the message and when it was sent.
    messages: BTreeMap<u64, (PendingMessage, Option<SystemTime>)>,
    ids: std::collections::HashMap<MessageId, u64>,
}

impl MemoryOutbox {
    /// An empty outbox.
    pub fn new() -> MemoryOutbox {
        MemoryOutbox::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryMessages> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds `message` unless a message with its id is there already; `true` when added.
    pub fn add(&self, message: OutboxMessage) -> bool {
        let mut inner = self.lock();
        if inner.ids.contains_key(&message.id) {
            return false;
        }
        inner.next += 1;
        let seq = inner.next;
        inner.ids.insert(message.id, seq);
        let pending = PendingMessage {
            seq,
            added_at: SystemTime::now(),
            message,
        };
        inner.messages.insert(seq, (pending, None));
        true
    }

    /// How many messages it holds, sent or not.
    ///
    /// ```
    /// assert_eq!(idem::MemoryOutbox::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    /// Whether it holds no message.
    ///
    /// ```
    /// assert!(idem::MemoryOutbox::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl OutboxSource for MemoryOutbox {
    async fn pending(&self, limit: u32) -> Result<Vec<PendingMessage>, Error> {
        let inner = self.lock();
        Ok(inner
            .messages
            .values()
            .filter(|(_, sent)| sent.is_none())
            .take(limit as usize)
            .map(|(m, _)| m.clone())
            .collect())
    }

    async fn mark_sent(&self, ids: &[MessageId]) -> Result<u64, Error> {
        let mut inner = self.lock();
        let now = SystemTime::now();
        let mut marked = 0;
        for id in ids {
            let Some(seq) = inner.ids.get(id).copied() else {
                continue;
            };
            if let Some((_, sent @ None)) = inner.messages.get_mut(&seq) {
                *sent = Some(now);
                marked += 1;
            }
        }
        Ok(marked)
    }

    async fn prune_sent(&self, age: Duration, limit: u32) -> Result<u64, Error> {
        let mut inner = self.lock();
        let before = SystemTime::now()
            .checked_sub(age)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let old: Vec<(u64, MessageId)> = inner
            .messages
            .iter()
            .filter(|(_, (_, sent))| sent.is_some_and(|at| at <= before))
            .take(limit as usize)
            .map(|(seq, (m, _))| (*seq, m.message.id))
            .collect();
        for (seq, id) in &old {
            inner.messages.remove(seq);
            inner.ids.remove(id);
        }
        Ok(old.len() as u64)
    }
}

/// Publishes to a tokio channel in this process: each message is sent to the receiver, and
/// `publish` fails once the receiver is gone (so the message stays unsent).
///
/// ```
/// use idem::{ChannelPublisher, Key, MessageId, OutboxMessage, Publisher};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::BoxError> {
/// let (publisher, mut received) = ChannelPublisher::new(16);
/// let id = MessageId::derive(&Key::derive("orders", "", "o-1")?, "placed");
/// publisher.publish(&OutboxMessage::new(id, "order", "o-1", "Placed", Vec::new())?).await?;
/// assert_eq!(received.recv().await.map(|m| m.id), Some(id));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ChannelPublisher {
    sender: tokio::sync::mpsc::Sender<OutboxMessage>,
}

impl ChannelPublisher {
    /// A publisher and the receiving end of its channel of `capacity` messages (at least 1).
    pub fn new(capacity: usize) -> (ChannelPublisher, tokio::sync::mpsc::Receiver<OutboxMessage>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity.max(1));
        (ChannelPublisher { sender }, receiver)
    }
}

#[async_trait]
impl Publisher for ChannelPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        self.sender
            .send(message.clone())
            .await
            .map_err(|_| "the channel's receiver is gone".into())
    }
}
