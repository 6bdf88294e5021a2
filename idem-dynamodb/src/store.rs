//! [`DynamoStore`] and its builder (their docs hold the item layout, the requests of each call,
//! the clock-skew bound, the item size rule and what DynamoDB cannot keep of the store rules).
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;

use idem_core::store::support::{self, check_duration, check_fingerprint, LAPSED_CLAIMS_KEPT_MS};
use idem_core::{
    Abandoned, AbandonedQuery, Claim, ClaimOutcome, ClaimRequest, Clock, Completion, Error,
    Fingerprint, Key, OnLapse, Record, RecordState, StepLog, StepWrite, Store, StoreError,
    StoreErrorKind, SystemClock, Token, UncertainOperation,
};

use crate::item::{
    duration_millis, millis, number, pk, token, ttl_seconds, Item, COMPLETED, EXPIRES, FINGERPRINT,
    IN_PROGRESS, LAPSE_TTL, PK, STATE, TOKEN, TOMBSTONE, TTL, UNCERTAIN,
};
use crate::{errors, item, table};

/// The largest clock-skew margin the builder accepts.
const MAX_CLOCK_SKEW_MARGIN: Duration = Duration::from_secs(3600);

/// How often `start` sends its claim again when a duplicate's old item did not come back with
/// the failed condition (see "Round trips" on [`DynamoStore`]).
const CLAIM_ATTEMPTS: usize = 3;

/// The most items one `prune_expired` call examines per record it may delete, and at least.
const PRUNE_EXAMINE_PER_LIMIT: usize = 4;
const PRUNE_EXAMINE_MIN: usize = 1_000;
/// Items evaluated per Scan page while pruning.
const PRUNE_PAGE: i32 = 1_000;

// The expressions, written once. `:cutoff` is "now minus the clock-skew margin" in epoch
// milliseconds: a record whose expiry is at or before it has ended for every node whose clock is
// at most the margin ahead of the writer's.
/// A claim takes the key when it has no item, or one that ended and is not an uncertain claim
/// (which never ends by itself). A completed record's `expires_ms` is its tombstone's end when
/// it has one.
const CLAIM_CONDITION: &str =
    "attribute_not_exists(pk) OR (expires_ms <= :cutoff AND attribute_not_exists(uncertain))";
pub(crate) const OWNED_IN_PROGRESS: &str = "token_b = :token AND state_n = :in_progress";
/// What a completion sets and removes; `{}` are the response's and the tombstone's parts.
const COMPLETE: &str =
    "SET state_n = :completed, expires_ms = :expires, ttl_s = :ttl, is_error = :is_error";
/// A renewal: an uncertain claim's `ttl_s` stays what its `uncertain` holds (`true`, not a
/// number, which DynamoDB's TTL ignores); an ordinary one's moves with the lease.
const RENEW: &str =
    "SET expires_ms = :expires, lapse_ttl_s = :ttl, ttl_s = if_not_exists(uncertain, :ttl)";
/// Which record `take_uncertain` takes over: an uncertain claim of the token, lapsed for every
/// node within the margin.
const UNCERTAIN_LAPSED: &str = "token_b = :token AND state_n = :in_progress AND attribute_exists(uncertain) AND expires_ms <= :cutoff";
const TAKE_UNCERTAIN: &str = "SET token_b = :new, expires_ms = :expires, lapse_ttl_s = :ttl";
/// What `prune_expired` deletes: ended records (a completed one's `expires_ms` is its
/// tombstone's end when it has one) and ended steps items (no `state_n`), and claims that
/// lapsed longer ago than a late holder may still complete them
/// ([`LAPSED_CLAIMS_KEPT`](idem_core::LAPSED_CLAIMS_KEPT), `:lapsed`); never an uncertain claim.
const EXPIRED: &str = "expires_ms <= :cutoff AND attribute_not_exists(uncertain) AND (attribute_not_exists(state_n) OR state_n <> :in_progress OR expires_ms <= :lapsed)";
/// What `prune_expired` strips of its response: a completion whose retention ended before its
/// tombstone does.
const TO_STRIP: &str = "state_n = :completed AND retained_ms <= :cutoff";
/// The strip: the item becomes a tombstone without the result's bytes.
const STRIP: &str = "SET state_n = :tombstone REMOVE response_b";

/// The values [`EXPIRED`] names, at `now_ms` on this node's clock.
fn expired_values(margin_ms: i64, now_ms: i64) -> HashMap<String, AttributeValue> {
    let cutoff = now_ms.saturating_sub(margin_ms);
    HashMap::from([
        (":cutoff".to_owned(), number(cutoff)),
        (
            ":in_progress".to_owned(),
            AttributeValue::N(IN_PROGRESS.to_owned()),
        ),
        (
            ":lapsed".to_owned(),
            number(cutoff.saturating_sub(LAPSED_CLAIMS_KEPT_MS)),
        ),
    ])
}

/// The values [`TO_STRIP`] and [`STRIP`] name, at `now_ms` on this node's clock.
fn strip_values(margin_ms: i64, now_ms: i64) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (
            ":cutoff".to_owned(),
            number(now_ms.saturating_sub(margin_ms)),
        ),
        (
            ":completed".to_owned(),
            AttributeValue::N(COMPLETED.to_owned()),
        ),
        (
            ":tombstone".to_owned(),
            AttributeValue::N(TOMBSTONE.to_owned()),
        ),
    ])
}

/// `d` in whole seconds, rounded up (a tombstone's length as the stores keep it), in
/// milliseconds.
fn whole_seconds_ms(d: Duration) -> i64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i64::try_from(secs)
        .unwrap_or(i64::MAX / 1000)
        .saturating_mul(1000)
}

