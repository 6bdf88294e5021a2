//! A long-running SQS consumer (feature `sqs`, over `aws-sdk-sqs`): long-polls a queue, runs
//! each batch through a [`Consumer`], and settles every message by its outcome.
//!
//! | outcome | what happens to the message |
//! |---|---|
//! | done, replayed, not retained | deleted |
//! | in flight elsewhere | its visibility set to `retry_after` (whole seconds, at least 1), so it comes back when the other run should be over |
//! | failed, not processed | left: it reappears when its visibility timeout ends |
//! | poison, uncertain | left for the queue's redrive policy (`maxReceiveCount` → dead-letter queue); logged as an error. Give every queue a redrive policy: without one such a message comes back until its retention ends |
//! | closed | deleted |
//!
//! **Lease and visibility move together.** Messages are received with a visibility timeout equal
//! to the claims' lease ([`SqsConsumer::visibility`], 30 s by default). While a batch runs, the
//! engine renews each claim every third of the lease, and this consumer extends the visibility of
//! the batch's messages every third of it too, so a message never reappears while its claim
//! lives, and a consumer that dies stops both: its claims end one lease later, when its messages
//! reappear.
//!
//! A FIFO queue (a URL ending in `.fifo`) runs in ordered mode, grouped by `MessageGroupId`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    Message as SqsMessage, MessageSystemAttributeName,
};
use aws_sdk_sqs::Client;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{Broker, Consumer, Disposition, Message, MessageHandler, MessageOutcome, Received};
use idem_core::Codec;
use idem_core::Steps;

/// The aws-sdk-sqs (1.x) whose `Client` an [`SqsConsumer`] is built on.
pub use aws_sdk_sqs;

/// Longest long poll SQS allows.
const MAX_WAIT: Duration = Duration::from_secs(20);

/// A consumer of one SQS queue. Cheap to clone.
///
/// ```no_run
/// use idem::consumer::sqs::{aws_sdk_sqs, SqsConsumer};
/// use idem::consumer::Consumer;
/// use idem::{Idempotency, SqliteStore};
/// # async fn doc(client: aws_sdk_sqs::Client) -> Result<(), idem::Error> {
/// let engine = Idempotency::new(SqliteStore::open("idem.db").await?);
/// let orders = SqsConsumer::new(client, "https://sqs.eu-west-1.amazonaws.com/1234/orders", Consumer::new(engine, "charge")?);
/// let handler = |m: aws_sdk_sqs::types::Message| async move {
///     Ok::<_, std::io::Error>(m.body().unwrap_or_default().len())
/// };
/// // Runs until `stop` fires (a signal handler's sender), then finishes the batches in hand.
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// # drop(stop);
/// orders.run(handler, async { let _ = stopped.await; }).await;
/// # Ok(()) }
/// ```
pub struct SqsConsumer<C> {
    client: Client,
    queue_url: String,
    consumer: Consumer<C>,
    visibility: Duration,
    wait: Duration,
    max_messages: i32,
    key: KeyOf,
}

/// How a message's key is found.
type KeyOf = Arc<dyn Fn(&SqsMessage) -> Option<String> + Send + Sync>;

impl<C> fmt::Debug for SqsConsumer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsConsumer")
            .field("queue_url", &self.queue_url)
            .field("visibility", &self.visibility)
            .field("wait", &self.wait)
            .field("max_messages", &self.max_messages)
            .finish_non_exhaustive()
    }
}

impl<C> Clone for SqsConsumer<C> {
    fn clone(&self) -> Self {
        SqsConsumer {
            client: self.client.clone(),
            queue_url: self.queue_url.clone(),
            consumer: self.consumer.clone(),
            visibility: self.visibility,
            wait: self.wait,
            max_messages: self.max_messages,
            key: self.key.clone(),
        }
    }
}

/// How many messages one receive asks for, and one settling request carries, at most (SQS's
/// limit for both).
const MAX_BATCH: i32 = 10;

impl<C: Codec> SqsConsumer<C> {
    /// A consumer of the queue at `queue_url` through `consumer` (a `.fifo` URL turns on its
    /// ordered mode).
    pub fn new(client: Client, queue_url: impl Into<String>, consumer: Consumer<C>) -> Self {
        let queue_url = queue_url.into();
        let fifo = queue_url.ends_with(".fifo");
        SqsConsumer {
            client,
            queue_url,
            consumer: consumer.ordered(fifo),
            visibility: Duration::from_secs(30),
            wait: MAX_WAIT,
            max_messages: MAX_BATCH,
            key: Arc::new(default_key),
        }
    }

