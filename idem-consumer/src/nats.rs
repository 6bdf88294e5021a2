//! A NATS JetStream consumer (feature `nats`, over `async-nats`): fetches batches from a pull
//! consumer, runs them through a [`Consumer`], and answers each message by its outcome.
//!
//! | outcome | answer |
//! |---|---|
//! | done, replayed, not retained | `ack` |
//! | in flight elsewhere | `nak` with a delay of `retry_after` |
//! | failed, not processed | `nak` (redelivered at once; the consumer's `backoff` spaces it) |
//! | poison, uncertain | `term`: never redelivered (JetStream's dead-letter: an advisory on `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED`) |
//! | closed | `ack` |
//!
//! A message's key is its `Nats-Msg-Id` header (the publisher's deduplication id), else its
//! stream and stream sequence (which a redelivery keeps). **Ack wait and lease move together:**
//! the claims' lease is the [`ack_wait`](NatsConsumer::ack_wait) (set it to the pull consumer's
//! `ack_wait`), and while a batch runs every message of it gets an in-progress ack every third of
//! it as the engine renews the claims, so JetStream does not redeliver a message whose claim lives.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::message::{AckKind, Acker};
use futures_util::StreamExt;

use crate::{Broker, Consumer, Disposition, Message, MessageHandler, MessageOutcome, Received};
use idem_core::Codec;

/// The async-nats (0.51) whose JetStream consumers a [`NatsConsumer`] reads.
pub use async_nats;

/// How a message's key is found.
type KeyOf = Arc<dyn Fn(&async_nats::Message) -> Option<String> + Send + Sync>;

/// Runs a JetStream pull consumer's messages through a [`Consumer`]. Cheap to clone.
///
/// ```no_run
/// use idem::consumer::nats::{async_nats, NatsConsumer};
/// use idem::consumer::Consumer;
/// use idem::{Idempotency, MemoryStore};
/// # async fn doc(pull: async_nats::jetstream::consumer::PullConsumer) -> Result<(), idem::Error> {
/// let orders = NatsConsumer::new(Consumer::new(Idempotency::new(MemoryStore::new()), "charge")?);
/// let handler = |m: async_nats::Message| async move { Ok::<_, std::io::Error>(m.payload.len()) };
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// # drop(stop);
/// orders.run(&pull, handler, async { let _ = stopped.await; }).await;
/// # Ok(()) }
/// ```
pub struct NatsConsumer<C> {
    consumer: Consumer<C>,
    ack_wait: Duration,
    batch: usize,
    wait: Duration,
    key: Option<KeyOf>,
}

impl<C> Clone for NatsConsumer<C> {
    fn clone(&self) -> Self {
        NatsConsumer {
            consumer: self.consumer.clone(),
            ack_wait: self.ack_wait,
            batch: self.batch,
            wait: self.wait,
            key: self.key.clone(),
        }
    }
}