/// The `ttl_s` of a claim whose lease ends at `lease_end_ms`: DynamoDB's own deletion leaves it
/// for [`LAPSED_CLAIMS_KEPT`](idem_core::LAPSED_CLAIMS_KEPT) after that, so that its holder can
/// still complete it while nobody took the key over.
fn lapsed_ttl(lease_end_ms: i64, margin_ms: i64) -> AttributeValue {
    ttl_seconds(
        lease_end_ms.saturating_add(LAPSED_CLAIMS_KEPT_MS),
        margin_ms,
    )
}

/// Records in a DynamoDB table: the store for serverless and scale-out services (feature
/// `dynamodb`).
///
/// A claim is one conditional `PutItem`; a duplicate (locked, replay, key reused) is decided
/// from the old item that the same failed write returns, so it costs no second read. Leases and
/// expiry are judged from the times inside each item, on the client's clock, with a
/// [clock-skew margin](#time-and-clock-skew). The caller brings the [`aws_sdk_dynamodb::Client`]
/// (built with `aws-config`, or by hand as below); idem-core does not depend on `aws-config`.
///
/// Cloning is cheap: clones share the client.
///
/// ```no_run
/// use std::time::Duration;
/// use idem::{DynamoStore, Idempotency, Key};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// // In a service: `aws_sdk_dynamodb::Client::new(&aws_config::load_from_env().await)`.
/// let config = aws_sdk_dynamodb::Config::builder()
///     .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
///     .region(aws_sdk_dynamodb::config::Region::new("eu-west-1"))
///     .credentials_provider(aws_sdk_dynamodb::config::Credentials::new("AKID", "SECRET", None, None, "static"))
///     .build();
/// let client = aws_sdk_dynamodb::Client::from_conf(config);
///
/// let store = DynamoStore::builder()
///     .table("idem_records")
///     .create_table_if_missing(true) // on-demand billing, TTL enabled
///     .build(client)
///     .await?;
/// let engine = Idempotency::new(store);
/// let receipt = engine
///     .call(Key::derive("deposit", "alice", "req-1")?)
///     .run(async { Ok::<_, idem::Error>(4200u64) })
///     .await?;
/// # let _ = receipt; Ok(()) }
/// ```
///
/// # Pointing idem at DynamoDB
///
/// 1. Create the table once, with [`DynamoStore::create_table`] or the builder's
///    [`create_table_if_missing`](DynamoStoreBuilder::create_table_if_missing), or with your
///    infrastructure tool: a string hash key named `pk`, no sort key, on-demand billing (or
///    provisioned capacity sized for two writes per new key), and **TTL enabled on the attribute
///    `ttl_s`**.
/// 2. Build the store on your client with [`DynamoStore::builder`]. `build` checks the table's
///    key with one `DescribeTable`.
/// 3. The role needs `dynamodb:PutItem`, `UpdateItem`, `DeleteItem`, `GetItem`, `Scan` (for
///    [`prune_expired`](Store::prune_expired) and the [`StoreAdmin`](idem_core::StoreAdmin) reads
///    only) and `DescribeTable` on the table; creating
///    it also needs `CreateTable`, `DescribeTimeToLive` and `UpdateTimeToLive`.
///
/// # Item
///
/// | attribute | type | holds |
/// |---|---|---|
/// | `pk` | S (hash key) | the record's key, 64 hex digits |
/// | `token_b` | B | the claim's random 128-bit fencing token |
/// | `fingerprint_b` | B | the request's fingerprint, when given |
/// | `state_n` | N | 0 in progress, 1 completed, 2 a tombstone whose response `prune_expired` dropped |
/// | `expires_ms` | N | lease end (in progress), or the end of a completed record: its retention's, or with a `key_retention` its tombstone's; epoch milliseconds on the writer's clock |
/// | `retained_ms` | N | with a `key_retention`: the retention's end (the tombstone, in whole seconds rounded up, is `expires_ms` less this) |
/// | `uncertain` | BOOL | `true` on a claim that becomes uncertain if its lease ends ([`OnLapse::Uncertain`]); absent otherwise |
/// | `lapse_ttl_s` | N | a running claim's TTL as an ordinary claim, kept by every claim and renewal, for a step write that sets an uncertain claim back to release |
/// | `response_b` | B | the stored response, once completed with one; dropped from a tombstone |
/// | `is_error` | BOOL | whether the response is an error result |
/// | `ttl_s` | N, or BOOL | epoch seconds after which DynamoDB's TTL may delete the item: the end of the retention, or of the tombstone; for a claim, [`LAPSED_CLAIMS_KEPT`](idem_core::LAPSED_CLAIMS_KEPT) after its lease's end, so that a late holder can still complete it. `true` on an uncertain claim: not a number, so DynamoDB's TTL leaves the item alone (as AWS documents for a TTL attribute of another type) |
///
/// # Round trips
///
/// | call | requests |
/// |---|---|
/// | `start`, new or expired key | 1: `PutItem` conditioned on `attribute_not_exists(pk) OR (expires_ms <= :cutoff AND attribute_not_exists(uncertain))` |
/// | `start`, live key (replay, locked, uncertain, tombstone, key reused) | the same 1 `PutItem`: its condition fails and, with `ReturnValuesOnConditionCheckFailure=ALL_OLD`, returns the live item that decides the outcome |
/// | `complete` | 1: `UpdateItem` conditioned on the token and the in-progress state; a failed condition returns the old item, which tells "already completed by this claim" (Ok) from a lost lease |
/// | `renew` | 1: `UpdateItem` conditioned on the token and the in-progress state (`ttl_s = if_not_exists(uncertain, :ttl)`: an uncertain claim's stays `true`) |
/// | `take_uncertain` | 1: `UpdateItem` of the token and lease, conditioned on the token, the in-progress state, `uncertain` and the lease's end (with the margin) |
/// | `find_uncertain` | a `Scan` of the whole table as `list`'s, filtered to lapsed uncertain claims, then one consistent `GetItem` per operation returned |
/// | `abort` | 1: `DeleteItem` conditioned on the token and the in-progress state |
/// | `get` | 1: `GetItem` with a strongly consistent read |
/// | `evict` | 2: `DeleteItem` of the steps item, then of the record with `ReturnValues=ALL_OLD` |
/// | `begin_steps` | 2: a consistent `GetItem` of the steps item `<key>:steps`, then a `TransactWriteItems` of a `ConditionCheck` (the record in progress under the claim's token) and a `Put` of the steps item |
/// | `write_step` | 1: `TransactWriteItems` of the same `ConditionCheck` (with `on_lapse`, an `Update` of the record under the same condition that sets or removes `uncertain`, and `ttl_s` with it) and an `Update` of the steps item (a finished step's result kept with `if_not_exists`); for [`Steps::dynamo_tx`](crate::DynamoSteps::dynamo_tx), the caller's writes in the same transaction |
/// | `prune_expired(limit)` | Scan pages (below) plus one conditional `DeleteItem` per expired item and one conditional `UpdateItem` per tombstone it strips |
/// | [`StoreAdmin`](idem_core::StoreAdmin) `list`, `stats` | a `Scan` of the whole table each ([below](#impl-StoreAdmin-for-DynamoStore)) |
///
/// A server that does not return the old item with a failed condition (DynamoDB does; an old
/// emulator may not) costs a duplicate one consistent `GetItem` more, and the claim is sent again
/// (at most three times) if that read finds the item gone or expired.
///
/// Each request builds its item or values afresh (the SDK takes them by value); the expression
/// strings are constants.
///
/// # Time and clock skew
///
/// DynamoDB has no server clock that a condition could read, so the store keeps the
/// **"Database time" store rule only approximately** (`docs/architecture.md`): leases and
/// retentions are computed from this node's clock (the builder's
/// [`clock`](DynamoStoreBuilder::clock), the system clock by default) and written into the item,
/// and every condition and read judges expiry from those stored times against the reading
/// node's clock. To tolerate nodes whose clocks differ, a record counts as ended for every node
/// only once `expires_at + margin` has passed on that node's clock, where `margin` is the
/// [clock-skew margin](DynamoStoreBuilder::clock_skew_margin) (1 s by default). So:
///
/// - **Within the margin, fencing holds.** If no node's clock is more than `margin` ahead of the
///   clock of the node that last wrote a lease (its claim or renewal), no node takes the key over
///   before the lease has ended by the owner's own clock. A crashed owner's key is free again
///   `lease + margin` after its last renewal.
/// - **Beyond the margin, it does not.** A node whose clock is `margin + d` ahead of the owner's
///   may take over a lease `d` before it ends, and the work may then run twice (the old owner's
///   `complete` gets [`Error::LeaseLost`], as with any takeover). Likewise it treats a completed
///   record's retention as over `d` early. Keep clocks synchronised (NTP, Amazon Time Sync) well
///   within the margin, and keep leases much longer than the margin.
/// - A node whose clock is *behind* only waits longer before taking over.
///
/// The margin also delays the `ttl_s` attribute, so DynamoDB's own deletion never removes an item
/// that a node within the margin still treats as live.
///
/// # Item size: the 400 KB rule
///
/// DynamoDB refuses items larger than 400 KB. The store says how large a response fits in one
/// item beside the rest of the record ([`Store::max_response_bytes`], 399,730 bytes), and the
/// engine keeps a result whose stored form is larger as "completed, result not retained" itself,
/// with the reason ("stored, it is N bytes, more than the store keeps in a record (399730)"):
/// the caller of the fresh call still gets its result, and every retry gets
/// [`Error::ResultNotRetained`] until the retention ends, never a second run. `complete` on the
/// raw store refuses a larger response with a
/// [`StoreErrorKind::Query`](idem_core::StoreErrorKind::Query) error and writes nothing. Set
/// [`Policy::max_response_bytes`](idem_core::Policy::max_response_bytes) below 400 KB to make that
/// limit explicit.
///
/// # TTL lag
///
/// DynamoDB's TTL deletes expired items in the background, typically within a few days of
/// expiry (AWS gives no bound; 48 hours is common). The store never relies on it: an expired item
/// that TTL has not yet deleted is taken over by the claim's condition, reads as absent through
/// `get`, and is deleted by `prune_expired`. TTL keeps the table from growing without anyone
/// running a pruner; a [`Pruner`](idem_core::Pruner) is optional here. TTL deletions consume no
/// write capacity, while `prune_expired` pays for its Scan and deletes.
///
/// # Past the lease
///
/// (`docs/architecture.md`.) An uncertain claim ([`OnLapse::Uncertain`], or set so by a step
/// write) is never deleted by DynamoDB's TTL (its `ttl_s` is `true`, not a number) nor by
/// `prune_expired` (whose condition excludes `uncertain`), and no claim's condition takes it
/// over: past its lease (and the margin) a claim answers [`ClaimOutcome::Uncertain`] until its
/// holder completes or aborts it, [`take_uncertain`](Store::take_uncertain) resolves it, or it
/// is evicted.
///
/// A completion with a [`key_retention`](Completion::key_retention) keeps the item until the
/// tombstone's end (`expires_ms` and `ttl_s`), with the retention's end in `retained_ms`; past
/// the retention (and the margin) a claim answers [`ClaimOutcome::Expired`] and `get` reads
/// [`RecordState::Expired`], never the response. DynamoDB cannot drop one attribute by itself,
/// so **the response's bytes stay in the item until `prune_expired` strips them** (a
/// conditional `UpdateItem` that removes `response_b` and sets `state_n` to 2, counted in what
/// it returns) or DynamoDB's TTL deletes the whole item at the tombstone's end. Run a
/// [`Pruner`](idem_core::Pruner) (or `idem prune`) where the result's bytes must go when the
/// retention ends. A stripped tombstone is at most 200 bytes as DynamoDB counts item size
/// (155 without a fingerprint): its key, token, fingerprint, state, three times and `is_error`.
///
/// # Pruning
///
/// `prune_expired(limit)` scans the table with the filter `expires_ms <= :cutoff` (for a claim:
/// its lease ended more than [`LAPSED_CLAIMS_KEPT`](idem_core::LAPSED_CLAIMS_KEPT) ago, and never an
/// uncertain claim) or `retained_ms <= :cutoff` (a tombstone that still has its response), in
/// pages of up to 1,000 evaluated items, examining at most `max(4 × limit, 1000)` items per
/// call, and deletes each expired item with a `DeleteItem` conditioned on the same expiry (an
/// item claimed again meanwhile stays), or strips a tombstone's response with an `UpdateItem`
/// conditioned likewise; both count towards `limit` and the number returned. A Scan reads (and bills) every item it examines, live or not, so a call on
/// a large table is expensive: prefer TTL, and prune rarely if at all. Successive calls continue
/// where the previous one stopped, so a call returning less than `limit` may have stopped at
/// its examination budget rather than at the end of the table; the next call goes on from there.
///
/// # Consistency
///
/// Every request addresses one item by its key; conditional writes on one item are atomic and
/// `get` reads with `ConsistentRead=true`, so a single-region table gives the same guarantees
/// as the SQL stores. **Global tables are not supported**: replication between regions is
/// asynchronous and resolves conflicting writes by "last writer wins", so two regions can each
/// win the claim of a key (each condition sees only its own region) and one region's completion
/// can silently overwrite the other's, which defeats fencing. Use one region's table for every
/// node, or a separate table (or key scope) per region.
///
/// # Errors
///
/// Failures are [`Error::Store`] with a [`StoreErrorKind`](idem_core::StoreErrorKind): a connection
/// refused, a timeout or any other dispatch failure, and a response that could not be read, is
/// `Unavailable`; throttling (`ProvisionedThroughputExceededException`, `ThrottlingException`,
/// `RequestLimitExceeded`), `TransactionConflictException`, `LimitExceededException` and any
/// 5xx answer are `Transient`; an item collection at its 10 GB
/// (`ItemCollectionSizeLimitExceededException`, on a table with a local secondary index such as
/// a [`DynamoOutbox`](crate::DynamoOutbox)'s) is `Full`; a validation error, a missing table
/// (the message names it) or any other refusal is `Query`; an item that the store did not
/// write in its layout is `Corrupt`. Failed conditions are not errors: they decide `Locked`, `Completed`,
/// `KeyReused` and `LeaseLost`. The SDK's own retry policy (from your client's configuration)
/// runs first.
///
/// # Dependencies
///
/// The feature enables `aws-sdk-dynamodb` with `rt-tokio` and `rustls` (HTTPS through rustls
/// with ring) only. For the SDK's newer HTTPS client, enable its `default-https-client` feature
/// in your own dependencies; Cargo unifies the features. aws-sdk-dynamodb follows a recent Rust
/// (1.94.1 or later for the 1.136 release this was built with), newer than idem's own minimum.
#[derive(Clone)]
pub struct DynamoStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) table: String,
    margin: Duration,
    pub(crate) margin_ms: i64,
    clock: Arc<dyn Clock>,
    /// Where the next `prune_expired` goes on scanning: the start of the page it stopped in.
    prune_cursor: Mutex<Option<HashMap<String, AttributeValue>>>,
}