    /// How each message's key is found (`None`: no deduplication): a business id from the body
    /// catches a producer's second send too. By default, the outbox id an [`SqsPublisher`]
    /// sent it with (attribute [`ID_ATTRIBUTE`]), else the FIFO deduplication id, else the
    /// message id.
    ///
    /// ```no_run
    /// # fn doc(orders: idem::consumer::sqs::SqsConsumer<idem::JsonCodec>) {
    /// let orders = orders.keyed_by(|m| m.body().map(|b| b.split(',').next().unwrap_or(b).to_owned()));
    /// # }
    /// ```
    pub fn keyed_by(
        mut self,
        key: impl Fn(&SqsMessage) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// The visibility timeout messages are received with, and the claims' lease (whole
    /// seconds, at least 1; 30 s by default). Both are extended every third of it while the
    /// batch runs.
    pub fn visibility(mut self, visibility: Duration) -> Self {
        self.visibility = Duration::from_secs(visibility.as_secs().max(1));
        self
    }

    /// How long a receive waits for messages (long polling; at most 20 s, the default).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait.min(MAX_WAIT);
        self
    }

    /// How many messages a receive asks for (1 to 10, the default). A batch holds up to the
    /// room the loop has left (the consumer's [`concurrency`](Consumer::concurrency), 16 by
    /// default, less the messages running): after the receive that waited, receives that do
    /// not wait fill it while each comes back full, as SQS gives at most 10 a receive.
    pub fn max_messages(mut self, n: i32) -> Self {
        self.max_messages = n.clamp(1, MAX_BATCH);
        self
    }

    /// Receives and processes batches until `shutdown` resolves; then stops receiving, finishes
    /// the batches in hand (their handlers, deletes and visibility changes) and returns. A failed
    /// receive is logged and tried again after a second. The loop is [`Consumer::run`]'s, over
    /// this queue as a [`Broker`].
    pub async fn run<H>(&self, handler: H, shutdown: impl Future<Output = ()>)
    where
        H: MessageHandler<SqsMessage>,
        H::Error: fmt::Display,
    {
        self.consumer.run(&Queue(self), handler, shutdown).await
    }

    /// [`run`](Self::run) with exactly-once effects: each batch goes through
    /// [`process_steps`](Self::process_steps), whose handler applies each message's effect as
    /// one transactional step ([`Consumer::process_steps`]).
    ///
    /// ```no_run
    /// use idem::consumer::sqs::{aws_sdk_sqs, SqsConsumer};
    /// use idem::consumer::Consumer;
    /// use idem::{Error, Idempotency, SqlSteps, SqliteStore};
    /// use sqlx::Connection;
    /// # async fn doc(client: aws_sdk_sqs::Client) -> Result<(), Error> {
    /// let store = SqliteStore::open("shop.db").await?;
    /// let engine = Idempotency::new(store.clone());
    /// let orders = SqsConsumer::new(client, "https://sqs.eu-west-1.amazonaws.com/1234/orders", Consumer::new(engine, "charge")?);
    /// let store = &store;
    /// let handler = |m: aws_sdk_sqs::types::Message, steps: idem::Steps| async move {
    ///     let order = m.body().unwrap_or_default().to_owned();
    ///     let mut conn = store.pool().acquire().await.map_err(idem::sql_error)?;
    ///     let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(idem::sql_error)?;
    ///     steps.tx(store, &mut tx, "charge", |tx| Box::pin(async move {
    ///         sqlx::query("INSERT INTO charges (order_id) VALUES (?)").bind(order).execute(&mut *tx).await.map_err(idem::sql_error)?;
    ///         Ok::<_, Error>(())
    ///     })).await?;
    ///     tx.commit().await.map_err(idem::sql_error)?;
    ///     Ok::<_, Error>(())
    /// };
    /// orders.run_steps(handler, std::future::pending()).await;
    /// # Ok(()) }
    /// ```
    pub async fn run_steps<T, E, H, F>(&self, handler: H, shutdown: impl Future<Output = ()>)
    where
        H: Fn(SqsMessage, Steps<C>) -> F,
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
    {
        self.consumer
            .run_steps(&Queue(self), handler, shutdown)
            .await
    }