impl<C> fmt::Debug for NatsConsumer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConsumer")
            .field("ack_wait", &self.ack_wait)
            .field("batch", &self.batch)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl<C: Codec> NatsConsumer<C> {
    /// Batches through `consumer`, with an ack wait of 30 s (JetStream's default), as many
    /// messages a fetch as `consumer` runs at once ([`Consumer::concurrency`], 16 unless set),
    /// waiting up to 5 s for them.
    pub fn new(consumer: Consumer<C>) -> NatsConsumer<C> {
        NatsConsumer {
            // The loop asks for the room it has left, at most this: a smaller batch would
            // leave some of the consumer's concurrency unused.
            batch: consumer.concurrency,
            consumer,
            ack_wait: Duration::from_secs(30),
            wait: Duration::from_secs(5),
            key: None,
        }
    }

    /// The pull consumer's `ack_wait`: the claims' lease, and what in-progress acks extend.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait.max(Duration::from_millis(3));
        self
    }

    /// The most messages a fetch asks for (at least 1; by default the consumer's concurrency).
    /// The loop asks for the room it has left (the concurrency less the messages running),
    /// at most this: a smaller batch leaves some of the concurrency unused.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// How long a fetch waits for messages.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// How each message's key is found (`None`: no deduplication), instead of its
    /// `Nats-Msg-Id` or stream sequence: a business id from the payload.
    pub fn keyed_by(
        mut self,
        key: impl Fn(&async_nats::Message) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// Fetches and processes batches from `pull` until `shutdown` resolves; then stops fetching,
    /// finishes the batches in hand (handlers and answers) and returns. A failed fetch is logged
    /// and tried again after a second. The loop is [`Consumer::run`]'s, over the pull consumer
    /// as a [`Broker`].
    pub async fn run<H>(&self, pull: &PullConsumer, handler: H, shutdown: impl Future<Output = ()>)
    where
        H: MessageHandler<async_nats::Message>,
        H::Error: fmt::Display,
    {
        let broker = Pull {
            pull: Some(pull),
            nats: self,
        };
        self.consumer.run(&broker, handler, shutdown).await
    }

    /// [`run`](Self::run) with exactly-once effects ([`Consumer::run_steps`]): the handler
    /// applies each message's effect as a transactional step (`steps.tx`, `dynamo_tx`), so a
    /// consumer killed at any point applies it once.
    ///
    /// ```no_run
    /// use idem::consumer::nats::{async_nats, NatsConsumer};
    /// use idem::consumer::Consumer;
    /// use idem::{Error, Idempotency, MemoryStore, Steps};
    /// # async fn doc(pull: async_nats::jetstream::consumer::PullConsumer) -> Result<(), Error> {
    /// let nats = NatsConsumer::new(Consumer::new(Idempotency::new(MemoryStore::new()), "apply")?);
    /// let handler = |m: async_nats::Message, steps: Steps| async move {
    ///     steps.run("apply", || async { Ok::<_, Error>(m.payload.len()) }).await
    /// };
    /// nats.run_steps(&pull, handler, std::future::pending()).await;
    /// # Ok(()) }
    /// ```
    pub async fn run_steps<T, E, H, F>(
        &self,
        pull: &PullConsumer,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) where
        H: Fn(async_nats::Message, idem_core::Steps<C>) -> F,
        F: Future<Output = Result<T, E>>,
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: fmt::Display,
    {
        let broker = Pull {
            pull: Some(pull),
            nats: self,
        };
        self.consumer.run_steps(&broker, handler, shutdown).await
    }

    /// One fetch: up to `batch` messages, waiting up to `wait`.
    /// One fetch of up to `most` messages (and at most [`batch`](Self::batch)).
    async fn fetch(
        &self,
        pull: &PullConsumer,
        most: usize,
    ) -> Result<Vec<async_nats::jetstream::Message>, async_nats::Error> {
        let mut batch = pull
            .fetch()
            .max_messages(self.batch.min(most).max(1))
            .expires(self.wait)
            .messages()
            .await?;
        let mut messages = Vec::new();
        while let Some(message) = batch.next().await {
            messages.push(message?);
        }
        Ok(messages)
    }

    /// Runs one fetched batch and answers each message by its outcome; returns the outcomes.
    pub async fn process<H>(
        &self,
        messages: Vec<async_nats::jetstream::Message>,
        handler: &H,
    ) -> Vec<MessageOutcome<H::Value, H::Error>>
    where
        H: MessageHandler<async_nats::Message>,
        H::Error: fmt::Display,
    {
        let received = self.received(messages);
        let broker = Pull {
            pull: None,
            nats: self,
        };
        self.consumer
            .process_received(&broker, received, handler)
            .await
    }

    /// Fetched messages as batch messages, keyed by [`key_of`](Self::key_of), each with its
    /// acker.
    fn received(
        &self,
        messages: Vec<async_nats::jetstream::Message>,
    ) -> Vec<(Message<async_nats::Message>, Acker)> {
        messages
            .into_iter()
            .map(|message| {
                let key = self.key_of(&message);
                let (message, acker) = message.split();
                let message = match key {
                    Some(key) => Message::keyed(message, key),
                    None => Message::unkeyed(message),
                };
                (message, acker)
            })
            .collect()
    }

    /// The key of a message: the key function's, else its `Nats-Msg-Id`, else its stream and
    /// stream sequence.
    fn key_of(&self, message: &async_nats::jetstream::Message) -> Option<String> {
        if let Some(key) = &self.key {
            return key(&message.message);
        }
        let msg_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned());
        msg_id.or_else(|| {
            let info = message.info().ok()?;
            Some(format!("{}:{}", info.stream, info.stream_sequence))
        })
    }
}

/// A pull consumer as a [`Broker`]: fetches from `pull` (none: answers messages fetched
/// already, [`NatsConsumer::process`]); in-progress acks extend the ack wait; `ack`, `nak` (with
/// the delay asked for) and `term` settle.
struct Pull<'a, C> {
    pull: Option<&'a PullConsumer>,
    nats: &'a NatsConsumer<C>,
}