impl fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.inner.table)
            .field("clock_skew_margin", &self.inner.margin)
            .finish_non_exhaustive()
    }
}

impl DynamoStore {
    /// The table name used unless [`DynamoStoreBuilder::table`] says otherwise.
    pub const DEFAULT_TABLE: &'static str = "idem_records";

    /// The clock-skew margin used unless [`DynamoStoreBuilder::clock_skew_margin`] says
    /// otherwise.
    pub const DEFAULT_CLOCK_SKEW_MARGIN: Duration = Duration::from_secs(1);

    /// Options: table name, clock-skew margin, clock, table creation.
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = idem::DynamoStore::builder()
    ///     .table("idem_orders")
    ///     .clock_skew_margin(Duration::from_secs(2));
    /// # let _ = builder;
    /// ```
    pub fn builder() -> DynamoStoreBuilder {
        DynamoStoreBuilder::default()
    }

    /// Creates the table `table` unless it exists: on-demand billing, a string hash key `pk`,
    /// and TTL enabled on `ttl_s` where the server supports it (a server that does not gets a
    /// warning in the log, not an error). Waits up to two minutes for the table to become
    /// `ACTIVE`. Safe to call from several nodes at once. Fails with
    /// [`Error::InvalidConfig`] for a name DynamoDB would refuse, or for an existing table with
    /// another key.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: aws_sdk_dynamodb::Client = unimplemented!();
    /// idem::DynamoStore::create_table(&client, "idem_records").await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_table(client: &Client, table: &str) -> Result<(), Error> {
        table::create(client, table).await
    }

    /// Writes the finished step `step` of `claim`'s operation and the caller's `items` in one
    /// `TransactWriteItems` fenced by the claim ([`Steps::dynamo_tx`](crate::DynamoSteps::dynamo_tx)).
    pub(crate) async fn write_step_with(
        &self,
        claim: &Claim,
        step: StepWrite<'_>,
        items: Vec<aws_sdk_dynamodb::types::TransactWriteItem>,
    ) -> Result<(), Error> {
        step.check()?;
        let retention_ms = duration_millis(step.retention);
        self.inner
            .write_step(claim, step, retention_ms, items)
            .await
    }

    /// The table's name.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: aws_sdk_dynamodb::Client = unimplemented!();
    /// let store = idem::DynamoStore::builder().build(client).await?;
    /// assert_eq!(store.table(), "idem_records");
    /// # Ok(()) }
    /// ```
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The client the store sends its requests with.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: aws_sdk_dynamodb::Client = unimplemented!();
    /// let store = idem::DynamoStore::builder().build(client).await?;
    /// let same_client = store.client().clone();
    /// # let _ = same_client; Ok(()) }
    /// ```
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Whether the last [`prune_expired`](Store::prune_expired) stopped before the end of the
    /// table (at its examination budget or its `limit`): the next call goes on from there. A
    /// call that returned less than its `limit` with this `false` scanned to the end of the
    /// table, so a loop that prunes a whole table (the `idem prune` command) stops there.
    ///
    /// ```no_run
    /// use idem::Store;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: aws_sdk_dynamodb::Client = unimplemented!();
    /// let store = idem::DynamoStore::builder().build(client).await?;
    /// let mut deleted = 0;
    /// loop {
    ///     let n = store.prune_expired(1000).await?;
    ///     deleted += n;
    ///     if n < 1000 && !store.prune_scan_unfinished() {
    ///         break;
    ///     }
    /// }
    /// # let _ = deleted; Ok(()) }
    /// ```
    pub fn prune_scan_unfinished(&self) -> bool {
        self.inner
            .prune_cursor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The clock-skew margin (see [the store's docs](DynamoStore#time-and-clock-skew)).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: aws_sdk_dynamodb::Client = unimplemented!();
    /// let store = idem::DynamoStore::builder().build(client).await?;
    /// assert_eq!(store.clock_skew_margin(), idem::DynamoStore::DEFAULT_CLOCK_SKEW_MARGIN);
    /// # Ok(()) }
    /// ```
    pub fn clock_skew_margin(&self) -> Duration {
        self.inner.margin
    }
}

/// Options for a [`DynamoStore`]; finish with [`build`](Self::build).
///
/// ```no_run
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// # let client: aws_sdk_dynamodb::Client = unimplemented!();
/// let store = idem::DynamoStore::builder()
///     .table("billing-idem")
///     .clock_skew_margin(Duration::from_millis(500))
///     .build(client)
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
pub struct DynamoStoreBuilder {
    table: String,
    margin: Duration,
    clock: Arc<dyn Clock>,
    create_table: bool,
}

impl Default for DynamoStoreBuilder {
    fn default() -> Self {
        DynamoStoreBuilder {
            table: DynamoStore::DEFAULT_TABLE.to_owned(),
            margin: DynamoStore::DEFAULT_CLOCK_SKEW_MARGIN,
            clock: Arc::new(SystemClock),
            create_table: false,
        }
    }
}

impl fmt::Debug for DynamoStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoStoreBuilder")
            .field("table", &self.table)
            .field("clock_skew_margin", &self.margin)
            .field("create_table_if_missing", &self.create_table)
            .finish_non_exhaustive()
    }
}