    /// Runs one received batch and settles each message by its outcome; returns the outcomes.
    pub async fn process<H>(
        &self,
        messages: Vec<SqsMessage>,
        handler: &H,
    ) -> Vec<MessageOutcome<H::Value, H::Error>>
    where
        H: MessageHandler<SqsMessage>,
        H::Error: fmt::Display,
    {
        let received = self.received(messages);
        self.consumer
            .process_received(&Queue(self), received, handler)
            .await
    }

    /// [`process`](Self::process) with exactly-once effects ([`Consumer::process_steps`]).
    pub async fn process_steps<T, E, H, F>(
        &self,
        messages: Vec<SqsMessage>,
        handler: &H,
    ) -> Vec<MessageOutcome<T, E>>
    where
        H: Fn(SqsMessage, Steps<C>) -> F,
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
    {
        let received = self.received(messages);
        self.consumer
            .process_received_steps(&Queue(self), received, handler)
            .await
    }

    /// Received messages as batch messages ([`keyed`](Self::keyed)), each with its receipt
    /// handle.
    fn received(&self, messages: Vec<SqsMessage>) -> Vec<(Message<SqsMessage>, String)> {
        messages
            .into_iter()
            .map(|m| {
                let handle = m.receipt_handle().unwrap_or_default().to_owned();
                (self.keyed(m), handle)
            })
            .collect()
    }

    /// One batch of at most `most` messages (the room the consumer's loop has left, at most
    /// its [`Consumer::concurrency`]): a receive that waits for messages (long poll), then,
    /// while the last receive came back full and the batch has room left, receives that do not
    /// wait. SQS gives at most 10 messages a receive, so without them a consumer whose loop has
    /// room for 16 would run 10 and wait for the next receive's long poll to ask for the rest.
    /// A receive that came back short says the queue is (nearly) drained: no request more is
    /// made for it. A receive that fails after the first ends the batch with what it holds:
    /// those messages are already hidden from everyone else.
    async fn receive(&self, most: usize) -> Result<Vec<SqsMessage>, String> {
        let room = self.consumer.concurrency.min(most).max(1);
        let first = (self.max_messages as usize).min(room);
        let mut messages = self.receive_once(first as i32, self.wait).await?;
        let mut full = messages.len() == first;
        // Each round adds at least one message or ends: at most `room` rounds.
        while full && messages.len() < room {
            let ask = (room - messages.len()).min(self.max_messages as usize);
            match self.receive_once(ask as i32, Duration::ZERO).await {
                Ok(more) => {
                    full = more.len() == ask;
                    messages.extend(more);
                }
                Err(e) => {
                    tracing::warn!(
                        queue = %self.queue_url,
                        "receiving more for the batch failed ({e}); running the {} in hand",
                        messages.len()
                    );
                    break;
                }
            }
        }
        Ok(messages)
    }

    /// One receive of up to `max` messages, waiting up to `wait` for the first.
    async fn receive_once(&self, max: i32, wait: Duration) -> Result<Vec<SqsMessage>, String> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(max)
            .wait_time_seconds(wait.as_secs() as i32)
            .visibility_timeout(self.visibility.as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names(ID_ATTRIBUTE)
            .send()
            .await
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
        Ok(out.messages.unwrap_or_default())
    }

    /// Deletes what is done, delays what is in flight elsewhere, leaves the rest (failed, not
    /// processed, poison: the redrive policy dead-letters a message received too often).
    async fn settle(&self, settled: Vec<(String, Disposition)>) {
        let mut delete = Vec::new();
        let mut delay = Vec::new();
        for (handle, disposition) in &settled {
            match disposition {
                Disposition::Acknowledge => delete.push(handle),
                Disposition::Redeliver { after: Some(after) } => {
                    // Whole seconds, rounded up: never back before the estimate.
                    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
                    delay.push((handle, Duration::from_secs(secs.max(1))));
                }
                Disposition::Redeliver { after: None } | Disposition::DeadLetter => {}
            }
        }
        for delete in requests(&delete) {
            let entries = delete.iter().enumerate().filter_map(|(i, handle)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(*handle)
                    .build()
                    .ok()
            });
            let sent = self
                .client
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries.collect()))
                .send()
                .await;
            match sent {
                Ok(out) if out.failed.is_empty() => {}
                Ok(out) => tracing::warn!(
                    queue = %self.queue_url,
                    "{} of {} deletes failed; those messages come back and replay",
                    out.failed.len(),
                    delete.len()
                ),
                Err(e) => tracing::warn!(
                    queue = %self.queue_url,
                    "deleting done messages failed ({}); they come back and replay",
                    aws_sdk_sqs::error::DisplayErrorContext(e)
                ),
            }
        }
        self.change_visibility(delay.into_iter()).await;
    }

    /// Sets the visibility of messages (receipt handle, timeout), in one request.
    async fn change_visibility<'a>(&self, messages: impl Iterator<Item = (&'a String, Duration)>) {
        let messages: Vec<_> = messages.collect();
        for request in requests(&messages) {
            let entries: Vec<_> = request
                .iter()
                .enumerate()
                .filter_map(|(i, (handle, timeout))| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(*handle)
                        .visibility_timeout(timeout.as_secs().min(43_200) as i32)
                        .build()
                        .ok()
                })
                .collect();
            let sent = self
                .client
                .change_message_visibility_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await;
            if let Err(e) = sent {
                tracing::warn!(
                    queue = %self.queue_url,
                    "changing message visibility failed: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(e)
                );
            }
        }
    }
}

