//! The transactional outbox on DynamoDB (docs/outbox.md): [`DynamoOutbox`], a table of its own
//! whose items a caller adds to its own `TransactWriteItems` (one item per message), read,
//! marked and pruned by the [`Dispatcher`](idem_core::Dispatcher) through [`OutboxSource`].

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    LocalSecondaryIndex, Projection, ProjectionType, ReturnValuesOnConditionCheckFailure,
    ScalarAttributeType, TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;
use tokio::task::JoinSet;

use idem_core::{
    Error, MessageId, OutboxMessage, OutboxSource, PendingMessage, StoreError, StoreErrorKind,
};

use crate::errors::table_error;
use crate::item::{duration_millis, millis, number, time_of};
use crate::steps::build_error;
use crate::table;

/// The hash key: the message's shard, `0` to `shards - 1` in decimal (`layout` for the layout
/// item).
const PK: &str = "pk";
/// The range key: the message's id, a hyphenated UUID.
const ID: &str = "id";
/// Debezium's outbox columns.
const AGGREGATE_TYPE: &str = "aggregatetype";
const AGGREGATE_ID: &str = "aggregateid";
const KIND: &str = "type";
const PAYLOAD: &str = "payload";
/// The message's place in the outbox's order (see [`next_seq`]).
const SEQ: &str = "seq";
/// When it was added, epoch milliseconds on the writer's clock.
const CREATED: &str = "created_ms";
/// When it was marked sent, epoch milliseconds on the dispatcher's clock.
const SENT: &str = "sent_ms";
/// Which `mark_sent` call marked it: a number of its own per call (from [`next_seq`]), so a
/// request that the SDK sent again after its first attempt took effect still counts.
const MARK_N: &str = "mark_n";
/// The sort key of the index [`QUEUE_INDEX`]: the message's `seq` while it is unsent, and
/// `sent_ms - SENT_OFFSET` (below zero) once it is sent. One range of the index is the unsent
/// messages in order, the other the sent ones by age.
const QUEUE: &str = "queue_n";
/// The local secondary index on (`pk`, `queue_n`).
const QUEUE_INDEX: &str = "queue";
/// The layout item's key (`pk` and `id` alike) and its attribute: the table's shard count.
const LAYOUT: &str = "layout";
const SHARDS: &str = "shards_n";

/// What a sent message's `queue_n` is below its `sent_ms`: 10^15 ms, past the year 30,000, so
/// every sent message's `queue_n` is below zero and every unsent one's (its `seq`) above.
const SENT_OFFSET: i64 = 1_000_000_000_000_000;

/// Requests one `mark_sent` or `prune_sent` keeps in flight at once.
const IN_FLIGHT: usize = 32;

/// The most shards a [`DynamoOutbox`] table has.
///
/// ```
/// assert_eq!(idem::MAX_DYNAMO_OUTBOX_SHARDS, 64);
/// ```
pub const MAX_DYNAMO_OUTBOX_SHARDS: u32 = 64;

/// How the outbox's table is created: what a missing table's error tells to do.
const CREATE_OUTBOX_TABLE: &str =
    "DynamoOutbox::create_table or the builder's create_table_if_missing(true)";

/// `put`: every attribute is set only where the item does not have it yet, so a second `put`
/// of one message (a retried operation) leaves the item as it is, pending or sent.
const PUT: &str = "SET #at = if_not_exists(#at, :at), #ai = if_not_exists(#ai, :ai), \
                   #ty = if_not_exists(#ty, :ty), #pl = if_not_exists(#pl, :pl), \
                   #seq = if_not_exists(#seq, :seq), #cr = if_not_exists(#cr, :cr), \
                   #q = if_not_exists(#q, :seq)";
/// `mark_sent`: the message leaves the unsent range of the index, under the condition that it
/// is in it (an unknown id creates nothing, a sent one keeps its first `sent_ms`).
const MARK: &str = "SET #q = :sent, #sent = :now, #mark = :mark";
const UNSENT: &str = "#q >= :zero";
const PENDING_RANGE: &str = "#pk = :shard AND #q >= :zero";
/// `prune_sent`: the sent messages whose `sent_ms` is at or before the cutoff.
const SENT_BEFORE: &str = "#q <= :before";
const PRUNE_RANGE: &str = "#pk = :shard AND #q <= :before";