impl DynamoStoreBuilder {
    /// The table's name ([`DynamoStore::DEFAULT_TABLE`], `idem_records`, by default): 3 to 255 characters of
    /// `a-z A-Z 0-9 _ - .`, checked by [`build`](Self::build).
    ///
    /// ```
    /// let builder = idem::DynamoStore::builder().table("idem_payments");
    /// # let _ = builder;
    /// ```
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// How far ahead of the lease writer's clock another node's clock may be without taking over
    /// a live lease (1 s by default; at most one hour). A record ends for everyone only once
    /// `expires_at + margin` has passed; see
    /// [the store's docs](DynamoStore#time-and-clock-skew) for the exact bound. A crashed owner's
    /// key stays blocked `margin` longer than its lease.
    ///
    /// ```
    /// let builder = idem::DynamoStore::builder().clock_skew_margin(std::time::Duration::from_secs(2));
    /// # let _ = builder;
    /// ```
    pub fn clock_skew_margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// The clock the store reads time from ([`SystemClock`] by default). Tests inject a
    /// [`ManualClock`](idem_core::ManualClock) or [`TokioClock`](idem_core::TokioClock); two stores on
    /// the same table with different clocks act as two nodes with skewed clocks.
    ///
    /// ```
    /// let builder = idem::DynamoStore::builder().clock(idem::ManualClock::new());
    /// # let _ = builder;
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Whether [`build`](Self::build) creates the table when it is missing (as
    /// [`DynamoStore::create_table`] does). Off by default: a missing table is an error that
    /// names it.
    ///
    /// ```
    /// let builder = idem::DynamoStore::builder().create_table_if_missing(true);
    /// # let _ = builder;
    /// ```
    pub fn create_table_if_missing(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// Checks the options, creates the table if asked, and checks that the table exists with
    /// the store's key (one `DescribeTable`).
    ///
    /// Errors: [`Error::InvalidConfig`] for a bad table name or margin, or a table with another
    /// key; a [`Query`](idem_core::StoreErrorKind::Query) store error naming the table when it does
    /// not exist; [`Unavailable`](idem_core::StoreErrorKind::Unavailable) when DynamoDB cannot be
    /// reached.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// # let client: aws_sdk_dynamodb::Client = unimplemented!();
    /// let store = idem::DynamoStore::builder().build(client).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn build(self, client: Client) -> Result<DynamoStore, Error> {
        table::validate_name(&self.table)?;
        if self.margin > MAX_CLOCK_SKEW_MARGIN {
            return Err(Error::InvalidConfig(format!(
                "clock_skew_margin must be at most {MAX_CLOCK_SKEW_MARGIN:?}, got {:?}",
                self.margin
            )));
        }
        if self.create_table {
            table::create(&client, &self.table).await?;
        } else {
            table::check(&client, &self.table).await?;
        }
        Ok(DynamoStore {
            inner: Arc::new(Inner {
                client,
                table: self.table,
                margin_ms: duration_millis(self.margin),
                margin: self.margin,
                clock: self.clock,
                prune_cursor: Mutex::new(None),
            }),
        })
    }
}

fn remaining(until_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(until_ms.saturating_sub(now_ms).max(0).unsigned_abs())
}

impl Inner {
    pub(crate) fn now_ms(&self) -> i64 {
        millis(self.clock.now())
    }

