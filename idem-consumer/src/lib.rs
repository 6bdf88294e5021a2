//! Queue consumers for idem: every message of a batch goes through the engine once, and comes
//! back with one [`MessageOutcome`] that says what its broker should do with it.
//!
//! Depend on the `idem` crate with feature `consumer` (and `sqs`, `lambda`, `nats`, `kafka` for
//! the brokers): it re-exports this crate as `idem::consumer`.
//!
//! A [`Consumer`] holds an engine and a scope. [`Consumer::process`] takes a batch of
//! [`Message`]s (a body, a key for each, `None` for no deduplication, and for ordered queues a
//! group) and a handler, runs each message's handler through the engine with bounded concurrency,
//! and returns one outcome per message, in the batch's order. The handler's `Ok` value is stored
//! under the message's key, so a redelivery replays it without running the handler.
//!
//! | outcome | what the broker does ([`Disposition`]) |
//! |---|---|
//! | [`Done`](MessageOutcome::Done): ran now, result stored | acknowledge |
//! | [`Replayed`](MessageOutcome::Replayed): done earlier | acknowledge |
//! | [`NotRetained`](MessageOutcome::NotRetained): done earlier, result too large to keep | acknowledge, never run again |
//! | [`InFlight`](MessageOutcome::InFlight): its twin runs elsewhere now | hand back, redeliver after `retry_after` |
//! | [`Failed`](MessageOutcome::Failed): the handler failed or panicked, or the store did | hand back; the key is free for the redelivery |
//! | [`NotProcessed`](MessageOutcome::NotProcessed): an earlier message of its group did not finish, or the batch's deadline came first | hand back |
//! | [`Poison`](MessageOutcome::Poison): its key was used for another payload (or under another policy version), or cannot be a key | dead-letter |
//! | [`Uncertain`](MessageOutcome::Uncertain): an earlier delivery's claim, made with `OnLapse::Uncertain`, lapsed with no result | dead-letter, never redelivered forever; resolve it (`idem resolve`, a reconciler) |
//! | [`Closed`](MessageOutcome::Closed): done earlier and its result expired (a tombstone), or resolved as abandoned | acknowledge, never run again |
//!
//! Brokers: `docs/consumers.md` says what each outcome becomes on SQS, Lambda and others, and
//! how the claim's lease and the broker's visibility timeout move together. A long-running
//! consumer is one loop over a [`Broker`] ([`Consumer::run`]): receive a batch, run it while
//! extending the broker's hold on its messages, settle each message by its outcome. The SQS
//! ([`sqs`], feature `sqs`), NATS JetStream ([`nats`], feature `nats`) and Kafka ([`kafka`],
//! feature `kafka`: in order per partition, committing past final outcomes only) consumers are
//! that loop over their brokers; a broker of your own implements the trait.
//!
//! ```
//! use idem::consumer::{Consumer, Message, MessageOutcome};
//! use idem::{Idempotency, MemoryStore};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
//! let consumer = Consumer::new(Idempotency::new(MemoryStore::new()), "charge")?;
//! // The queue delivered order 1 twice.
//! let batch = vec![
//!     Message::keyed(4200u64, "order-1"),
//!     Message::keyed(900, "order-2"),
//!     Message::keyed(4200, "order-1"),
//! ];
//! let charge = |cents: u64| async move { Ok::<_, std::io::Error>(format!("charged {cents}")) };
//! let outcomes = consumer.process(batch, charge).await;
//! assert!(matches!(&outcomes[0], MessageOutcome::Done(r) if r == "charged 4200"));
//! assert!(matches!(&outcomes[2], MessageOutcome::Replayed(r) if r == "charged 4200"));
//! assert!(outcomes.iter().all(|o| o.disposition().acknowledges()));
//! # Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use idem_core::{
    Call, Codec, Error, Fingerprint, Idempotency, JsonCodec, Key, OnLapse, OnLocked, Outcome, Steps,
};

mod broker;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;
#[cfg(feature = "lambda")]
#[cfg_attr(docsrs, doc(cfg(feature = "lambda")))]
pub mod lambda;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub mod sqs;