/// The transactional outbox in a DynamoDB table of its own (feature `dynamodb`): a caller adds
/// a message to its own `TransactWriteItems` as one item, [`put`](Self::put)'s, beside its
/// business write (and, through
/// [`Steps::dynamo_tx`](crate::DynamoSteps::dynamo_tx), beside the step's record), so the
/// message commits with the write or not at all; a [`Dispatcher`](idem_core::Dispatcher)
/// publishes it through this type's [`OutboxSource`].
///
/// Cloning is cheap: clones share the client.
///
/// ```no_run
/// use idem::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
/// use idem::{DynamoOutbox, Key, MessageId, OutboxMessage};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::BoxError> {
/// # let client: idem::aws_sdk_dynamodb::Client = unimplemented!();
/// let outbox = DynamoOutbox::builder()
///     .table("orders_outbox")
///     .create_table_if_missing(true)
///     .build(client.clone())
///     .await?;
///
/// let key = Key::derive("orders", "shop-1", "req-9")?;
/// let placed = OutboxMessage::new(
///     MessageId::derive(&key, "placed"),
///     "order",
///     "o-17",
///     "OrderPlaced",
///     br#"{"total":4200}"#.to_vec(),
/// )?;
/// let order = Put::builder()
///     .table_name("orders")
///     .item("pk", AttributeValue::S("o-17".into()))
///     .condition_expression("attribute_not_exists(pk)")
///     .build()?;
/// client
///     .transact_write_items()
///     .transact_items(TransactWriteItem::builder().put(order).build())
///     .transact_items(outbox.put(&placed)?)
///     .send()
///     .await?;
/// # Ok(()) }
/// ```
///
/// # A retry adds no second copy
///
/// A message's id is derived from the operation's key and the message's name
/// ([`MessageId::derive`]), and the item's key is that id, so a retried operation writes the
/// same item. [`put`](Self::put)'s item is an `Update` **without a condition** whose every
/// attribute is `if_not_exists(…)`: on a new id it writes the message, unsent; on an id the
/// outbox holds it changes nothing — a pending message keeps its place in the order, and a
/// message already sent stays sent (it is not published again). A condition such as
/// `attribute_not_exists(id)` would do the same for the message but cancel the caller's whole
/// transaction, business write included, on every retry that reaches its write again (an
/// operation taken over after a crash re-runs its work with the same message ids); an
/// unconditional `Put` would not cancel it but would make a sent message pending again. When
/// two different messages carry one id, the first one written stays (as SQL's `ON CONFLICT
/// DO NOTHING`). A message whose sent copy was [pruned](OutboxSource::prune_sent) is a new
/// message to the outbox: keep the dispatcher's
/// [`sent_retention`](idem_core::DispatcherConfig::sent_retention) longer than an operation may
/// be retried.
///
/// One transaction may not write one item twice (DynamoDB refuses it): put each message of an
/// operation once, under its own name.
///
/// # Order
///
/// DynamoDB has no sequence. Each [`put`](Self::put) gives its item a `seq`: the writer's
/// clock in microseconds since the epoch × 1000, raised above the last `seq` this process gave
/// (so it grows even if the clock steps back or a microsecond holds many messages).
/// [`pending`](OutboxSource::pending) returns messages in `seq` order. So:
///
/// - **Per aggregate, messages are published in the order they were put** when the writes of an
///   aggregate are serialized (the business item's condition makes each operation see the
///   previous one's write) and each operation calls `put` after the read its condition checks:
///   on one node always; across nodes, as long as their clocks differ by less than the time
///   between two operations of one aggregate (with NTP or Amazon Time Sync, milliseconds).
/// - Across aggregates, the order is the writers' clocks', and nothing depends on it.
/// - `seq` is taken when `put` is called, not when the transaction commits: a transaction that
///   commits late (a retry of the SDK) keeps its earlier `seq`, and the dispatcher may have
///   published later messages of other aggregates before it.
///
/// # Table
///
/// | attribute | type | holds |
/// |---|---|---|
/// | `pk` | S (hash key) | the message's shard, `0` to `shards - 1`, from its id |
/// | `id` | S (range key) | the message's id, a hyphenated UUID |
/// | `aggregatetype`, `aggregateid`, `type` | S | Debezium's outbox columns |
/// | `payload` | B | the body |
/// | `seq` | N | its place in the order (above) |
/// | `created_ms` | N | when it was put, epoch milliseconds on the writer's clock |
/// | `queue_n` | N | the sort key of the local secondary index `queue`: `seq` while unsent; `sent_ms` − 10<sup>15</sup> (below zero) once sent |
/// | `sent_ms` | N | when it was marked sent |
/// | `mark_n` | N | which `mark_sent` call marked it (a number per call), so that a request the SDK sent again after its first attempt took effect still counts |
///
/// The local secondary index `queue` (hash key `pk`, range key `queue_n`, all attributes
/// projected) holds every message: its range `queue_n >= 0` is each shard's unsent messages in
/// order, its range below zero the sent ones by age. A local index is read with **strong
/// consistency**: a committed message is there at once, and a message marked sent is gone from
/// the unsent range at once, so the dispatcher neither publishes messages out of order because
/// the index lagged nor publishes a page again because the marks had not reached it (a global
/// secondary index, eventually consistent, does both). One more item, `pk = id = "layout"`,
/// holds the table's shard count (`shards_n`), which every outbox on the table reads when it is
/// built.
///
/// Create the table with [`DynamoOutbox::create_table`] or the builder's
/// [`create_table_if_missing`](DynamoOutboxBuilder::create_table_if_missing) (a local index can
/// only be made with its table), or with your infrastructure tool in the layout above. The role
/// needs `dynamodb:UpdateItem` (the callers' transactions and marking), `Query`, `DeleteItem`,
/// `GetItem`, `PutItem` (the layout item, once) and `DescribeTable` on the table and its index.
///
/// # Shards and sizes
///
/// A table with a local secondary index keeps each hash key's items (an item collection) in
/// one partition, which serves at most 1,000 write units and 3,000 read units a second and
/// holds at most **10 GB**, the index's copies included. A message of up to 1 KB costs about 2
/// write units to add (4 in a transaction), 3 to mark sent (the index's entry moves) and 2 to
/// delete, so one shard carries about a hundred messages a second. Messages are spread over
/// [`shards`](DynamoOutboxBuilder::shards) item collections by their id; pick the count when the
/// table is first used (it is kept in the table and never changes, since a message's shard
/// follows from its id): `shards × 100` messages a second, and `shards × 10 GB` for the sent
/// messages of one [`sent_retention`](idem_core::DispatcherConfig::sent_retention) (each counted
/// twice while unsent). A full item collection cancels the callers' transactions (the reason
/// `ItemCollectionSizeLimitExceeded`; a [`dynamo_tx`](crate::DynamoSteps::dynamo_tx) step's
/// error is then [`StoreErrorKind::Full`](idem_core::StoreErrorKind::Full)). Each shard
/// costs one `Query` per [`pending`](OutboxSource::pending) and per
/// [`prune_sent`](OutboxSource::prune_sent): an idle dispatcher reads `2 × shards` times per
/// [`interval`](idem_core::DispatcherConfig::interval).
///
/// # Sent messages
///
/// [`prune_sent(age, limit)`](OutboxSource::prune_sent) deletes what was sent `age` ago or
/// earlier, as the dispatcher asks after each run: a `Query` of the index's sent range per shard
/// and a conditional `DeleteItem` per message. DynamoDB's TTL is not used: the retention is the
/// dispatcher's setting, which marking does not know, and TTL deletes days late, while the sent
/// messages weigh on the shards' 10 GB.
///
/// # Round trips
///
/// | call | requests |
/// |---|---|
/// | [`put`](Self::put) | none: it builds the one `Update` the caller sends in its own `TransactWriteItems` (or returns from a [`dynamo_tx`](crate::DynamoSteps::dynamo_tx) step) |
/// | [`pending(limit)`](OutboxSource::pending) | one strongly consistent `Query` of the index per shard, side by side (each reads at most `limit` messages and 1 MB) |
/// | [`mark_sent(ids)`](OutboxSource::mark_sent) | one `UpdateItem` per id, conditioned on the message being unsent, up to 32 at a time |
/// | [`prune_sent(age, limit)`](OutboxSource::prune_sent) | one `Query` of the index per shard, then one conditional `DeleteItem` per message deleted, up to 32 at a time |
/// | [`build`](DynamoOutboxBuilder::build) | `DescribeTable` and a consistent `GetItem` of the layout item (and a `PutItem` of it on the table's first use) |
///
/// # Errors
///
/// As [`DynamoStore`](crate::DynamoStore#errors)'s: [`Error::Store`] with the kind of the
/// failure, a missing table named, and an item that is not in the outbox's layout
/// [`Corrupt`](idem_core::StoreErrorKind::Corrupt).
#[derive(Clone)]
pub struct DynamoOutbox {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    table: String,
    shards: u32,
}