    /// Records whose expiry is at or before this ended for every node within the margin.
    fn cutoff(&self, now_ms: i64) -> AttributeValue {
        number(now_ms.saturating_sub(self.margin_ms))
    }

    /// Whether `item` holds its key at `now_ms` on this node's clock (less the margin): see
    /// [`Item::holds_key`].
    pub(crate) fn holds_key(&self, item: &Item, now_ms: i64) -> bool {
        item.holds_key(now_ms.saturating_sub(self.margin_ms))
    }

    pub(crate) fn error<E>(
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
        errors::table_error(op, &self.table, errors::CREATE_STORE_TABLE, e)
    }

    /// What a duplicate `start` gets from the live item it met.
    fn duplicate(
        &self,
        key: &Key,
        item: Item,
        fingerprint: Option<&Fingerprint>,
        now_ms: i64,
    ) -> Result<ClaimOutcome, Error> {
        check_fingerprint(item.fingerprint.as_ref(), fingerprint)?;
        let expires_ms = item.expires_ms;
        Ok(
            match item
                .into_record(key, now_ms.saturating_sub(self.margin_ms))
                .state
            {
                RecordState::InProgress { .. } => ClaimOutcome::Locked {
                    // Until the lease ends; once it has, until this node may take it over.
                    retry_after: if expires_ms > now_ms {
                        remaining(expires_ms, now_ms)
                    } else {
                        remaining(expires_ms.saturating_add(self.margin_ms), now_ms)
                    },
                },
                RecordState::Uncertain { since, .. } => ClaimOutcome::Uncertain { since },
                RecordState::Completed(result) => ClaimOutcome::Completed(result),
                RecordState::Expired { since } => ClaimOutcome::Expired { since },
            },
        )
    }