pub use broker::{Broker, Received};

/// One message of a batch: its body (moved into the handler), the key that deduplicates it, and
/// optionally a fingerprint and an ordering group.
///
/// ```
/// use idem::consumer::Message;
/// use idem::Fingerprint;
/// let m = Message::keyed("payload", "msg-1")
///     .fingerprint(Fingerprint::of_bytes(b"payload"))
///     .group("customer-7");
/// assert_eq!(m.key(), Some("msg-1"));
/// assert_eq!(*m.body(), "payload");
/// ```
#[derive(Debug, Clone)]
pub struct Message<M> {
    body: M,
    key: Option<String>,
    fingerprint: Option<Fingerprint>,
    group: Option<String>,
}

impl<M> Message<M> {
    /// A message deduplicated by `key` (a message id, a deduplication id, a business key taken
    /// from the payload): 1 to 255 bytes of printable ASCII, or the message is
    /// [`Poison`](MessageOutcome::Poison).
    pub fn keyed(body: M, key: impl Into<String>) -> Message<M> {
        Message {
            body,
            key: Some(key.into()),
            fingerprint: None,
            group: None,
        }
    }

    /// A message with no key: its handler runs every time it is delivered.
    ///
    /// ```
    /// let m = idem::consumer::Message::unkeyed(1u8);
    /// assert_eq!(m.key(), None);
    /// ```
    pub fn unkeyed(body: M) -> Message<M> {
        Message {
            body,
            key: None,
            fingerprint: None,
            group: None,
        }
    }