impl fmt::Debug for DynamoOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoOutbox")
            .field("table", &self.inner.table)
            .field("shards", &self.inner.shards)
            .finish_non_exhaustive()
    }
}

impl DynamoOutbox {
    /// The table name used unless [`DynamoOutboxBuilder::table`] says otherwise.
    pub const DEFAULT_TABLE: &'static str = "idem_outbox";

    /// The shard count a table gets on its first use unless [`DynamoOutboxBuilder::shards`]
    /// says otherwise.
    pub const DEFAULT_SHARDS: u32 = 1;

    /// Options: table name, shard count, table creation.
    ///
    /// ```
    /// let builder = idem::DynamoOutbox::builder().table("orders_outbox").shards(4);
    /// # let _ = builder;
    /// ```
    pub fn builder() -> DynamoOutboxBuilder {
        DynamoOutboxBuilder::default()
    }

    /// Creates the table `table` unless it exists: on-demand billing, the string hash key `pk`,
    /// the string range key `id` and the local secondary index `queue` on (`pk`, number
    /// `queue_n`), all attributes projected. Waits up to two minutes for the table to become
    /// `ACTIVE`. Safe to call from several nodes at once. Fails with [`Error::InvalidConfig`]
    /// for a name DynamoDB would refuse, or for an existing table in another layout. The shard
    /// count is set by the first [`build`](DynamoOutboxBuilder::build).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: idem::aws_sdk_dynamodb::Client = unimplemented!();
    /// idem::DynamoOutbox::create_table(&client, "idem_outbox").await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_table(client: &Client, table: &str) -> Result<(), Error> {
        create(client, table).await
    }

    /// The table's name.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: idem::aws_sdk_dynamodb::Client = unimplemented!();
    /// let outbox = idem::DynamoOutbox::builder().build(client).await?;
    /// assert_eq!(outbox.table(), "idem_outbox");
    /// # Ok(()) }
    /// ```
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The table's shard count, as its first use set it.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: idem::aws_sdk_dynamodb::Client = unimplemented!();
    /// let outbox = idem::DynamoOutbox::builder().build(client).await?;
    /// assert!((1..=idem::MAX_DYNAMO_OUTBOX_SHARDS).contains(&outbox.shards()));
    /// # Ok(()) }
    /// ```
    pub fn shards(&self) -> u32 {
        self.inner.shards
    }

    /// The client the outbox sends its requests with.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: idem::aws_sdk_dynamodb::Client = unimplemented!();
    /// let outbox = idem::DynamoOutbox::builder().build(client).await?;
    /// let same_client = outbox.client().clone();
    /// # let _ = same_client; Ok(()) }
    /// ```
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The one item that adds `message` to the outbox, for the caller's own
    /// `TransactWriteItems` (or a [`dynamo_tx`](crate::DynamoSteps::dynamo_tx) step's writes):
    /// it commits with them or not at all. An `Update` without a condition that writes each
    /// attribute only where the item lacks it, so a retried operation's `put` of the same
    /// message changes nothing and never cancels the transaction (see
    /// [A retry adds no second copy](DynamoOutbox#a-retry-adds-no-second-copy)). Sends nothing.
    ///
    /// A message that fails [`OutboxMessage::check`] is [`Error::InvalidConfig`].
    ///
    /// ```no_run
    /// use idem::aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
    /// use idem::{DynamoOutbox, DynamoSteps, DynamoStore, Error, Idempotency, Key, MessageId, OutboxMessage};
    /// # async fn doc(store: DynamoStore, outbox: DynamoOutbox) -> Result<(), Error> {
    /// let engine = Idempotency::new(store.clone());
    /// let key = Key::derive("orders", "", "order-1")?;
    /// let placed = OutboxMessage::new(MessageId::derive(&key, "placed"), "order", "order-1", "OrderPlaced", b"{}".to_vec())?;
    /// let (store, outbox) = (&store, &outbox);
    /// engine.call(key).run_steps(|steps| async move {
    ///     // The order, its message and the step's record: one transaction.
    ///     steps.dynamo_tx(store, "place", || async {
    ///         let order = Update::builder()
    ///             .table_name("orders")
    ///             .key("pk", AttributeValue::S("order-1".into()))
    ///             .update_expression("SET placed = :yes")
    ///             .expression_attribute_values(":yes", AttributeValue::Bool(true))
    ///             .build()
    ///             .map_err(|e| Error::InvalidConfig(e.to_string()))?;
    ///         let writes = vec![TransactWriteItem::builder().update(order).build(), outbox.put(&placed)?];
    ///         Ok::<_, Error>(((), writes))
    ///     }).await
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn put(&self, message: &OutboxMessage) -> Result<TransactWriteItem, Error> {
        message.check()?;
        let now = SystemTime::now();
        let seq = next_seq(now);
        let update = Update::builder()
            .table_name(&self.inner.table)
            .key(PK, shard_of(&message.id, self.inner.shards))
            .key(ID, AttributeValue::S(message.id.to_string()))
            .update_expression(PUT)
            .expression_attribute_names("#at", AGGREGATE_TYPE)
            .expression_attribute_names("#ai", AGGREGATE_ID)
            .expression_attribute_names("#ty", KIND)
            .expression_attribute_names("#pl", PAYLOAD)
            .expression_attribute_names("#seq", SEQ)
            .expression_attribute_names("#cr", CREATED)
            .expression_attribute_names("#q", QUEUE)
            .expression_attribute_values(":at", AttributeValue::S(message.aggregate_type.clone()))
            .expression_attribute_values(":ai", AttributeValue::S(message.aggregate_id.clone()))
            .expression_attribute_values(":ty", AttributeValue::S(message.kind.clone()))
            .expression_attribute_values(
                ":pl",
                AttributeValue::B(Blob::new(message.payload.clone())),
            )
            .expression_attribute_values(":seq", AttributeValue::N(seq.to_string()))
            .expression_attribute_values(":cr", number(millis(now)))
            .build()
            .map_err(build_error)?;
        Ok(TransactWriteItem::builder().update(update).build())
    }
}