    /// One consistent read of `key`'s item, decoded.
    pub(crate) async fn read(&self, key: &Key) -> Result<Option<Item>, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, pk(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.error("GetItem", e))?;
        out.item.map(|attrs| Item::decode(key, attrs)).transpose()
    }
}

#[async_trait]
impl Store for DynamoStore {
    /// The largest response whose completed item fits in DynamoDB's 400 KB.
    fn max_response_bytes(&self) -> Option<usize> {
        Some(item::max_response_bytes())
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        request.check()?;
        let (key, fingerprint) = (request.key, request.fingerprint);
        let s = &*self.inner;
        let lease_ms = duration_millis(request.lease);
        let uncertain = request.on_lapse == OnLapse::Uncertain;
        for _ in 0..CLAIM_ATTEMPTS {
            let now_ms = s.now_ms();
            let expires_ms = now_ms.saturating_add(lease_ms);
            let claim = Token::random();
            let mut item = HashMap::with_capacity(6);
            item.insert(PK.to_owned(), pk(key));
            item.insert(TOKEN.to_owned(), token(claim));
            if let Some(f) = fingerprint {
                item.insert(
                    FINGERPRINT.to_owned(),
                    AttributeValue::B(Blob::new(f.as_bytes().to_vec())),
                );
            }
            item.insert(STATE.to_owned(), AttributeValue::N(IN_PROGRESS.to_owned()));
            item.insert(EXPIRES.to_owned(), number(expires_ms));
            let ttl = lapsed_ttl(expires_ms, s.margin_ms);
            if uncertain {
                // Not a number: DynamoDB's TTL never deletes the item (see "Item").
                item.insert(UNCERTAIN.to_owned(), AttributeValue::Bool(true));
                item.insert(TTL.to_owned(), AttributeValue::Bool(true));
            } else {
                item.insert(TTL.to_owned(), ttl.clone());
            }
            item.insert(LAPSE_TTL.to_owned(), ttl);
            let put = s
                .client
                .put_item()
                .table_name(&s.table)
                .set_item(Some(item))
                .condition_expression(CLAIM_CONDITION)
                .expression_attribute_values(":cutoff", s.cutoff(now_ms))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let old =
                match put {
                    Ok(_) => return Ok(ClaimOutcome::Claimed(Claim::new(*key, claim))),
                    Err(SdkError::ServiceError(ctx))
                        if ctx.err().is_conditional_check_failed_exception() =>
                    {
                        match ctx.into_err() {
                        aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(e) => e.item,
                        _ => None,
                    }
                    }
                    Err(e) => return Err(s.error("PutItem", e)),
                };
            let old = match old {
                Some(attrs) => Some(Item::decode(key, attrs)?),
                // A server that does not return the old item: read it.
                None => s.read(key).await?,
            };
            // The condition failed, so the item was live when it was checked; one that has
            // ended since (or a read-back item that is gone or expired) is claimed again. One
            // holding this very attempt's token is this claim: the SDK sent the put again after
            // its answer was lost (a timeout, a 5xx), and the first copy was written.
            if let Some(held) = &old
                && held.token == claim
                && matches!(held.state, item::State::InProgress { .. })
            {
                return Ok(ClaimOutcome::Claimed(Claim::new(*key, claim)));
            }
            let now_ms = s.now_ms();
            match old {
                Some(item) if s.holds_key(&item, now_ms) => {
                    return s.duplicate(key, item, fingerprint, now_ms);
                }
                _ => continue,
            }
        }
        Err(Error::Store(StoreError::new(
            StoreErrorKind::Transient,
            format!(
                "DynamoDB PutItem: the claim's condition failed {CLAIM_ATTEMPTS} times but the \
                 item read back was gone or expired each time"
            ),
        )))
    }