    /// What the message says: a later message under the same key with another fingerprint is
    /// [`Poison`](MessageOutcome::Poison) ([`Error::KeyReused`]) instead of a replay.
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Message<M> {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// The ordering group (an SQS FIFO message group id, a Kinesis shard): in
    /// [`ordered`](Consumer::ordered) mode the messages of one group run one after another, in
    /// batch order, and the group stops at its first message that is not acknowledged.
    pub fn group(mut self, group: impl Into<String>) -> Message<M> {
        self.group = Some(group.into());
        self
    }

    /// The body.
    pub fn body(&self) -> &M {
        &self.body
    }

    /// The key, if any.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }
}

/// A message handler, as [`Consumer::process`] and every broker's `run` and `process` take it:
/// an async function of a message's body `M` that does the message's work in the future it
/// returns. Its `Ok` value is stored under the message's key and replayed to redeliveries; its
/// `Err` fails the message. The future runs detached (to its end even if the batch is
/// dropped), so it and what it gives are `Send + 'static`. Any `Fn(M) -> F` whose `F` is such
/// a future of `Result<T, E>`, with `T` serializable, is a handler: a closure or an
/// `async fn`, as written.
///
/// ```
/// use idem::consumer::MessageHandler;
/// fn handler() -> impl MessageHandler<u64, Value = String, Error = std::io::Error> {
///     |cents: u64| async move { Ok(format!("charged {cents}")) }
/// }
/// # let _ = handler();
/// ```
pub trait MessageHandler<M>: Fn(M) -> Self::Work {
    /// What the work gives when it succeeds: stored and replayed.
    type Value: Serialize + DeserializeOwned + Send + 'static;
    /// What the work fails with: [`Failure::Handler`].
    type Error: Send + 'static;
    /// The future the handler returns: the message's work.
    type Work: Future<Output = Result<Self::Value, Self::Error>> + Send + 'static;
}

impl<M, H, F, T, E> MessageHandler<M> for H
where
    H: Fn(M) -> F,
    F: Future<Output = Result<T, E>> + Send + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: Send + 'static,
{
    type Value = T;
    type Error = E;
    type Work = F;
}

/// What happened to one message, and so what its broker should do with it
/// ([`disposition`](Self::disposition)).
///
/// ```
/// use std::time::Duration;
/// use idem::consumer::{Disposition, MessageOutcome};
/// let twin: MessageOutcome<u8, std::io::Error> =
///     MessageOutcome::InFlight { retry_after: Duration::from_secs(2) };
/// assert_eq!(twin.disposition(), Disposition::Redeliver { after: Some(Duration::from_secs(2)) });
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum MessageOutcome<T, E> {
    /// The handler ran now and its result is stored: acknowledge.
    Done(T),
    /// The handler ran for an earlier delivery; this is its stored result: acknowledge.
    Replayed(T),
    /// The handler ran for an earlier delivery but its result could not be kept (too large, not
    /// encodable): acknowledge; it never runs again under this key.
    NotRetained,
    /// The message's twin is running elsewhere now: hand it back to be redelivered after
    /// `retry_after`. Never acknowledge it: if the other run fails, this copy is the one that
    /// gets the work done.
    InFlight {
        /// When the other run should be over (an estimate, within what is left of its lease).
        retry_after: Duration,
    },
    /// The handler failed or panicked, or the store failed: hand it back; its key is free, so
    /// the redelivery runs the handler again.
    Failed(Failure<E>),
    /// The message did not run in this batch: an earlier message of its group (ordered mode) was
    /// not acknowledged, or the batch's deadline came first. Hand it back.
    NotProcessed,
    /// The message can never succeed as it is: its key was used for another payload
    /// ([`Error::KeyReused`]), or its key or fingerprint is invalid ([`Error::InvalidKey`],
    /// [`Error::Fingerprint`]), or under another policy version ([`Error::PolicyChanged`]).
    /// Route it to a dead-letter queue.
    Poison(Error),
    /// An earlier delivery's handler claimed the key for work whose effect must not repeat
    /// (`on_lapse(OnLapse::Uncertain)`) and its claim lapsed with no result
    /// ([`Error::Uncertain`], naming the operation): whether it took effect is unknown. Route
    /// it to a dead-letter queue, never redeliver it forever; an operator or a reconciler
    /// resolves the operation (`idem uncertain`, `idem resolve`), and a redrive then replays or
    /// runs it as resolved.
    Uncertain(Error),
    /// An earlier delivery's operation is closed without a result to replay: its result's
    /// retention ended and its key is a tombstone ([`Error::ResultExpired`]), or an operator
    /// resolved it as abandoned ([`Error::Abandoned`]). Acknowledge: it never runs again
    /// under this key.
    Closed(Error),
}

/// Why a message [`Failed`](MessageOutcome::Failed).
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure<E> {
    /// The handler returned this error.
    Handler(E),
    /// The handler panicked, with this message.
    Panicked(String),
    /// The engine could not run the message: the store is unreachable, or the claim was taken
    /// over while the handler ran ([`Error::LeaseLost`]: the handler may have run twice).
    Engine(Error),
}

impl<E: fmt::Display> fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Handler(e) => write!(f, "the handler failed: {e}"),
            Failure::Panicked(m) => write!(f, "the handler panicked: {m}"),
            Failure::Engine(e) => write!(f, "{e}"),
        }
    }
}

/// What a broker does with a message, from its [`MessageOutcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Acknowledge (delete) it: it is done and will replay if delivered again.
    Acknowledge,
    /// Hand it back to be delivered again, after `after` if given.
    Redeliver {
        /// How long to keep it invisible first (`None`: the broker's own delay).
        after: Option<Duration>,
    },
    /// Send it to a dead-letter queue: delivered again, it would fail the same way.
    DeadLetter,
}

impl Disposition {
    /// Whether the message is to be acknowledged.
    ///
    /// ```
    /// assert!(idem::consumer::Disposition::Acknowledge.acknowledges());
    /// ```
    pub fn acknowledges(self) -> bool {
        self == Disposition::Acknowledge
    }
}

impl<T, E> MessageOutcome<T, E> {
    /// What the broker should do with the message.
    pub fn disposition(&self) -> Disposition {
        match self {
            MessageOutcome::Done(_)
            | MessageOutcome::Replayed(_)
            | MessageOutcome::NotRetained
            | MessageOutcome::Closed(_) => Disposition::Acknowledge,
            MessageOutcome::InFlight { retry_after } => Disposition::Redeliver {
                after: Some(*retry_after),
            },
            MessageOutcome::Failed(_) | MessageOutcome::NotProcessed => {
                Disposition::Redeliver { after: None }
            }
            MessageOutcome::Poison(_) | MessageOutcome::Uncertain(_) => Disposition::DeadLetter,
        }
    }

