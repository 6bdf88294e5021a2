//! The steps of an operation on DynamoDB (docs/steps.md), and [`DynamoSteps`], the atomic step
//! that commits a caller's writes with its record. The store keeps one item per operation
//! beside its record, under the partition key `<key hex>:steps`, holding `attempt_n` (the
//! attempts counted), `token_b` (the claim counted last), `expires_ms`/`ttl_s` (the retention
//! from the last write) and per step `p:<name>` (its position) and, once finished, `f:<name>`
//! (its result). Every write is a `TransactWriteItems` of a `ConditionCheck` that the record is
//! in progress under the claim's token and the `Update` of the steps item, so a claim that was
//! taken over writes nothing. A step write with `on_lapse` changes the record instead of only
//! checking it: an `Update` under the same condition that sets or removes its `uncertain` flag
//! (and its `ttl_s` with it), in the same transaction.

use std::collections::HashMap;
use std::future::Future;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Put, TransactWriteItem, Update};

use idem_core::adapter::{atomic_step, StepsOf};
use idem_core::{
    Claim, Codec, Error, Key, OnLapse, StepLog, StepRecord, StepState, StepWrite, Steps,
    StoreError, StoreErrorKind,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::item::{
    number, pk, token, ttl_seconds, State, EXPIRES, IN_PROGRESS, LAPSE_TTL, PK, TOKEN, TTL,
    UNCERTAIN,
};
use crate::store::{DynamoStore, Inner, OWNED_IN_PROGRESS};

/// The attempts counted.
const ATTEMPT: &str = "attempt_n";

/// The partition key of `key`'s steps item: the record's, with `:steps` (a record's is 64 hex
/// digits, so the two never meet).
pub(crate) fn steps_pk(key: &Key) -> AttributeValue {
    AttributeValue::S(format!("{key}:steps"))
}

/// A request that could not be built (a required part missing): a `Query` store error.
pub(crate) fn build_error(e: aws_sdk_dynamodb::error::BuildError) -> Error {
    Error::Store(StoreError::new(
        StoreErrorKind::Query,
        format!("DynamoDB TransactWriteItems could not be built: {e}"),
    ))
}

impl Inner {
    /// [`Store::begin_steps`](idem_core::Store::begin_steps): a consistent read of the steps item,
    /// then the fenced count of this attempt and the new retention (2 requests).
    pub(crate) async fn begin_steps(
        &self,
        claim: &Claim,
        retention_ms: i64,
    ) -> Result<StepLog, Error> {
        let key = claim.key();
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, steps_pk(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.error("GetItem", e))?;
        let now_ms = self.now_ms();
        let attrs = out
            .item
            .filter(|attrs| match attrs.get(EXPIRES) {
                Some(AttributeValue::N(n)) => n.parse::<i64>().is_ok_and(|e| e > now_ms),
                _ => false,
            })
            .unwrap_or_default();
        let counted = match (attrs.get(ATTEMPT), attrs.get(TOKEN)) {
            (Some(AttributeValue::N(n)), Some(AttributeValue::B(t))) => {
                let n = n
                    .parse::<u32>()
                    .map_err(|_| corrupt(key, format!("its attempts are `{n}`")))?;
                Some((n, t.as_ref() == claim.token().to_bytes()))
            }
            _ => None,
        };
        let attempt = match counted {
            Some((n, true)) => n,
            Some((n, false)) => n.saturating_add(1),
            None => 1,
        };
        let mut steps = steps_of(key, &attrs)?;
        steps.sort_by_key(|s| s.position);
        // The whole item is written again: an ended one's steps must not come back, and only
        // this claim writes steps while it holds the record.
        let expires_ms = now_ms.saturating_add(retention_ms);
        let mut item = attrs;
        item.insert(PK.to_owned(), steps_pk(key));
        item.insert(ATTEMPT.to_owned(), number(i64::from(attempt)));
        item.insert(TOKEN.to_owned(), token(claim.token()));
        item.insert(EXPIRES.to_owned(), number(expires_ms));
        item.insert(TTL.to_owned(), ttl_seconds(expires_ms, self.margin_ms));
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .build()
            .map_err(build_error)?;
        self.fenced_steps_writes(
            claim,
            None,
            vec![TransactWriteItem::builder().put(put).build()],
        )
        .await?;
        Ok(StepLog { attempt, steps })
    }

    /// [`Store::write_step`](idem_core::Store::write_step): one fenced transaction; a finished
    /// step keeps its first result (`if_not_exists`). The caller's `items` (none for
    /// `write_step`, the effect of [`Steps::dynamo_tx`](crate::DynamoSteps::dynamo_tx)) commit in the
    /// same transaction, and only while the step has not finished: the same transaction sent
    /// again (the SDK retries one whose answer was lost: a timeout, a 5xx) writes nothing and
    /// is answered as done, where a server that ignores its `ClientRequestToken` (moto; DynamoDB
    /// itself keeps a token 10 minutes) would apply the items twice.
    pub(crate) async fn write_step(
        &self,
        claim: &Claim,
        step: StepWrite<'_>,
        retention_ms: i64,
        items: Vec<TransactWriteItem>,
    ) -> Result<(), Error> {
        let now_ms = self.now_ms();
        let update = self
            .steps_update(claim, retention_ms, now_ms)
            .expression_attribute_names("#p", format!("p:{}", step.name))
            .expression_attribute_values(":position", number(i64::from(step.position)));
        let update = match step.result {
            Some(result) => update
                .update_expression(format!(
                    "SET #p = :position, #f = if_not_exists(#f, :result), \
                     {EXPIRES} = :expires, {TTL} = :ttl"
                ))
                .expression_attribute_names("#f", format!("f:{}", step.name))
                .expression_attribute_values(
                    ":result",
                    AttributeValue::B(Blob::new(result.to_vec())),
                ),
            None => update.update_expression(format!(
                "SET #p = :position, {EXPIRES} = :expires, {TTL} = :ttl"
            )),
        };
        let update = match (step.result, items.is_empty()) {
            (Some(_), false) => update.condition_expression("attribute_not_exists(#f)"),
            _ => update,
        };
        let update = update.build().map_err(build_error)?;
        let mut writes = vec![TransactWriteItem::builder().update(update).build()];
        writes.extend(items);
        self.fenced_steps_writes(claim, step.on_lapse, writes).await
    }

    /// The update of `claim`'s steps item, with its new retention (`:expires`, `:ttl`).
    fn steps_update(
        &self,
        claim: &Claim,
        retention_ms: i64,
        now_ms: i64,
    ) -> aws_sdk_dynamodb::types::builders::UpdateBuilder {
        let expires_ms = now_ms.saturating_add(retention_ms);
        Update::builder()
            .table_name(&self.table)
            .key(PK, steps_pk(claim.key()))
            .expression_attribute_values(":expires", number(expires_ms))
            .expression_attribute_values(":ttl", ttl_seconds(expires_ms, self.margin_ms))
    }

    /// Runs `writes` (the steps item's first, then a caller's) in one transaction with the check
    /// that `claim` still holds its record: a `ConditionCheck`, or with `on_lapse` an `Update` of
    /// the record under the same condition that sets what it becomes on lapse. A cancelled
    /// transaction whose record is no longer ours is `LeaseLost`; one cancelled for another
    /// reason (a conflicting transaction) is a passing store error. A caller's write whose own
    /// condition failed cancels the whole transaction and is a [`StoreErrorKind::Query`] error
    /// naming it.
    async fn fenced_steps_writes(
        &self,
        claim: &Claim,
        on_lapse: Option<OnLapse>,
        writes: Vec<TransactWriteItem>,
    ) -> Result<(), Error> {
        let fence = match on_lapse {
            None => TransactWriteItem::builder()
                .condition_check(
                    ConditionCheck::builder()
                        .table_name(&self.table)
                        .key(PK, pk(claim.key()))
                        .condition_expression(OWNED_IN_PROGRESS)
                        .expression_attribute_values(":token", token(claim.token()))
                        .expression_attribute_values(
                            ":in_progress",
                            AttributeValue::N(IN_PROGRESS.to_owned()),
                        )
                        .build()
                        .map_err(build_error)?,
                )
                .build(),
            Some(on_lapse) => {
                let update = Update::builder()
                    .table_name(&self.table)
                    .key(PK, pk(claim.key()))
                    .condition_expression(OWNED_IN_PROGRESS)
                    .expression_attribute_values(":token", token(claim.token()))
                    .expression_attribute_values(
                        ":in_progress",
                        AttributeValue::N(IN_PROGRESS.to_owned()),
                    );
                let update = match on_lapse {
                    // `ttl_s` not a number: DynamoDB's TTL leaves the claim alone.
                    OnLapse::Uncertain => update
                        .update_expression(format!("SET {UNCERTAIN} = :yes, {TTL} = :yes"))
                        .expression_attribute_values(":yes", AttributeValue::Bool(true)),
                    // The lease's own TTL again, which every renewal keeps in `lapse_ttl_s`.
                    _ => update
                        .update_expression(format!("SET {TTL} = {LAPSE_TTL} REMOVE {UNCERTAIN}")),
                };
                TransactWriteItem::builder()
                    .update(update.build().map_err(build_error)?)
                    .build()
            }
        };
        let mut items = vec![fence];
        items.extend(writes);
        let sent = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(SdkError::ServiceError(ctx)) if ctx.err().is_transaction_canceled_exception() => {
                // The fence is item 0, the steps item 1, the caller's from 2 on.
                let reasons = match ctx.err() {
                    TransactWriteItemsError::TransactionCanceledException(e) => {
                        e.cancellation_reasons()
                    }
                    _ => &[],
                };
                let code = |i: usize| reasons.get(i).and_then(|r| r.code());
                if code(0) != Some("ConditionalCheckFailed")
                    && code(1) == Some("ConditionalCheckFailed")
                {
                    // The claim holds and the step has finished with its effect: this same
                    // transaction committed before (the engine runs a step once per claim, and
                    // a claim taken over would have failed the fence), so its items stand and
                    // were not written again.
                    return Ok(());
                }
                let callers = |code: &str| {
                    reasons
                        .iter()
                        .enumerate()
                        .skip(2)
                        .find(|(_, r)| r.code() == Some(code))
                        .map(|(i, _)| i - 2)
                };
                if let Some(i) = callers("ConditionalCheckFailed") {
                    return Err(Error::Store(StoreError::new(
                        StoreErrorKind::Query,
                        format!(
                            "DynamoDB TransactWriteItems of a step was cancelled: the condition \
                             of the step's write {i} (counted from 0) failed; nothing was written"
                        ),
                    )));
                }
                // A table with a local secondary index (an outbox's shard) holds at most 10 GB
                // per partition key value.
                if let Some(i) = callers("ItemCollectionSizeLimitExceeded") {
                    return Err(Error::Store(StoreError::new(
                        StoreErrorKind::Full,
                        format!(
                            "DynamoDB TransactWriteItems of a step was cancelled: the step's \
                             write {i} (counted from 0) would grow its item collection past \
                             10 GB; nothing was written. Delete or prune items under its \
                             partition key (an outbox: prune sent messages sooner, or use a \
                             table with more shards)"
                        ),
                    )));
                }
                match self.read(claim.key()).await? {
                    Some(item)
                        if item.token == claim.token()
                            && matches!(item.state, State::InProgress { .. }) =>
                    {
                        Err(Error::Store(StoreError::new(
                            StoreErrorKind::Transient,
                            "DynamoDB TransactWriteItems of a step was cancelled by a \
                             conflicting request; retry",
                        )))
                    }
                    _ => Err(Error::LeaseLost),
                }
            }
            Err(e) => Err(self.error("TransactWriteItems", e)),
        }
    }

    /// Deletes `key`'s steps item.
    pub(crate) async fn evict_steps(&self, key: &Key) -> Result<(), Error> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key(PK, steps_pk(key))
            .send()
            .await
            .map_err(|e| self.error("DeleteItem", e))?;
        Ok(())
    }
}