/// The last `seq` this process gave: every outbox of the process counts on from it.
static LAST_SEQ: AtomicU64 = AtomicU64::new(0);

/// The next `seq`: `now` in microseconds since the epoch × 1000, or one more than the last one
/// this process gave if that is not less (a clock stepped back, or a thousand messages in a
/// microsecond). Below 2^63 until the year 2262, so DynamoDB and the `queue_n` range keep it.
fn next_seq(now: SystemTime) -> u64 {
    let micros = now
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let from_clock = micros.saturating_mul(1000);
    let next = |last: u64| from_clock.max(last.saturating_add(1));
    match LAST_SEQ.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| Some(next(last))) {
        Ok(last) | Err(last) => next(last),
    }
}

/// The shard of message `id`: its first four bytes (a UUID's, from a hash) modulo `shards`.
fn shard_of(id: &MessageId, shards: u32) -> AttributeValue {
    let b = id.as_uuid().into_bytes();
    let n = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) % shards.max(1);
    AttributeValue::S(n.to_string())
}

/// `queue_n` of a message sent at `sent_ms`: below zero, ordered by `sent_ms`.
fn sent_queue(sent_ms: i64) -> i64 {
    sent_ms.clamp(0, SENT_OFFSET - 1) - SENT_OFFSET
}

/// Options for a [`DynamoOutbox`]; finish with [`build`](Self::build).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// # let client: idem::aws_sdk_dynamodb::Client = unimplemented!();
/// let outbox = idem::DynamoOutbox::builder()
///     .table("orders_outbox")
///     .shards(4)
///     .build(client)
///     .await?;
/// # let _ = outbox; Ok(()) }
/// ```
pub struct DynamoOutboxBuilder {
    table: String,
    shards: Option<u32>,
    create_table: bool,
}

impl Default for DynamoOutboxBuilder {
    fn default() -> Self {
        DynamoOutboxBuilder {
            table: DynamoOutbox::DEFAULT_TABLE.to_owned(),
            shards: None,
            create_table: false,
        }
    }
}

impl fmt::Debug for DynamoOutboxBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoOutboxBuilder")
            .field("table", &self.table)
            .field("shards", &self.shards)
            .field("create_table_if_missing", &self.create_table)
            .finish()
    }
}

