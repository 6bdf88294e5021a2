//! AWS Lambda event batches through a [`Consumer`] (feature `lambda`): SQS (standard and FIFO),
//! Kinesis and DynamoDB Streams, each answered with its own partial-failure response, so Lambda
//! redelivers exactly the records that were not done.
//!
//! | event | key of a record | order | answer |
//! |---|---|---|---|
//! | [`SqsEvent`] | its message id (or your own, [`Lambda::sqs_by`]) | FIFO queues (records carrying a `MessageGroupId`): in order per group, a group stops at its first record not acknowledged | [`SqsBatchResponse`]: every record not acknowledged |
//! | [`KinesisEvent`] | its event id (shard and sequence number) | in order; the batch stops at its first record not acknowledged | [`KinesisEventResponse`]: that record's sequence number |
//! | DynamoDB [`Event`](dynamodb::Event) | its event id | as Kinesis | [`DynamoDbEventResponse`]: that record's sequence number |
//!
//! Turn on `ReportBatchItemFailures` in the event source mapping: without it Lambda retries the
//! whole batch on any failure (which stays safe: the records done replay).
//!
//! **The deadline.** Each invocation's claims get a lease of the time left before
//! [`Context::deadline`] less a [`margin`](Lambda::margin) (1 s by default), and the batch stops
//! at that point and answers: records whose handler has not finished are reported as failures,
//! so Lambda redelivers them instead of retrying the whole timed-out batch. A handler still
//! running then goes on while the environment lives and stores its result; its claim, no longer
//! renewed once Lambda freezes the environment, ends one lease later at most, so a claim never
//! holds a record much past the invocation that took it. Keep the queue's visibility timeout
//! above the function's timeout (AWS asks for six times), so a record never reappears while its
//! claim lives.

use std::fmt;
use std::time::{Duration, SystemTime};

use aws_lambda_events::event::dynamodb;
use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use aws_lambda_events::event::streams::{
    DynamoDbBatchItemFailure, DynamoDbEventResponse, KinesisBatchItemFailure, KinesisEventResponse,
};
use lambda_runtime::{Context, LambdaEvent};

use crate::{Consumer, Disposition, Message, MessageHandler, MessageOutcome};
use idem_core::Codec;

/// The aws_lambda_events (1.x) whose events these functions take (features `sqs`, `kinesis`,
/// `dynamodb`, `streams`). Use this path to name the very version idem uses.
pub use aws_lambda_events;
/// The lambda_runtime (1.x) whose [`LambdaEvent`] these functions take.
pub use lambda_runtime;

/// The time kept back from the invocation's deadline by default: enough to answer Lambda.
pub const DEFAULT_MARGIN: Duration = Duration::from_secs(1);

/// A [`Consumer`] for Lambda invocations: turns an event into messages, runs them with the
/// invocation's deadline, and answers with the event's partial-failure response.
///
/// ```no_run
/// use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
/// use idem::consumer::{lambda::Lambda, Consumer};
/// use idem::{Idempotency, SqliteStore};
/// use lambda_runtime::{service_fn, LambdaEvent};
///
/// async fn charge(message: SqsMessage) -> Result<String, std::io::Error> {
///     Ok(format!("charged {}", message.body.unwrap_or_default()))
/// }
///
/// # async fn main_() -> Result<(), lambda_runtime::Error> {
/// let store = SqliteStore::open("/tmp/idem.db").await?;
/// let lambda = Lambda::new(Consumer::new(Idempotency::new(store), "charge")?);
/// lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
///     let lambda = lambda.clone();
///     async move { Ok::<SqsBatchResponse, lambda_runtime::Error>(lambda.sqs(event, charge).await) }
/// }))
/// .await
/// # }
/// ```
#[derive(Debug)]
pub struct Lambda<C> {
    consumer: Consumer<C>,
    margin: Duration,
}

impl<C> Clone for Lambda<C> {
    fn clone(&self) -> Self {
        Lambda {
            consumer: self.consumer.clone(),
            margin: self.margin,
        }
    }
}

/// The message id of an SQS record: the key [`Lambda::sqs`] deduplicates by. A redelivery keeps
/// it; a message the producer sent twice has two (key those by a business id with
/// [`Lambda::sqs_by`]).
///
/// ```
/// let mut m = aws_lambda_events::event::sqs::SqsMessage::default();
/// m.message_id = Some("m-1".into());
/// assert_eq!(idem::consumer::lambda::message_id(&m).as_deref(), Some("m-1"));
/// ```
pub fn message_id(message: &SqsMessage) -> Option<String> {
    message.message_id.clone()
}

impl<C: Codec> Lambda<C> {
    /// Lambda invocations through `consumer` (its concurrency and scope; its lease and deadline
    /// are set per invocation).
    pub fn new(consumer: Consumer<C>) -> Lambda<C> {
        Lambda {
            consumer,
            margin: DEFAULT_MARGIN,
        }
    }

    /// How long before the invocation's deadline the batch stops and answers (1 s by default).
    pub fn margin(mut self, margin: Duration) -> Lambda<C> {
        self.margin = margin;
        self
    }

    /// The consumer for one invocation: claims leased until its deadline less the margin, and the
    /// batch stopping there.
    fn invocation(&self, context: &Context) -> Consumer<C> {
        let left = context
            .deadline()
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
            .saturating_sub(self.margin);
        let consumer = self
            .consumer
            .clone()
            .deadline(tokio::time::Instant::now() + left);
        // No time left: nothing starts, so no lease is needed (and zero is not a lease).
        if left >= Duration::from_millis(1) {
            consumer.lease(left)
        } else {
            consumer
        }
    }