    /// The outcome's name, as the `outcome` label of `idem_messages_total`: `done`, `replayed`,
    /// `not_retained`, `in_flight`, `failed`, `not_processed`, `poison`, `uncertain`, `closed`.
    ///
    /// ```
    /// let o: idem::consumer::MessageOutcome<u8, String> =
    ///     idem::consumer::MessageOutcome::NotProcessed;
    /// assert_eq!(o.as_str(), "not_processed");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            MessageOutcome::Done(_) => "done",
            MessageOutcome::Replayed(_) => "replayed",
            MessageOutcome::NotRetained => "not_retained",
            MessageOutcome::InFlight { .. } => "in_flight",
            MessageOutcome::Failed(_) => "failed",
            MessageOutcome::NotProcessed => "not_processed",
            MessageOutcome::Poison(_) => "poison",
            MessageOutcome::Uncertain(_) => "uncertain",
            MessageOutcome::Closed(_) => "closed",
        }
    }

    /// The handler's result, done now or replayed.
    pub fn value(&self) -> Option<&T> {
        match self {
            MessageOutcome::Done(v) | MessageOutcome::Replayed(v) => Some(v),
            _ => None,
        }
    }

    /// Maps an engine outcome (or error) to a message outcome.
    fn of(result: Result<Outcome<T>, Wrapped<E>>) -> MessageOutcome<T, E> {
        match result {
            Ok(Outcome::Fresh(v)) => MessageOutcome::Done(v),
            Ok(Outcome::Replayed(v)) => MessageOutcome::Replayed(v),
            Err(Wrapped::Handler(e)) => MessageOutcome::Failed(Failure::Handler(e)),
            Err(Wrapped::Engine(e)) => match e {
                Error::Locked { retry_after } => MessageOutcome::InFlight { retry_after },
                Error::ResultNotRetained { .. } => MessageOutcome::NotRetained,
                Error::KeyReused
                | Error::PolicyChanged { .. }
                | Error::InvalidKey(_)
                | Error::Fingerprint(_) => MessageOutcome::Poison(e),
                Error::Uncertain { .. } => MessageOutcome::Uncertain(e),
                Error::ResultExpired { .. } | Error::Abandoned { .. } => MessageOutcome::Closed(e),
                e => MessageOutcome::Failed(Failure::Engine(e)),
            },
        }
    }
}

/// The handler's error or the engine's, through the engine call.
enum Wrapped<E> {
    Handler(E),
    Engine(Error),
}

impl<E> From<Error> for Wrapped<E> {
    fn from(e: Error) -> Self {
        Wrapped::Engine(e)
    }
}

/// Runs batches of messages through an engine: one call per message, under one scope, with
/// bounded concurrency. Cheap to clone; the setters return a changed copy (a Lambda handler
/// sets each invocation's lease and deadline on a clone).
///
/// | setting | what it does | default |
/// |---|---|---|
/// | [`concurrency`](Self::concurrency) | how many messages (ordered: groups) run at once | 16 |
/// | [`ordered`](Self::ordered) | run each [`group`](Message::group) in order and stop it at its first message not acknowledged | off |
/// | [`lease`](Self::lease) | the claim's lease (keep it at most the broker's visibility timeout) | the engine's |
/// | [`deadline`](Self::deadline) | when the batch stops starting messages and answers | none |
///
/// A message that meets its twin running elsewhere fails fast ([`MessageOutcome::InFlight`])
/// whatever the engine's [`OnLocked`]: the broker redelivers it, where waiting would hold the
/// whole batch. Twins inside one batch (same key) run one after the other, so the second
/// replays the first.
///
/// Each message's handler is detached once its claim is won
/// ([`Call::run_detached`](Call::run_detached)): if the caller drops the batch (or its
/// deadline passes), the handlers that started run to their end and their results are stored,
/// so the redelivery replays them; the messages that had not started never start.
///
/// ```
/// use std::time::Duration;
/// use idem::consumer::Consumer;
/// use idem::{Idempotency, MemoryStore};
/// let consumer = Consumer::new(Idempotency::new(MemoryStore::new()), "orders")?
///     .concurrency(8)
///     .ordered(true)
///     .lease(Duration::from_secs(30));
/// # let _ = consumer; Ok::<(), idem::Error>(())
/// ```
#[derive(Debug)]
pub struct Consumer<C = JsonCodec> {
    engine: Idempotency<C>,
    scope: Arc<str>,
    concurrency: usize,
    ordered: bool,
    lease: Option<Duration>,
    on_lapse: Option<OnLapse>,
    deadline: Option<Instant>,
    /// The slots of the long-running loop that runs this copy ([`Consumer::run`]): each
    /// message gives its own back as its outcome is known.
    room: Option<Arc<broker::Room>>,
}