    async fn complete(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error> {
        completion.check()?;
        let s = &*self.inner;
        let now_ms = s.now_ms();
        let retained_ms = now_ms.saturating_add(duration_millis(completion.retention));
        let kept_ms = whole_seconds_ms(completion.key_retention);
        let expires_ms = retained_ms.saturating_add(kept_ms);
        support::check_response_size("DynamoStore", item::max_response_bytes(), &completion)?;
        let response = completion.response;
        let mut set = COMPLETE.to_owned();
        let mut remove = format!("{UNCERTAIN}, {LAPSE_TTL}");
        match response {
            Some(_) => set.push_str(", response_b = :response"),
            None => remove.push_str(", response_b"),
        }
        if kept_ms > 0 {
            set.push_str(", retained_ms = :retained");
        }
        let update = s
            .client
            .update_item()
            .table_name(&s.table)
            .key(PK, pk(claim.key()))
            .condition_expression(OWNED_IN_PROGRESS)
            .expression_attribute_values(":token", token(claim.token()))
            .expression_attribute_values(":in_progress", AttributeValue::N(IN_PROGRESS.to_owned()))
            .expression_attribute_values(":completed", AttributeValue::N(COMPLETED.to_owned()))
            .expression_attribute_values(":expires", number(expires_ms))
            .expression_attribute_values(":ttl", ttl_seconds(expires_ms, s.margin_ms))
            .expression_attribute_values(":is_error", AttributeValue::Bool(completion.is_error))
            .update_expression(format!("{set} REMOVE {remove}"))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let update = match response {
            Some(bytes) => update.expression_attribute_values(
                ":response",
                AttributeValue::B(Blob::new(bytes.to_vec())),
            ),
            None => update,
        };
        let update = if kept_ms > 0 {
            update.expression_attribute_values(":retained", number(retained_ms))
        } else {
            update
        };
        let old = match update.send().await {
            Ok(_) => return Ok(()),
            Err(SdkError::ServiceError(ctx)) if ctx.err().is_conditional_check_failed_exception() => {
                match ctx.into_err() {
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(e) => e.item,
                    _ => None,
                }
            }
            Err(e) => return Err(s.error("UpdateItem", e)),
        };
        let old = match old {
            Some(attrs) => Some(Item::decode(claim.key(), attrs)?),
            None => s.read(claim.key()).await?,
        };
        // Completed by this very claim before (its answer was lost): the first result stands.
        match old {
            Some(item) if item.token == claim.token() && item.is_completed() => Ok(()),
            _ => Err(Error::LeaseLost),
        }
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        let s = &*self.inner;
        let deleted = s
            .client
            .delete_item()
            .table_name(&s.table)
            .key(PK, pk(claim.key()))
            .condition_expression(OWNED_IN_PROGRESS)
            .expression_attribute_values(":token", token(claim.token()))
            .expression_attribute_values(":in_progress", AttributeValue::N(IN_PROGRESS.to_owned()))
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(ctx))
                if ctx.err().is_conditional_check_failed_exception() =>
            {
                Err(Error::LeaseLost)
            }
            Err(e) => Err(s.error("DeleteItem", e)),
        }
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        check_duration("lease", lease)?;
        let s = &*self.inner;
        let expires_ms = s.now_ms().saturating_add(duration_millis(lease));
        let updated = s
            .client
            .update_item()
            .table_name(&s.table)
            .key(PK, pk(claim.key()))
            .update_expression(RENEW)
            .condition_expression(OWNED_IN_PROGRESS)
            .expression_attribute_values(":token", token(claim.token()))
            .expression_attribute_values(":in_progress", AttributeValue::N(IN_PROGRESS.to_owned()))
            .expression_attribute_values(":expires", number(expires_ms))
            .expression_attribute_values(":ttl", lapsed_ttl(expires_ms, s.margin_ms))
            .send()
            .await;
        match updated {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(ctx))
                if ctx.err().is_conditional_check_failed_exception() =>
            {
                Err(Error::LeaseLost)
            }
            Err(e) => Err(s.error("UpdateItem", e)),
        }
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let s = &*self.inner;
        let item = s.read(key).await?;
        let cutoff_ms = s.now_ms().saturating_sub(s.margin_ms);
        Ok(item
            .filter(|item| item.holds_key(cutoff_ms))
            .map(|item| item.into_record(key, cutoff_ms)))
    }

    async fn evict(&self, key: &Key) -> Result<bool, Error> {
        let s = &*self.inner;
        // The steps first: a record evicted without them would let a new run replay them.
        s.evict_steps(key).await?;
        let out = s
            .client
            .delete_item()
            .table_name(&s.table)
            .key(PK, pk(key))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| s.error("DeleteItem", e))?;
        Ok(out.attributes.is_some_and(|a| !a.is_empty()))
    }

    async fn take_uncertain(
        &self,
        key: &Key,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, Error> {
        check_duration("lease", lease)?;
        let s = &*self.inner;
        let now_ms = s.now_ms();
        let expires_ms = now_ms.saturating_add(duration_millis(lease));
        let new = Token::random();
        let updated = s
            .client
            .update_item()
            .table_name(&s.table)
            .key(PK, pk(key))
            .update_expression(TAKE_UNCERTAIN)
            .condition_expression(UNCERTAIN_LAPSED)
            .expression_attribute_values(":token", item::token(token))
            .expression_attribute_values(":in_progress", AttributeValue::N(IN_PROGRESS.to_owned()))
            .expression_attribute_values(":cutoff", s.cutoff(now_ms))
            .expression_attribute_values(":new", item::token(new))
            .expression_attribute_values(":expires", number(expires_ms))
            .expression_attribute_values(":ttl", lapsed_ttl(expires_ms, s.margin_ms))
            .send()
            .await;
        match updated {
            Ok(_) => Ok(Claim::new(*key, new)),
            Err(SdkError::ServiceError(ctx))
                if ctx.err().is_conditional_check_failed_exception() =>
            {
                Err(Error::NotUncertain { operation: *key })
            }
            Err(e) => Err(s.error("UpdateItem", e)),
        }
    }

    async fn find_uncertain(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<UncertainOperation>, Error> {
        self.uncertain_page(query).await
    }

    async fn find_abandoned(&self, query: AbandonedQuery<'_>) -> Result<Vec<Abandoned>, Error> {
        self.inner.find_abandoned(query).await
    }

    async fn begin_steps(&self, claim: &Claim, retention: Duration) -> Result<StepLog, Error> {
        check_duration("retention", retention)?;
        self.inner
            .begin_steps(claim, duration_millis(retention))
            .await
    }

    async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
        self.write_step_with(claim, step, Vec::new()).await
    }

    /// Ended records and ended steps items alike (both carry `expires_ms`), and the responses
    /// of tombstones whose retention ended (each counted).
    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        let s = &*self.inner;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if limit == 0 {
            return Ok(0);
        }
        let budget = limit
            .saturating_mul(PRUNE_EXAMINE_PER_LIMIT)
            .max(PRUNE_EXAMINE_MIN);
        let now_ms = s.now_ms();
        let values = expired_values(s.margin_ms, now_ms);
        let strip_values = strip_values(s.margin_ms, now_ms);
        let mut scan_values = values.clone();
        scan_values.extend(strip_values.clone());
        scan_values.remove(":tombstone");
        let filter = format!("({EXPIRED}) OR ({TO_STRIP})");
        let cutoff = now_ms.saturating_sub(s.margin_ms);
        let mut start = s
            .prune_cursor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let mut examined = 0usize;
        let mut expired: Vec<HashMap<String, AttributeValue>> = Vec::new();
        // Where the next call goes on: the start of the page this one stopped in, or after the
        // last page it finished, or (at the end of the table) the beginning.
        let mut resume = None;
        loop {
            let page = s
                .client
                .scan()
                .table_name(&s.table)
                .filter_expression(&filter)
                .projection_expression(format!("{PK}, {EXPIRES}"))
                .set_expression_attribute_values(Some(scan_values.clone()))
                .consistent_read(true)
                .limit(PRUNE_PAGE)
                .set_exclusive_start_key(start.clone())
                .send()
                .await
                .map_err(|e| s.error("Scan", e))?;
            examined += usize::try_from(page.scanned_count).unwrap_or(0);
            let found = page.items.unwrap_or_default();
            let room = limit - expired.len();
            if found.len() > room {
                expired.extend(found.into_iter().take(room));
                resume = start;
                break;
            }
            expired.extend(found);
            match page.last_evaluated_key {
                Some(next) if expired.len() < limit && examined < budget => start = Some(next),
                Some(next) => {
                    resume = Some(next);
                    break;
                }
                None => break,
            }
        }
        *s.prune_cursor
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = resume;
        let mut deleted = 0;
        for mut found in expired {
            // An item that ended goes; one found only by its retention's end is stripped.
            let ended = match found.remove(EXPIRES) {
                Some(AttributeValue::N(n)) => n.parse::<i64>().is_ok_and(|e| e <= cutoff),
                _ => true,
            };
            let key = Some(found);
            let outcome = if ended {
                s.client
                    .delete_item()
                    .table_name(&s.table)
                    .set_key(key)
                    .condition_expression(EXPIRED)
                    .set_expression_attribute_values(Some(values.clone()))
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| match e {
                        SdkError::ServiceError(ctx)
                            if ctx.err().is_conditional_check_failed_exception() =>
                        {
                            None
                        }
                        e => Some(s.error("DeleteItem", e)),
                    })
            } else {
                s.client
                    .update_item()
                    .table_name(&s.table)
                    .set_key(key)
                    .update_expression(STRIP)
                    .condition_expression(TO_STRIP)
                    .set_expression_attribute_values(Some(strip_values.clone()))
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| match e {
                        SdkError::ServiceError(ctx)
                            if ctx.err().is_conditional_check_failed_exception() =>
                        {
                            None
                        }
                        e => Some(s.error("UpdateItem", e)),
                    })
            };
            match outcome {
                Ok(()) => deleted += 1,
                // Claimed again, renewed or stripped since the scan: it stays as it is.
                Err(None) => {}
                Err(Some(e)) => return Err(e),
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest response the store takes makes an item of exactly 400 KB, by the store's
    /// own (slightly over-) count, and the docs give its figure.
    #[test]
    fn the_largest_response_fills_an_item() {
        let most = item::max_response_bytes();
        assert_eq!(item::completed_size(most), item::MAX_ITEM_BYTES);
        assert_eq!(most, 399_730);
    }

    #[test]
    fn remaining_never_goes_negative() {
        assert_eq!(remaining(10, 20), Duration::ZERO);
        assert_eq!(remaining(1_500, 500), Duration::from_secs(1));
    }
}