/// The steps a steps item holds.
fn steps_of(key: &Key, attrs: &HashMap<String, AttributeValue>) -> Result<Vec<StepRecord>, Error> {
    let mut steps = Vec::new();
    for (name, value) in attrs {
        let Some(step) = name.strip_prefix("p:") else {
            continue;
        };
        let position = match value {
            AttributeValue::N(n) => n.parse::<u32>().ok(),
            _ => None,
        }
        .ok_or_else(|| corrupt(key, format!("step {step:?} has position {value:?}")))?;
        let state = match attrs.get(&format!("f:{step}")) {
            Some(AttributeValue::B(result)) => StepState::Finished(result.as_ref().to_vec()),
            None => StepState::Begun,
            Some(other) => return Err(corrupt(key, format!("step {step:?} has result {other:?}"))),
        };
        steps.push(StepRecord {
            name: step.to_owned(),
            position,
            state,
        });
    }
    Ok(steps)
}

fn corrupt(key: &Key, what: String) -> Error {
    crate::item::corrupt(key, format_args!("its steps item is damaged: {what}"))
}

/// The most writes of a caller one [`DynamoSteps::dynamo_tx`] commits: DynamoDB's 100 actions
/// per `TransactWriteItems`, less the claim's fence and the steps item.
///
/// ```
/// assert_eq!(idem::MAX_DYNAMO_STEP_WRITES, 98);
/// ```
pub const MAX_DYNAMO_STEP_WRITES: usize = 98;