impl DynamoOutboxBuilder {
    /// The table's name ([`DynamoOutbox::DEFAULT_TABLE`], `idem_outbox`, by default): 3 to 255
    /// characters of `a-z A-Z 0-9 _ - .`, checked by [`build`](Self::build).
    ///
    /// ```
    /// let builder = idem::DynamoOutbox::builder().table("payments_outbox");
    /// # let _ = builder;
    /// ```
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// The table's shard count (1 to [`MAX_DYNAMO_OUTBOX_SHARDS`]): the first
    /// [`build`](Self::build) on a table keeps it in the table
    /// ([`DynamoOutbox::DEFAULT_SHARDS`] if not given), and a later build that asks for another
    /// count fails, since each message's shard follows from its id and the count. Size it as
    /// [Shards and sizes](DynamoOutbox#shards-and-sizes) says; to change it, start a new table
    /// and keep dispatching the old one until it is empty.
    ///
    /// ```
    /// let builder = idem::DynamoOutbox::builder().shards(8);
    /// # let _ = builder;
    /// ```
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Whether [`build`](Self::build) creates the table when it is missing (as
    /// [`DynamoOutbox::create_table`] does). Off by default: a missing table is an error that
    /// names it.
    ///
    /// ```
    /// let builder = idem::DynamoOutbox::builder().create_table_if_missing(true);
    /// # let _ = builder;
    /// ```
    pub fn create_table_if_missing(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Checks the options, creates the table if asked, checks its layout (`DescribeTable`) and
    /// reads its shard count (a consistent `GetItem`), writing it on the table's first use.
    ///
    /// Errors: [`Error::InvalidConfig`] for a bad table name or shard count, a table in another
    /// layout, or a shard count other than the table's; a
    /// [`Query`](idem_core::StoreErrorKind::Query) store error naming the table when it does
    /// not exist; [`Unavailable`](idem_core::StoreErrorKind::Unavailable) when DynamoDB cannot
    /// be reached.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: idem::aws_sdk_dynamodb::Client = unimplemented!();
    /// let outbox = idem::DynamoOutbox::builder().build(client).await?;
    /// # let _ = outbox; Ok(()) }
    /// ```
    pub async fn build(self, client: Client) -> Result<DynamoOutbox, Error> {
        table::validate_name(&self.table)?;
        if let Some(n) = self.shards {
            check_shards(n)?;
        }
        if self.create_table {
            create(&client, &self.table).await?;
        } else {
            check(&client, &self.table).await?;
        }
        let shards = settle_shards(&client, &self.table, self.shards).await?;
        Ok(DynamoOutbox {
            inner: Arc::new(Inner {
                client,
                table: self.table,
                shards,
            }),
        })
    }
}

fn check_shards(n: u32) -> Result<(), Error> {
    if (1..=MAX_DYNAMO_OUTBOX_SHARDS).contains(&n) {
        return Ok(());
    }
    Err(Error::InvalidConfig(format!(
        "a DynamoOutbox has 1 to {MAX_DYNAMO_OUTBOX_SHARDS} shards, not {n}"
    )))
}

fn layout_key() -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PK.to_owned(), AttributeValue::S(LAYOUT.to_owned())),
        (ID.to_owned(), AttributeValue::S(LAYOUT.to_owned())),
    ])
}

/// The table's shard count: the layout item's, checked against `asked`; or, on the table's
/// first use, `asked` (or the default) written as the layout item unless another node wrote
/// one first.
async fn settle_shards(client: &Client, table: &str, asked: Option<u32>) -> Result<u32, Error> {
    for _ in 0..2 {
        let out = client
            .get_item()
            .table_name(table)
            .set_key(Some(layout_key()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| table_error("GetItem", table, CREATE_OUTBOX_TABLE, e))?;
        if let Some(item) = out.item {
            let kept = match item.get(SHARDS) {
                Some(AttributeValue::N(n)) => {
                    n.parse::<u32>().ok().filter(|n| check_shards(*n).is_ok())
                }
                _ => None,
            }
            .ok_or_else(|| {
                corrupt(
                    table,
                    format!("its layout item has {SHARDS} = {:?}", item.get(SHARDS)),
                )
            })?;
            return match asked {
                Some(n) if n != kept => Err(Error::InvalidConfig(format!(
                    "the DynamoOutbox table `{table}` has {kept} shards, not the {n} asked for: a \
                     table's shard count never changes (each message's shard follows from its \
                     id); ask for {kept}, or for none, or start a new table"
                ))),
                _ => Ok(kept),
            };
        }
        let mut item = layout_key();
        let shards = asked.unwrap_or(DynamoOutbox::DEFAULT_SHARDS);
        item.insert(SHARDS.to_owned(), number(i64::from(shards)));
        let put = client
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PK)
            .send()
            .await;
        match put {
            Ok(_) => return Ok(shards),
            // Another node's first build wrote it: read it.
            Err(SdkError::ServiceError(ctx))
                if ctx.err().is_conditional_check_failed_exception() => {}
            Err(e) => return Err(table_error("PutItem", table, CREATE_OUTBOX_TABLE, e)),
        }
    }
    Err(Error::Store(StoreError::new(
        StoreErrorKind::Transient,
        format!("the layout item of the DynamoOutbox table `{table}` was written by another node but could not be read back; retry"),
    )))
}

fn key_element(name: &str, key_type: KeyType) -> Result<KeySchemaElement, Error> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(key_type)
        .build()
        .map_err(|e| Error::InvalidConfig(e.to_string()))
}