impl<C> Clone for Consumer<C> {
    fn clone(&self) -> Self {
        Consumer {
            engine: self.engine.clone(),
            scope: self.scope.clone(),
            concurrency: self.concurrency,
            ordered: self.ordered,
            lease: self.lease,
            on_lapse: self.on_lapse,
            deadline: self.deadline,
            room: self.room.clone(),
        }
    }
}

impl<C: Codec> Consumer<C> {
    /// A consumer running its messages through `engine` under `scope` (the operation: 1 to 255
    /// bytes of printable ASCII; it names the keys, the metrics and the traces). A message's key
    /// is derived from the scope and the message's own key.
    pub fn new(engine: Idempotency<C>, scope: impl Into<Arc<str>>) -> Result<Consumer<C>, Error> {
        let scope = scope.into();
        // The scope is checked once here, not found wrong in every message.
        Key::derive(&scope, "", "-")?;
        Ok(Consumer {
            engine,
            scope,
            concurrency: 16,
            ordered: false,
            lease: None,
            on_lapse: None,
            deadline: None,
            room: None,
        })
    }

    /// How many messages run at once (in ordered mode, how many groups); at least 1.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Ordered (FIFO) mode: the messages of one [`group`](Message::group) run one after
    /// another in batch order, and a group stops at its first message that is not acknowledged
    /// (failed, in flight, poison): it and every later message of the group are handed back
    /// ([`NotProcessed`](MessageOutcome::NotProcessed) for the later ones). A message without a
    /// group is a group of its own.
    pub fn ordered(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// The lease of each message's claim. Keep it no longer than the broker keeps the message
    /// invisible (or extend the visibility while the handler runs, as the SQS consumer does):
    /// a message that reappears while its claim lives meets it as
    /// [`InFlight`](MessageOutcome::InFlight).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// What a message's key becomes if its handler's claim lapses with no result (the consumer
    /// process died or stalled past the lease): free, so the redelivery runs the handler again
    /// (the engine's [`Policy::on_lapse`](idem_core::Policy::on_lapse), by default), or, for
    /// handlers with an effect outside the store that must not repeat,
    /// [`OnLapse::Uncertain`]: the redelivery is then
    /// [`Uncertain`](MessageOutcome::Uncertain) and goes to the dead-letter queue until the
    /// operation is resolved.
    ///
    /// ```
    /// use idem::consumer::Consumer;
    /// use idem::{Idempotency, MemoryStore, OnLapse};
    /// let consumer = Consumer::new(Idempotency::new(MemoryStore::new()), "charges")?
    ///     .on_lapse(OnLapse::Uncertain);
    /// # let _ = consumer; Ok::<(), idem::Error>(())
    /// ```
    pub fn on_lapse(mut self, on_lapse: OnLapse) -> Self {
        self.on_lapse = Some(on_lapse);
        self
    }

    /// When the batch stops: messages not finished by then are
    /// [`NotProcessed`](MessageOutcome::NotProcessed). Handlers already running go on (detached)
    /// and store their results.
    pub fn deadline(mut self, deadline: impl Into<Option<Instant>>) -> Self {
        self.deadline = deadline.into();
        self
    }

    /// The engine.
    pub fn engine(&self) -> &Idempotency<C> {
        &self.engine
    }

    /// The scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Runs each message's handler through the engine and returns one outcome per message, in
    /// the batch's order. The handler is called only for messages that run now (not for
    /// replays), and must do its work in the future it returns; its `Ok` value is stored and
    /// replayed to redeliveries. A panic in a handler fails its message only.
    pub async fn process<M, H>(
        &self,
        messages: Vec<Message<M>>,
        handler: H,
    ) -> Vec<MessageOutcome<H::Value, H::Error>>
    where
        H: MessageHandler<M>,
    {
        self.batch(messages, |key, fingerprint, body| {
            let work = handler(body);
            let work = async move { work.await.map_err(Wrapped::Handler) };
            caught(self.call(key, fingerprint).run_detached(work))
        })
        .await
    }

    /// Exactly-once effects: [`process`](Self::process) whose handler runs each message as a
    /// [steps operation](Call::run_steps) and is given its [`Steps`] handle, to apply
    /// the message's effect as **one transactional step** that commits the effect's writes and
    /// the step's record together, fenced by the message's claim:
    /// `steps.tx` (`idem::SqlSteps`) on SQLite and PostgreSQL (the handler's SQL writes, in its
    /// transaction),
    /// `DynamoSteps::dynamo_tx` on DynamoDB (the handler's items, in one `TransactWriteItems`).
    ///
    /// An effect outside the store cannot be applied exactly once: a consumer killed after the
    /// effect and before its result is stored leaves a message that runs again. Here the
    /// effect and its record are one commit: a consumer killed before it leaves nothing (the
    /// redelivery runs the handler once its lease ends); killed after it, the redelivery takes
    /// the claim over, finds the step finished, replays its result instead of applying the
    /// effect again, and completes. A claim taken over while the handler ran (a lease that
    /// ended) makes the step's commit fail ([`Error::LeaseLost`]): the effect is rolled back,
    /// and the message fails and is redelivered. Do the slow part of the handler (calls, the
    /// work that decides what to write) before the step, not inside its transaction: SQLite
    /// holds its write lock from `BEGIN IMMEDIATE` to the commit.
    ///
    /// The outcomes are as [`process`](Self::process)'s; the handler's errors come back as
    /// [`Failure::Handler`] (its `E` carries the step's own errors, [`Error::LeaseLost`]
    /// among them, through `E: From<Error>`). Unlike `process`, a handler is not detached: a
    /// batch dropped mid-way (or cut by its deadline) drops its running handlers, whose steps
    /// commit whole or not at all, so the redelivery finishes them. Round trips per message:
    /// `process`'s, plus `begin_steps` (2 statements on SQL, 2 requests on DynamoDB) and the
    /// step's commit (which carries the effect).
    ///
    /// ```
    /// use idem::consumer::{Consumer, Message};
    /// use idem::{Error, Idempotency, SqlSteps, SqliteStore};
    /// use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = SqliteStore::open(dir.path().join("shop.db")).await?;
    /// sqlx::query("CREATE TABLE charges (order_id TEXT, cents INTEGER)").execute(store.pool()).await?;
    /// let consumer = Consumer::new(Idempotency::new(store.clone()), "charge")?;
    /// // Order 1 delivered twice.
    /// let batch = vec![
    ///     Message::keyed(("order-1", 4200i64), "order-1"),
    ///     Message::keyed(("order-1", 4200), "order-1"),
    /// ];
    /// let store = &store;
    /// let outcomes = consumer
    ///     .process_steps(batch, |(order, cents), steps| async move {
    ///         // The slow part (deciding what to write) goes here, outside the transaction.
    ///         let mut conn = store.pool().acquire().await.map_err(idem::sql_error)?;
    ///         let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(idem::sql_error)?;
    ///         steps.tx(store, &mut tx, "charge", |tx| Box::pin(async move {
    ///             sqlx::query("INSERT INTO charges VALUES (?, ?)").bind(order).bind(cents)
    ///                 .execute(&mut *tx).await.map_err(idem::sql_error)?;
    ///             Ok::<_, Error>(())
    ///         })).await?;
    ///         tx.commit().await.map_err(idem::sql_error)?;
    ///         Ok::<_, Error>(cents)
    ///     })
    ///     .await;
    /// assert!(outcomes.iter().all(|o| o.disposition().acknowledges()));
    /// let charges: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM charges").fetch_one(store.pool()).await?;
    /// assert_eq!(charges, 1);
    /// # Ok(()) }
    /// ```
    pub async fn process_steps<M, T, E, H, F>(
        &self,
        messages: Vec<Message<M>>,
        handler: H,
    ) -> Vec<MessageOutcome<T, E>>
    where
        H: Fn(M, Steps<C>) -> F,
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
    {
        let handler = &handler;
        self.batch(messages, |key, fingerprint, body| {
            let work = move |steps: Steps<C>| {
                let work = handler(body, steps);
                async move { work.await.map_err(Wrapped::Handler) }
            };
            caught(self.call(key, fingerprint).run_steps(work))
        })
        .await
    }

    /// Runs a batch: each message through `run` (its key, fingerprint and body to its
    /// outcome), in lanes with bounded concurrency, until the deadline; counts the outcomes.
    async fn batch<M, T, E, R, RF>(
        &self,
        messages: Vec<Message<M>>,
        run: R,
    ) -> Vec<MessageOutcome<T, E>>
    where
        R: Fn(Option<Key>, Option<Fingerprint>, M) -> RF,
        RF: Future<Output = MessageOutcome<T, E>>,
    {
        let total = messages.len();
        let slots: Mutex<Vec<Option<MessageOutcome<T, E>>>> =
            Mutex::new((0..total).map(|_| None).collect());
        let lanes = self.lanes(messages, &slots);
        // The loop's slots: the messages answered while the lanes were made (poison) give
        // theirs back now, each message a lane runs as its outcome lands, the rest (not
        // processed) once the batch is over.
        let laned: usize = lanes.iter().map(Vec::len).sum();
        let answered = AtomicUsize::new(total - laned);
        self.give_room(total - laned);
        let given = Given {
            room: self.room.as_deref(),
            answered: &answered,
        };
        let run = &run;
        let slots_ref = &slots;
        let given = &given;
        let run_all = async {
            let mut lanes = lanes.into_iter();
            let mut running = FuturesUnordered::new();
            for lane in lanes.by_ref().take(self.concurrency) {
                running.push(self.lane(lane, run, slots_ref, given));
            }
            while running.next().await.is_some() {
                if let Some(lane) = lanes.next() {
                    running.push(self.lane(lane, run, slots_ref, given));
                }
            }
        };
        match self.deadline {
            Some(deadline) => {
                let _ = tokio::time::timeout_at(deadline, run_all).await;
            }
            None => run_all.await,
        }
        self.give_room(total.saturating_sub(answered.load(Ordering::Relaxed)));
        let outcomes: Vec<MessageOutcome<T, E>> = slots
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .into_iter()
            .map(|slot| slot.unwrap_or(MessageOutcome::NotProcessed))
            .collect();
        for outcome in &outcomes {
            count(&self.scope, outcome.as_str());
        }
        outcomes
    }

    /// Splits the batch into lanes, each run in order by one task: in ordered mode one lane per
    /// group; otherwise one per key, so twins in the batch run one after the other and the
    /// later ones replay. Messages whose key cannot be made are answered here.
    fn lanes<M, T, E>(
        &self,
        messages: Vec<Message<M>>,
        slots: &Mutex<Vec<Option<MessageOutcome<T, E>>>>,
    ) -> Vec<Vec<Prepared<M>>> {
        let mut lanes: Vec<Vec<Prepared<M>>> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (index, message) in messages.into_iter().enumerate() {
            let key = match &message.key {
                Some(client_key) => match Key::derive(&self.scope, "", client_key) {
                    Ok(key) => Some(key),
                    Err(e) => {
                        let poison = MessageOutcome::Poison(Error::InvalidKey(e));
                        put(slots, index, poison);
                        if let (true, Some(group)) = (self.ordered, &message.group) {
                            // The group stops here: its later messages wait for this one.
                            by_name.insert(group.clone(), usize::MAX);
                        }
                        continue;
                    }
                },
                None => None,
            };
            let lane_name = if self.ordered {
                message.group.clone()
            } else {
                message.key.clone()
            };
            let prepared = Prepared {
                index,
                key,
                fingerprint: message.fingerprint,
                body: message.body,
            };
            match lane_name {
                Some(name) => match by_name.get(&name) {
                    Some(&usize::MAX) => {}
                    Some(&lane) => lanes[lane].push(prepared),
                    None => {
                        by_name.insert(name, lanes.len());
                        lanes.push(vec![prepared]);
                    }
                },
                None => lanes.push(vec![prepared]),
            }
        }
        lanes
    }

    /// Runs one lane's messages in order; in ordered mode it stops at the first one that is
    /// not acknowledged, leaving the rest unanswered (not processed).
    async fn lane<M, T, E, R, RF>(
        &self,
        lane: Vec<Prepared<M>>,
        run: &R,
        slots: &Mutex<Vec<Option<MessageOutcome<T, E>>>>,
        given: &Given<'_>,
    ) where
        R: Fn(Option<Key>, Option<Fingerprint>, M) -> RF,
        RF: Future<Output = MessageOutcome<T, E>>,
    {
        for message in lane {
            // Nothing starts once the deadline has passed (the batch's timeout polls the lanes
            // once more before it notices).
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            let outcome = run(message.key, message.fingerprint, message.body).await;
            let stop = self.ordered && !outcome.disposition().acknowledges();
            put(slots, message.index, outcome);
            given.one();
            if stop {
                return;
            }
        }
    }

    /// Gives `n` slots back to the loop that runs this consumer, if one does.
    fn give_room(&self, n: usize) {
        if let Some(room) = &self.room {
            room.give(n);
        }
    }

    /// The engine call of one message: fails fast on a twin in flight, under the consumer's
    /// lease.
    fn call(&self, key: Option<Key>, fingerprint: Option<Fingerprint>) -> Call<'_, Idempotency<C>> {
        let call = self
            .engine
            .call(key)
            .scope_named(self.scope.clone())
            .fingerprint(fingerprint)
            .on_locked(OnLocked::FailFast);
        let call = match self.on_lapse {
            Some(on_lapse) => call.on_lapse(on_lapse),
            None => call,
        };
        match self.lease {
            Some(lease) => call.lease(lease),
            None => call,
        }
    }
}