impl<C: Codec> Broker for Pull<'_, C> {
    type Body = async_nats::Message;
    type Receipt = Acker;
    type Error = async_nats::Error;

    fn hold(&self) -> Duration {
        self.nats.ack_wait
    }

    fn name(&self) -> &str {
        "JetStream"
    }

    async fn receive(&self) -> Result<Received<Self>, Self::Error> {
        self.receive_up_to(self.nats.batch).await
    }

    async fn receive_up_to(&self, most: usize) -> Result<Received<Self>, Self::Error> {
        match self.pull {
            Some(pull) => Ok(self.nats.received(self.nats.fetch(pull, most).await?)),
            None => Ok(Vec::new()),
        }
    }

    async fn extend(&self, held: &[Acker]) {
        for acker in held {
            answer(acker, AckKind::Progress).await;
        }
    }

    async fn settle(&self, settled: Vec<(Acker, Disposition)>) {
        for (acker, disposition) in settled {
            let kind = match disposition {
                Disposition::Acknowledge => AckKind::Ack,
                Disposition::Redeliver { after } => AckKind::Nak(after),
                Disposition::DeadLetter => AckKind::Term,
            };
            answer(&acker, kind).await;
        }
    }
}

/// Sends an ack of `kind`; a failure is logged (the message is redelivered after the ack wait,
/// and replays).
async fn answer(acker: &Acker, kind: AckKind) {
    if let Err(e) = acker.ack_with(kind).await {
        tracing::warn!("answering a JetStream message failed: {e}");
    }
}

/// Publishes outbox messages to NATS JetStream (the [`Dispatcher`](idem_core::Dispatcher)'s
/// [`Publisher`](idem_core::Publisher)): one publish per message, awaited until the stream
/// acknowledges it, on the subject its route names (by default `<prefix>.<aggregate type>`).
/// Each message carries its outbox id as `Nats-Msg-Id`, so the stream drops a second copy
/// within its duplicate window (2 minutes by default) and a [`NatsConsumer`] keys by it, and its
/// type and aggregate as the headers `idem-type`, `idem-aggregate-type`, `idem-aggregate-id`.
///
/// ```no_run
/// use std::sync::Arc;
/// use idem::consumer::nats::{async_nats, NatsPublisher};
/// use idem::{Dispatcher, DispatcherConfig, SqliteOutbox, SqliteStore};
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// let js = async_nats::jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
/// let store = SqliteStore::open("idem.db").await?;
/// let outbox = SqliteOutbox::new(store.pool().clone(), "outbox").await?;
/// let publisher = NatsPublisher::new(js, "events"); // an `order` message goes to `events.order`
/// let dispatcher = Dispatcher::new(Arc::new(store), Arc::new(outbox), Arc::new(publisher), DispatcherConfig::new())?;
/// # let _ = dispatcher;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct NatsPublisher {
    jetstream: async_nats::jetstream::Context,
    route: Arc<dyn Fn(&idem_core::OutboxMessage) -> String + Send + Sync>,
}

impl fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisher").finish_non_exhaustive()
    }
}

impl NatsPublisher {
    /// Publishes each message on `<prefix>.<aggregate type>`.
    pub fn new(jetstream: async_nats::jetstream::Context, prefix: impl Into<String>) -> Self {
        let prefix: String = prefix.into();
        NatsPublisher {
            jetstream,
            route: Arc::new(move |m| format!("{prefix}.{}", m.aggregate_type)),
        }
    }

    /// Publishes each message on the subject `route` gives it.
    ///
    /// ```no_run
    /// # fn doc(js: idem::consumer::nats::async_nats::jetstream::Context) {
    /// use idem::consumer::nats::NatsPublisher;
    /// let publisher = NatsPublisher::routed(js, |m| format!("events.{}.{}", m.aggregate_type, m.kind));
    /// # }
    /// ```
    pub fn routed(
        jetstream: async_nats::jetstream::Context,
        route: impl Fn(&idem_core::OutboxMessage) -> String + Send + Sync + 'static,
    ) -> Self {
        NatsPublisher {
            jetstream,
            route: Arc::new(route),
        }
    }
}

#[async_trait::async_trait]
impl idem_core::Publisher for NatsPublisher {
    async fn publish(&self, m: &idem_core::OutboxMessage) -> Result<(), idem_core::BoxError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            m.id.to_string().as_str(),
        );
        headers.insert("idem-type", m.kind.as_str());
        headers.insert("idem-aggregate-type", m.aggregate_type.as_str());
        headers.insert("idem-aggregate-id", m.aggregate_id.as_str());
        let ack = self
            .jetstream
            .publish_with_headers((self.route)(m), headers, m.payload.clone().into())
            .await?;
        ack.await?;
        Ok(())
    }
}