fn attribute(name: &str, kind: ScalarAttributeType) -> Result<AttributeDefinition, Error> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .map_err(|e| Error::InvalidConfig(e.to_string()))
}

/// Creates `table` in the outbox's layout unless it exists, and waits until it is `ACTIVE`.
async fn create(client: &Client, table: &str) -> Result<(), Error> {
    table::validate_name(table)?;
    let index = LocalSecondaryIndex::builder()
        .index_name(QUEUE_INDEX)
        .key_schema(key_element(PK, KeyType::Hash)?)
        .key_schema(key_element(QUEUE, KeyType::Range)?)
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::All)
                .build(),
        )
        .build()
        .map_err(|e| Error::InvalidConfig(e.to_string()))?;
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute(PK, ScalarAttributeType::S)?)
        .attribute_definitions(attribute(ID, ScalarAttributeType::S)?)
        .attribute_definitions(attribute(QUEUE, ScalarAttributeType::N)?)
        .key_schema(key_element(PK, KeyType::Hash)?)
        .key_schema(key_element(ID, KeyType::Range)?)
        .local_secondary_indexes(index)
        .send()
        .await;
    table::finish_create(client, table, created, CREATE_OUTBOX_TABLE).await?;
    check(client, table).await
}

/// Checks that `table` is in the outbox's layout: keys `pk` (hash) and `id` (range), and the
/// local secondary index `queue` on `pk` and `queue_n`, projecting all attributes.
async fn check(client: &Client, table: &str) -> Result<(), Error> {
    let out = table::describe(client, table, CREATE_OUTBOX_TABLE).await?;
    let description = out.table();
    let keys_are = |keys: &[KeySchemaElement], range: &str| {
        matches!(keys, [h, r] if h.attribute_name() == PK && *h.key_type() == KeyType::Hash
            && r.attribute_name() == range && *r.key_type() == KeyType::Range)
    };
    let table_keys = description.map(|t| t.key_schema()).unwrap_or_default();
    let index = description
        .map(|t| t.local_secondary_indexes())
        .unwrap_or_default()
        .iter()
        .find(|i| i.index_name() == Some(QUEUE_INDEX));
    let index_ok = index.is_some_and(|i| {
        keys_are(i.key_schema(), QUEUE)
            && i.projection().and_then(|p| p.projection_type()) == Some(&ProjectionType::All)
    });
    if keys_are(table_keys, ID) && index_ok {
        return Ok(());
    }
    Err(Error::InvalidConfig(format!(
        "DynamoDB table `{table}` is not in the layout DynamoOutbox needs (a string hash key \
         `{PK}`, a string range key `{ID}`, and a local secondary index `{QUEUE_INDEX}` on \
         `{PK}` and the number `{QUEUE}` projecting all attributes); create one with \
         {CREATE_OUTBOX_TABLE}"
    )))
}

fn corrupt(table: &str, what: String) -> Error {
    Error::Store(StoreError::new(
        StoreErrorKind::Corrupt,
        format!(
            "an item of the DynamoOutbox table `{table}` is malformed ({what}); check that \
             nothing else writes to this table"
        ),
    ))
}

/// A message item read from the index: its `queue_n` and the message.
fn decode(
    table: &str,
    mut attrs: HashMap<String, AttributeValue>,
) -> Result<(i64, PendingMessage), Error> {
    let id = match attrs.get(ID) {
        Some(AttributeValue::S(s)) => s.clone(),
        other => return Err(corrupt(table, format!("an item has {ID} = {other:?}"))),
    };
    let mut take_s = |name: &str| match attrs.remove(name) {
        Some(AttributeValue::S(s)) => Ok(s),
        other => Err(corrupt(
            table,
            format!("message {id} has {name} = {other:?}"),
        )),
    };
    let aggregate_type = take_s(AGGREGATE_TYPE)?;
    let aggregate_id = take_s(AGGREGATE_ID)?;
    let kind = take_s(KIND)?;
    let payload = match attrs.remove(PAYLOAD) {
        Some(AttributeValue::B(b)) => b.into_inner(),
        other => {
            return Err(corrupt(
                table,
                format!("message {id} has {PAYLOAD} = {other:?}"),
            ))
        }
    };
    let numeric = |name: &str| match attrs.get(name) {
        Some(AttributeValue::N(n)) => n
            .parse::<i64>()
            .map_err(|_| corrupt(table, format!("message {id} has {name} = {n}"))),
        other => Err(corrupt(
            table,
            format!("message {id} has {name} = {other:?}"),
        )),
    };
    let queue = numeric(QUEUE)?;
    let seq = u64::try_from(numeric(SEQ)?)
        .map_err(|_| corrupt(table, format!("message {id} has a negative {SEQ}")))?;
    let created_ms = numeric(CREATED)?;
    let id = id
        .parse::<MessageId>()
        .map_err(|e| corrupt(table, e.to_string()))?;
    Ok((
        queue,
        PendingMessage {
            seq,
            added_at: time_of(created_ms),
            message: OutboxMessage {
                id,
                aggregate_type,
                aggregate_id,
                kind,
                payload,
            },
        },
    ))
}

/// A message's key: its shard and its id.
fn message_key(id: &MessageId, shards: u32) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PK.to_owned(), shard_of(id, shards)),
        (ID.to_owned(), AttributeValue::S(id.to_string())),
    ])
}