/// `entries` in requests of at most [`MAX_BATCH`] (10), the most SQS takes in one batch
/// request: a batch filled up to the consumer's concurrency holds more.
fn requests<T>(entries: &[T]) -> std::slice::Chunks<'_, T> {
    entries.chunks(MAX_BATCH as usize)
}

/// The queue of an [`SqsConsumer`] as a [`Broker`]: receives with the consumer's visibility
/// timeout, extends it, deletes what is done and delays what is in flight elsewhere.
struct Queue<'a, C>(&'a SqsConsumer<C>);

impl<C: Codec> Broker for Queue<'_, C> {
    type Body = SqsMessage;
    /// The receipt handle.
    type Receipt = String;
    type Error = String;

    fn hold(&self) -> Duration {
        self.0.visibility
    }

    fn name(&self) -> &str {
        "SQS"
    }

    async fn receive(&self) -> Result<Received<Self>, String> {
        self.receive_up_to(self.0.consumer.concurrency).await
    }

    async fn receive_up_to(&self, most: usize) -> Result<Received<Self>, String> {
        Ok(self.0.received(self.0.receive(most).await?))
    }

    async fn extend(&self, held: &[String]) {
        let visibility = self.0.visibility;
        self.0
            .change_visibility(held.iter().map(|r| (r, visibility)))
            .await
    }

    async fn settle(&self, settled: Vec<(String, Disposition)>) {
        self.0.settle(settled).await
    }
}

/// The outbox id a [`SqsPublisher`] sent it with, else its FIFO deduplication id, else its
/// message id.
fn default_key(message: &SqsMessage) -> Option<String> {
    message
        .message_attributes()
        .and_then(|a| a.get(ID_ATTRIBUTE))
        .and_then(|v| v.string_value())
        .map(str::to_owned)
        .or_else(|| attribute(message, MessageSystemAttributeName::MessageDeduplicationId))
        .or_else(|| message.message_id().map(str::to_owned))
}

fn attribute(message: &SqsMessage, name: MessageSystemAttributeName) -> Option<String> {
    message.attributes().and_then(|a| a.get(&name)).cloned()
}

impl<C> SqsConsumer<C> {
    /// A received message as a batch message: keyed by the key function, grouped by its FIFO
    /// message group id.
    fn keyed(&self, message: SqsMessage) -> Message<SqsMessage> {
        let group = attribute(&message, MessageSystemAttributeName::MessageGroupId);
        let out = match (self.key)(&message) {
            Some(key) => Message::keyed(message, key),
            None => Message::unkeyed(message),
        };
        match group {
            Some(group) => out.group(group),
            None => out,
        }
    }
}

/// The message attribute every [`SqsPublisher`] message carries with its outbox
/// [`MessageId`](idem_core::MessageId); an [`SqsConsumer`] keys by it by default.
pub const ID_ATTRIBUTE: &str = "idem-id";