    /// An SQS event, each record keyed by its message id: the response lists every record not
    /// acknowledged (failed, in flight elsewhere, not processed, poison). A FIFO queue's records
    /// (with a `MessageGroupId`) run in order per group, and a group stops at its first record
    /// not acknowledged. A poison record is reported too, so the queue's redrive policy moves it
    /// to the dead-letter queue after `maxReceiveCount` deliveries.
    pub async fn sqs<H>(&self, event: LambdaEvent<SqsEvent>, handler: H) -> SqsBatchResponse
    where
        H: MessageHandler<SqsMessage>,
        H::Error: fmt::Display,
    {
        self.sqs_by(event, message_id, handler).await
    }

    /// [`sqs`](Self::sqs) with each record keyed by `key` (a business id from the body, the
    /// FIFO `MessageDeduplicationId`; `None`: no deduplication).
    pub async fn sqs_by<K, H>(
        &self,
        event: LambdaEvent<SqsEvent>,
        key: K,
        handler: H,
    ) -> SqsBatchResponse
    where
        K: Fn(&SqsMessage) -> Option<String>,
        H: MessageHandler<SqsMessage>,
        H::Error: fmt::Display,
    {
        let (event, context) = event.into_parts();
        let fifo = event
            .records
            .iter()
            .any(|r| r.attributes.contains_key("MessageGroupId"));
        let ids: Vec<String> = event
            .records
            .iter()
            .map(|r| r.message_id.clone().unwrap_or_default())
            .collect();
        let messages = event
            .records
            .into_iter()
            .map(|record| {
                let message = match key(&record) {
                    Some(k) => Message::keyed(record, k),
                    None => Message::unkeyed(record),
                };
                match message.body().attributes.get("MessageGroupId").cloned() {
                    Some(group) => message.group(group),
                    None => message,
                }
            })
            .collect();
        let outcomes = self
            .invocation(&context)
            .ordered(fifo)
            .process(messages, handler)
            .await;
        let mut response = SqsBatchResponse::default();
        for (id, outcome) in ids.into_iter().zip(&outcomes) {
            if !outcome.disposition().acknowledges() {
                log("SQS message", &id, outcome);
                let mut failure = BatchItemFailure::default();
                failure.item_identifier = id;
                response.batch_item_failures.push(failure);
            }
        }
        response
    }

    /// A Kinesis event, each record keyed by its event id: the records run in order and stop
    /// at the first one not acknowledged, whose sequence number the response reports (Lambda
    /// retries from it; the records before it are done).
    pub async fn kinesis<H>(
        &self,
        event: LambdaEvent<KinesisEvent>,
        handler: H,
    ) -> KinesisEventResponse
    where
        H: MessageHandler<KinesisEventRecord>,
        H::Error: fmt::Display,
    {
        let (event, context) = event.into_parts();
        let records = event.records.into_iter().map(|r| {
            let seq = r.kinesis.sequence_number.clone();
            let key = r.event_id.clone().unwrap_or_else(|| seq.clone());
            (r, key, seq)
        });
        let first = self.stream(&context, records, handler).await;
        let mut response = KinesisEventResponse::default();
        if let Some(seq) = first {
            let mut failure = KinesisBatchItemFailure::default();
            failure.item_identifier = Some(seq);
            response.batch_item_failures.push(failure);
        }
        response
    }

    /// A DynamoDB Streams event, each record keyed by its event id; ordered and answered as
    /// [`kinesis`](Self::kinesis).
    pub async fn dynamodb<H>(
        &self,
        event: LambdaEvent<dynamodb::Event>,
        handler: H,
    ) -> DynamoDbEventResponse
    where
        H: MessageHandler<dynamodb::EventRecord>,
        H::Error: fmt::Display,
    {
        let (event, context) = event.into_parts();
        let records = event.records.into_iter().map(|r| {
            let seq = r.change.sequence_number.clone().unwrap_or_default();
            let key = r.event_id.clone();
            (r, key, seq)
        });
        let first = self.stream(&context, records, handler).await;
        let mut response = DynamoDbEventResponse::default();
        if let Some(seq) = first {
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = Some(seq);
            response.batch_item_failures.push(failure);
        }
        response
    }

    /// A stream's records (record, key, sequence number) in order, stopping at the first not
    /// acknowledged: its sequence number.
    async fn stream<R, H>(
        &self,
        context: &Context,
        records: impl Iterator<Item = (R, String, String)>,
        handler: H,
    ) -> Option<String>
    where
        H: MessageHandler<R>,
        H::Error: fmt::Display,
    {
        let mut sequence = Vec::new();
        let messages = records
            .map(|(record, key, seq)| {
                sequence.push(seq);
                // One group: a shard's records are delivered in order, and Lambda retries from
                // the first one reported.
                Message::keyed(record, key).group("shard")
            })
            .collect();
        let outcomes = self
            .invocation(context)
            .ordered(true)
            .process(messages, handler)
            .await;
        let first = outcomes
            .iter()
            .position(|o| !o.disposition().acknowledges())?;
        let seq = sequence.swap_remove(first);
        log("stream record", &seq, &outcomes[first]);
        Some(seq)
    }
}

/// Says why a record goes back (a poison one as an error: it needs a person).
fn log<T, E: fmt::Display>(what: &str, id: &str, outcome: &MessageOutcome<T, E>) {
    match outcome {
        MessageOutcome::Failed(failure) => {
            tracing::warn!(id, "{what} handed back: {failure}")
        }
        MessageOutcome::Poison(e) => {
            tracing::error!(id, "{what} is poison (dead-letter it): {e}")
        }
        MessageOutcome::Uncertain(e) => {
            tracing::error!(id, "{what} is uncertain (dead-letter it, resolve it): {e}")
        }
        other if other.disposition() == Disposition::DeadLetter => {}
        other => tracing::debug!(id, outcome = other.as_str(), "{what} handed back"),
    }
}