/// Runs `request` for each of `items`, up to [`IN_FLIGHT`] at a time, and counts those that
/// answered `true`. The first error is returned (the requests still in flight are dropped).
async fn count_each<I, F, Fut>(items: I, request: F) -> Result<u64, Error>
where
    I: IntoIterator,
    F: Fn(I::Item) -> Fut,
    Fut: Future<Output = Result<bool, Error>> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    let mut done = 0u64;
    let mut items = items.into_iter();
    loop {
        while tasks.len() < IN_FLIGHT {
            let Some(item) = items.next() else { break };
            tasks.spawn(request(item));
        }
        let Some(joined) = tasks.join_next().await else {
            return Ok(done);
        };
        done += u64::from(joined.map_err(task_failed)??);
    }
}

/// A request's task that panicked or was cancelled.
fn task_failed(e: tokio::task::JoinError) -> Error {
    Error::Store(StoreError::new(
        StoreErrorKind::Query,
        format!("a DynamoOutbox request's task ended without an answer: {e}"),
    ))
}

/// What one shard's `Query` found: its items (`queue_n` and message), in order, and whether the
/// shard has more in the range than the page held.
type ShardPage = (Vec<(i64, PendingMessage)>, bool);

impl Inner {
    fn error<E>(
        &self,
        op: &'static str,
        e: SdkError<E, aws_sdk_dynamodb::config::http::HttpResponse>,
    ) -> Error
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
    {
        table_error(op, &self.table, CREATE_OUTBOX_TABLE, e)
    }

    /// One strongly consistent `Query` of shard `shard`'s unsent range, in order: at most
    /// `limit` messages (and 1 MB).
    async fn pending_page(&self, shard: u32, limit: i32) -> Result<ShardPage, Error> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(QUEUE_INDEX)
            .key_condition_expression(PENDING_RANGE)
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#q", QUEUE)
            .expression_attribute_values(":shard", AttributeValue::S(shard.to_string()))
            .expression_attribute_values(":zero", number(0))
            .consistent_read(true)
            .scan_index_forward(true)
            .limit(limit)
            .send()
            .await
            .map_err(|e| self.error("Query", e))?;
        let more = out.last_evaluated_key.is_some_and(|k| !k.is_empty());
        let items = out
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|attrs| decode(&self.table, attrs))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok((items, more))
    }

    /// The keys and `queue_n` of up to `limit` messages of shard `shard` sent at or before
    /// `before` (a `queue_n`), oldest first.
    async fn sent_page(
        &self,
        shard: u32,
        before: i64,
        limit: i32,
    ) -> Result<Vec<(i64, HashMap<String, AttributeValue>)>, Error> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(QUEUE_INDEX)
            .key_condition_expression(PRUNE_RANGE)
            .projection_expression("#pk, #id, #q")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#id", ID)
            .expression_attribute_names("#q", QUEUE)
            .expression_attribute_values(":shard", AttributeValue::S(shard.to_string()))
            .expression_attribute_values(":before", number(before))
            .scan_index_forward(true)
            .limit(limit)
            .send()
            .await
            .map_err(|e| self.error("Query", e))?;
        out.items
            .unwrap_or_default()
            .into_iter()
            .map(|mut attrs| {
                let queue = match attrs.remove(QUEUE) {
                    Some(AttributeValue::N(n)) => n.parse::<i64>().ok(),
                    _ => None,
                }
                .ok_or_else(|| {
                    corrupt(&self.table, format!("a sent message has no number {QUEUE}"))
                })?;
                Ok((queue, attrs))
            })
            .collect()
    }

    /// Runs `page` for every shard side by side; the shards' answers in shard order.
    async fn per_shard<T, F, Fut>(self: &Arc<Self>, page: F) -> Result<Vec<T>, Error>
    where
        T: Send + 'static,
        F: Fn(Arc<Inner>, u32) -> Fut,
        Fut: Future<Output = Result<T, Error>> + Send + 'static,
    {
        let mut tasks = JoinSet::new();
        for shard in 0..self.shards {
            let page = page(self.clone(), shard);
            tasks.spawn(async move { (shard, page.await) });
        }
        let mut pages = Vec::with_capacity(self.shards as usize);
        while let Some(joined) = tasks.join_next().await {
            let (shard, page) = joined.map_err(task_failed)?;
            pages.push((shard, page?));
        }
        pages.sort_by_key(|(shard, _)| *shard);
        Ok(pages.into_iter().map(|(_, page)| page).collect())
    }
}