impl<C: Codec> DynamoSteps for Steps<C> {}

mod sealed {
    /// Keeps the extension to [`Steps`](idem_core::Steps) alone.
    pub trait Sealed {}

    impl<C> Sealed for idem_core::Steps<C> {}
}

/// DynamoDB's atomic step on [`Steps`]: [`dynamo_tx`](Self::dynamo_tx), which commits a step's
/// writes and its record in one `TransactWriteItems`. Bring it into scope to call it
/// (`use idem::DynamoSteps;`); it is implemented for [`Steps`] only.
///
/// An extension trait because the method shows aws-sdk-dynamodb's types, which idem-core's
/// `Steps` must not (a new version of the SDK changes this crate only); named for what it
/// extends, after the store, so that it sits beside the SQL stores' own extension of `Steps`
/// in one `use idem::…` line without a clash (docs/steps.md, "On DynamoDB").
pub trait DynamoSteps: sealed::Sealed + StepsOf {
    /// Runs the step `name` as an atomic phase on DynamoDB: `work` runs (outside any
    /// transaction: it may be slow) and returns the step's value and the writes that are its
    /// effect (`Put`, `Update`, `Delete` or `ConditionCheck` items, on any tables, at most
    /// [`MAX_DYNAMO_STEP_WRITES`]); those writes and the step's record then commit in **one**
    /// `TransactWriteItems`, with the check that the operation's claim still holds its record.
    /// So the effect is applied once: a process killed before the commit left nothing (the
    /// retry runs `work` again), one killed after it left a finished step that the retry
    /// replays without running `work` or writing anything. One round trip.
    ///
    /// `store` is the store the engine runs on. Errors: `work`'s; [`Error::LeaseLost`] when the
    /// operation was taken over (nothing was written); a [`StoreErrorKind::Query`] store error
    /// when one of the writes' own conditions failed (nothing was written) or there are too
    /// many; otherwise as [`Step::run`](idem_core::Step::run)'s. Without a key the writes
    /// commit alone, in one transaction.
    ///
    /// ```no_run
    /// use idem::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    /// use idem::{DynamoSteps, DynamoStore, Error, Idempotency, Key};
    /// # async fn doc(store: DynamoStore) -> Result<(), Error> {
    /// let engine = Idempotency::new(store.clone());
    /// let key = Key::derive("orders", "", "order-1")?;
    /// let store = &store;
    /// engine.call(key).run_steps(|steps| async move {
    ///     steps.dynamo_tx(store, "charge", || async {
    ///         let put = Put::builder()
    ///             .table_name("charges")
    ///             .item("pk", AttributeValue::S("order-1".into()))
    ///             .item("cents", AttributeValue::N("4200".into()))
    ///             .build()
    ///             .map_err(|e| Error::InvalidConfig(e.to_string()))?;
    ///         Ok::<_, Error>((4200u64, vec![TransactWriteItem::builder().put(put).build()]))
    ///     }).await
    /// }).await?;
    /// # Ok(()) }
    /// ```
    // An `async fn` in a public trait cannot promise its future is `Send` to generic callers;
    // this trait is sealed and implemented for `Steps<C>` only, and a call on a `Steps` (the
    // only kind there is) sees the provided method's future, which is `Send` when its parts are.
    #[allow(async_fn_in_trait)]
    async fn dynamo_tx<T, E, F, Fut>(
        &self,
        store: &DynamoStore,
        name: &str,
        work: F,
    ) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, Vec<TransactWriteItem>), E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        atomic_step(self.steps(), name, |step| async move {
            let (value, writes) = work().await?;
            if writes.len() > MAX_DYNAMO_STEP_WRITES {
                return Err(Error::Store(StoreError::new(
                    StoreErrorKind::Query,
                    format!(
                        "the step {name:?} has {} writes; one DynamoDB transaction carries at \
                         most {MAX_DYNAMO_STEP_WRITES} besides the step's record",
                        writes.len()
                    ),
                ))
                .into());
            }
            let bytes = step.encode(&value)?;
            match step.claim() {
                Some(claim) => {
                    store
                        .write_step_with(claim, step.finished(&bytes), writes)
                        .await?
                }
                None if writes.is_empty() => {}
                None => store
                    .client()
                    .transact_write_items()
                    .set_transact_items(Some(writes))
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        Error::Store(StoreError::new(
                            StoreErrorKind::Query,
                            format!(
                                "DynamoDB TransactWriteItems of the step {name:?} failed: {}",
                                aws_sdk_dynamodb::error::DisplayErrorContext(e)
                            ),
                        ))
                    })?,
            }
            Ok(value)
        })
        .await
    }
}