/// A message's engine call to its outcome. A panic in the handler is resumed by the engine
/// after it released the claim: it fails this message, not the batch.
async fn caught<T, E>(
    call: impl Future<Output = Result<Outcome<T>, Wrapped<E>>>,
) -> MessageOutcome<T, E> {
    match AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => MessageOutcome::of(result),
        Err(panic) => MessageOutcome::Failed(Failure::Panicked(panic_message(&*panic))),
    }
}

/// A batch's count of the messages whose outcome is known, each giving its slot back to the
/// loop that runs the batch (if one does) as it lands.
struct Given<'a> {
    room: Option<&'a broker::Room>,
    answered: &'a AtomicUsize,
}

impl Given<'_> {
    fn one(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        if let Some(room) = self.room {
            room.give(1);
        }
    }
}

/// A message with its key made, waiting for its turn in a lane.
struct Prepared<M> {
    index: usize,
    key: Option<Key>,
    fingerprint: Option<Fingerprint>,
    body: M,
}

fn put<T, E>(
    slots: &Mutex<Vec<Option<MessageOutcome<T, E>>>>,
    index: usize,
    outcome: MessageOutcome<T, E>,
) {
    if let Some(slot) = slots
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_mut(index)
    {
        *slot = Some(outcome);
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Counts a message's outcome in `idem_messages_total` (feature `metrics`).
#[cfg(feature = "metrics")]
fn count(scope: &Arc<str>, outcome: &'static str) {
    metrics::counter!(
        "idem_messages_total",
        "scope" => metrics::SharedString::from(scope.clone()),
        "outcome" => outcome
    )
    .increment(1);
}

#[cfg(not(feature = "metrics"))]
fn count(_scope: &Arc<str>, _outcome: &'static str) {}