#[async_trait]
impl OutboxSource for DynamoOutbox {
    /// The unsent messages of every shard, merged by `seq`. A shard whose page was cut at 1 MB
    /// bounds the merge: nothing after its last message is returned, so no unread message of
    /// it is skipped (the next call reads on).
    async fn pending(&self, limit: u32) -> Result<Vec<PendingMessage>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let page_limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let pages = self
            .inner
            .per_shard(|inner, shard| async move { inner.pending_page(shard, page_limit).await })
            .await?;
        let mut bound = i64::MAX;
        let mut all = Vec::new();
        for (items, more) in pages {
            if more && let Some((last, _)) = items.last() {
                bound = bound.min(*last);
            }
            all.extend(items);
        }
        all.sort_by_key(|(queue, m)| (*queue, m.message.id));
        Ok(all
            .into_iter()
            .take_while(|(queue, _)| *queue <= bound)
            .take(limit as usize)
            .map(|(_, m)| m)
            .collect())
    }

    async fn mark_sent(&self, ids: &[MessageId]) -> Result<u64, Error> {
        let now = SystemTime::now();
        let now_ms = millis(now);
        let sent = number(sent_queue(now_ms));
        let mark = AttributeValue::N(next_seq(now).to_string());
        let inner = &self.inner;
        count_each(ids.iter().copied(), |id| {
            let inner = inner.clone();
            let sent = sent.clone();
            let mark = mark.clone();
            async move {
                let updated = inner
                    .client
                    .update_item()
                    .table_name(&inner.table)
                    .set_key(Some(message_key(&id, inner.shards)))
                    .update_expression(MARK)
                    .condition_expression(UNSENT)
                    .expression_attribute_names("#q", QUEUE)
                    .expression_attribute_names("#sent", SENT)
                    .expression_attribute_names("#mark", MARK_N)
                    .expression_attribute_values(":sent", sent)
                    .expression_attribute_values(":now", number(now_ms))
                    .expression_attribute_values(":mark", mark.clone())
                    .expression_attribute_values(":zero", number(0))
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .send()
                    .await;
                match updated {
                    Ok(_) => Ok(true),
                    // Sent already, or not in the outbox: nothing to mark, unless this very
                    // call marked it (the SDK sent the request again after its first attempt
                    // took effect).
                    Err(SdkError::ServiceError(ctx))
                        if ctx.err().is_conditional_check_failed_exception() =>
                    {
                        let old = match ctx.into_err() {
                            UpdateItemError::ConditionalCheckFailedException(e) => e.item,
                            _ => None,
                        };
                        Ok(old.is_some_and(|item| item.get(MARK_N) == Some(&mark)))
                    }
                    Err(e) => Err(inner.error("UpdateItem", e)),
                }
            }
        })
        .await
    }

    async fn prune_sent(&self, age: Duration, limit: u32) -> Result<u64, Error> {
        if limit == 0 {
            return Ok(0);
        }
        let cutoff_ms = millis(SystemTime::now()).saturating_sub(duration_millis(age));
        if cutoff_ms < 0 {
            return Ok(0);
        }
        let before = sent_queue(cutoff_ms);
        let page_limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let pages = self
            .inner
            .per_shard(
                |inner, shard| async move { inner.sent_page(shard, before, page_limit).await },
            )
            .await?;
        let mut old: Vec<(i64, HashMap<String, AttributeValue>)> =
            pages.into_iter().flatten().collect();
        old.sort_by_key(|(queue, _)| *queue);
        old.truncate(limit as usize);
        let inner = &self.inner;
        count_each(old, |(_, key)| {
            let inner = inner.clone();
            async move {
                let deleted = inner
                    .client
                    .delete_item()
                    .table_name(&inner.table)
                    .set_key(Some(key))
                    .condition_expression(SENT_BEFORE)
                    .expression_attribute_names("#q", QUEUE)
                    .expression_attribute_values(":before", number(before))
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .send()
                    .await;
                match deleted {
                    Ok(_) => Ok(true),
                    // Gone since the query: deleted by this call's own first attempt (the SDK
                    // sent the request again), counted, or by a dispatcher that lost its lease,
                    // counted by both. An item that is there is not old and sent: not counted.
                    Err(SdkError::ServiceError(ctx))
                        if ctx.err().is_conditional_check_failed_exception() =>
                    {
                        let old = match ctx.into_err() {
                            DeleteItemError::ConditionalCheckFailedException(e) => e.item,
                            _ => None,
                        };
                        Ok(old.is_none_or(|item| item.is_empty()))
                    }
                    Err(e) => Err(inner.error("DeleteItem", e)),
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::Key;

    #[test]
    fn seq_grows_even_when_the_clock_does_not() {
        let at = UNIX_EPOCH + Duration::from_secs(1_750_000_000);
        let first = next_seq(at);
        assert!(first >= 1_750_000_000_000_000_000);
        let again = next_seq(at);
        assert!(again > first, "one microsecond, two messages");
        let earlier = next_seq(at - Duration::from_secs(60));
        assert!(earlier > again, "a clock stepped back");
        assert!(i64::try_from(next_seq(SystemTime::now())).is_ok());
    }

    #[test]
    fn sent_messages_sort_below_every_unsent_one_by_age() {
        let now = millis(SystemTime::now());
        assert!(sent_queue(now) < 0);
        assert!(sent_queue(now - 1) < sent_queue(now));
        assert!(sent_queue(i64::MAX) < 0);
        assert_eq!(sent_queue(-5), -SENT_OFFSET);
    }

    #[test]
    fn ids_spread_over_the_shards_and_stay_put() {
        let mut seen = std::collections::HashSet::new();
        for n in 0..200 {
            let id = MessageId::derive(&Key::derive("s", "", &n.to_string()).unwrap(), "m");
            let AttributeValue::S(shard) = shard_of(&id, 8) else {
                panic!("a string");
            };
            assert_eq!(shard_of(&id, 8), AttributeValue::S(shard.clone()));
            seen.insert(shard);
            assert_eq!(shard_of(&id, 1), AttributeValue::S("0".into()));
        }
        assert_eq!(seen.len(), 8);
    }

    #[test]
    fn shard_counts_are_checked() {
        for good in [1, 4, MAX_DYNAMO_OUTBOX_SHARDS] {
            check_shards(good).unwrap();
        }
        for bad in [0, MAX_DYNAMO_OUTBOX_SHARDS + 1] {
            assert!(matches!(check_shards(bad), Err(Error::InvalidConfig(_))));
        }
    }
}