/// Publishes outbox messages to SQS (the [`Dispatcher`](idem_core::Dispatcher)'s
/// [`Publisher`](idem_core::Publisher)): one `SendMessage` per message, to the queue its route
/// names (one queue by default). The body is the payload, which must be UTF-8 (SQS bodies are
/// text; a payload that is not is an error, and the message stays unsent). Every message carries
/// its id in the attribute [`ID_ATTRIBUTE`] and its type in `idem-type`; to a FIFO queue (a URL
/// ending in `.fifo`) it is sent with the id as `MessageDeduplicationId` (so SQS drops a second
/// copy within its 5-minute window) and its aggregate as `MessageGroupId` (so its aggregate's
/// messages are delivered in order; cut to SQS's 128 characters).
///
/// ```no_run
/// use std::sync::Arc;
/// use idem::consumer::sqs::{aws_sdk_sqs, SqsPublisher};
/// use idem::{Dispatcher, DispatcherConfig, SqliteOutbox, SqliteStore};
/// # async fn doc(client: aws_sdk_sqs::Client) -> Result<(), idem::Error> {
/// let store = SqliteStore::open("idem.db").await?;
/// let outbox = SqliteOutbox::new(store.pool().clone(), "outbox").await?;
/// let publisher = SqsPublisher::new(client, "https://sqs.eu-west-1.amazonaws.com/1234/orders.fifo");
/// let dispatcher = Dispatcher::new(Arc::new(store), Arc::new(outbox), Arc::new(publisher), DispatcherConfig::new())?;
/// let handle = dispatcher.spawn();
/// # handle.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqsPublisher {
    client: Client,
    route: Arc<dyn Fn(&idem_core::OutboxMessage) -> String + Send + Sync>,
}

impl fmt::Debug for SqsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsPublisher").finish_non_exhaustive()
    }
}

impl SqsPublisher {
    /// Publishes every message to the queue at `queue_url`.
    pub fn new(client: Client, queue_url: impl Into<String>) -> SqsPublisher {
        let url: String = queue_url.into();
        SqsPublisher {
            client,
            route: Arc::new(move |_| url.clone()),
        }
    }

    /// Publishes each message to the queue whose URL `route` gives it (by its aggregate type,
    /// for instance).
    ///
    /// ```no_run
    /// # fn doc(client: idem::consumer::sqs::aws_sdk_sqs::Client) {
    /// use idem::consumer::sqs::SqsPublisher;
    /// let publisher = SqsPublisher::routed(client, |m| {
    ///     format!("https://sqs.eu-west-1.amazonaws.com/1234/{}.fifo", m.aggregate_type)
    /// });
    /// # }
    /// ```
    pub fn routed(
        client: Client,
        route: impl Fn(&idem_core::OutboxMessage) -> String + Send + Sync + 'static,
    ) -> SqsPublisher {
        SqsPublisher {
            client,
            route: Arc::new(route),
        }
    }
}

/// A string message attribute.
fn string_attribute(
    value: impl Into<String>,
) -> Result<aws_sdk_sqs::types::MessageAttributeValue, idem_core::BoxError> {
    Ok(aws_sdk_sqs::types::MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()?)
}

#[async_trait::async_trait]
impl idem_core::Publisher for SqsPublisher {
    async fn publish(&self, m: &idem_core::OutboxMessage) -> Result<(), idem_core::BoxError> {
        let body = std::str::from_utf8(&m.payload).map_err(|_| {
            format!(
                "outbox message {} has a payload that is not UTF-8, and an SQS body is text: \
                 encode it (JSON, base64) before adding it",
                m.id
            )
        })?;
        let url = (self.route)(m);
        let mut send = self
            .client
            .send_message()
            .queue_url(&url)
            .message_body(body)
            .message_attributes(ID_ATTRIBUTE, string_attribute(m.id.to_string())?)
            .message_attributes("idem-type", string_attribute(&m.kind)?);
        if url.ends_with(".fifo") {
            let mut group = format!("{}:{}", m.aggregate_type, m.aggregate_id);
            let mut end = group.len().min(128);
            while !group.is_char_boundary(end) {
                end -= 1;
            }
            group.truncate(end);
            send = send
                .message_group_id(group)
                .message_deduplication_id(m.id.to_string());
        }
        send.send()
            .await
            .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch filled up to a concurrency above 10 is settled and extended in requests SQS
    /// takes: 10 entries at most each, every entry in one of them, in order.
    #[test]
    fn a_settling_request_carries_at_most_ten_entries() {
        let handles: Vec<u32> = (0..23).collect();
        let sizes: Vec<usize> = requests(&handles).map(<[u32]>::len).collect();
        assert_eq!(sizes, [10, 10, 3]);
        let again: Vec<u32> = requests(&handles).flatten().copied().collect();
        assert_eq!(again, handles);
        assert_eq!(requests::<u32>(&[]).count(), 0);
    }
}
