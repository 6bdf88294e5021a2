//! DynamoStore against the raw aws-sdk-dynamodb client sending the same requests by hand, on the
//! same client and endpoint, in one run: a new key is the same conditional `PutItem` plus the
//! same fenced `UpdateItem`; a replay and a duplicate are the same conditional `PutItem` whose
//! failed condition returns the old item (`ALL_OLD`).
//!
//! The server is whatever `--dynamodb-url` names: under `scripts/bench`, moto on loopback, which
//! answers one request at a time in Python. Against it the ratios measure idem's client-side cost
//! next to a slow server, not DynamoDB's latency; see the report's note.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use idem::aws_sdk_dynamodb::operation::put_item::PutItemError;
use idem::aws_sdk_dynamodb::primitives::Blob;
use idem::aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use idem::aws_sdk_dynamodb::Client;
use idem::{DynamoStore, Idempotency};

use crate::cpu::Cpu;
use crate::harness::Hit;
use crate::raw::Raw;
use crate::report::Row;
use crate::workload::{hex, work, Receipt, Subject, LEASE, RETENTION};
use crate::{run_subject, Baselines, BenchError, Plan};

/// The baselines of these rows, the storm at 1, 8 and 32 tasks.
const BASELINES: Baselines = Baselines {
    fresh: "raw PutItem+UpdateItem",
    replay: "raw PutItem (ALL_OLD)",
    storm_concurrency: &[1, 8, 32],
    max_replay_keys: REPLAY_KEYS,
    // moto serves 60-70 fresh calls a second, so 10 slices of 0.3 s hold about 200 calls per
    // variant, and one of its pauses (up to a second) moves a ratio by 10 %: three times the
    // slices.
    rounds_factor: 3,
};
/// Keys completed ahead of the replay rows: every seeded key costs four requests (idem's and the
/// baseline's claim and completion), and the emulator answers a few hundred per second.
const REPLAY_KEYS: usize = 1_000;

const CLAIM: &str = "attribute_not_exists(pk) OR expires_ms <= :cutoff";
const OWNED: &str = "token_b = :token AND state_n = :in_progress";
const COMPLETE: &str =
    "SET state_n = :completed, expires_ms = :expires, ttl_s = :ttl, is_error = :is_error, response_b = :response";

/// The hand-written requests, on a table of the store's own layout.
#[derive(Clone)]
pub struct RawDynamo {
    client: Client,
    table: String,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn failed<E: std::error::Error + 'static>(e: SdkError<E, impl std::fmt::Debug>) -> BenchError {
    BenchError::Dynamo(DisplayErrorContext(e).to_string())
}

/// What the claim found.
enum Claimed {
    Won,
    Old(HashMap<String, AttributeValue>),
}

impl RawDynamo {
    /// The conditional claim, returning the old item when the key is live.
    async fn claim(&self, key: &[u8; 32], token: &[u8; 16]) -> Result<Claimed, BenchError> {
        let now = now_ms();
        let expires = now + ms(LEASE);
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", AttributeValue::S(hex(key)))
            .item("token_b", AttributeValue::B(Blob::new(token.to_vec())))
            .item("state_n", n(0))
            .item("expires_ms", n(expires))
            .item("ttl_s", n(expires / 1000 + 2))
            .condition_expression(CLAIM)
            .expression_attribute_values(":cutoff", n(now - 1000))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(Claimed::Won),
            Err(SdkError::ServiceError(ctx))
                if ctx.err().is_conditional_check_failed_exception() =>
            {
                match ctx.into_err() {
                    PutItemError::ConditionalCheckFailedException(e) => {
                        Ok(Claimed::Old(e.item.unwrap_or_default()))
                    }
                    other => Err(BenchError::Dynamo(other.to_string())),
                }
            }
            Err(e) => Err(failed(e)),
        }
    }

    async fn complete(
        &self,
        key: &[u8; 32],
        token: &[u8; 16],
        seed: u64,
    ) -> Result<(), BenchError> {
        let response = serde_json::to_vec(&work(seed))?;
        let expires = now_ms() + ms(RETENTION);
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(hex(key)))
            .update_expression(COMPLETE)
            .condition_expression(OWNED)
            .expression_attribute_values(":token", AttributeValue::B(Blob::new(token.to_vec())))
            .expression_attribute_values(":in_progress", n(0))
            .expression_attribute_values(":completed", n(1))
            .expression_attribute_values(":expires", n(expires))
            .expression_attribute_values(":ttl", n(expires / 1000 + 2))
            .expression_attribute_values(":is_error", AttributeValue::Bool(false))
            .expression_attribute_values(":response", AttributeValue::B(Blob::new(response)))
            .send()
            .await
            .map_err(failed)?;
        Ok(())
    }

    /// The stored result in an old item, decoded; `None` while in progress.
    fn replayed(old: &HashMap<String, AttributeValue>) -> Result<Option<Hit>, BenchError> {
        match (old.get("state_n"), old.get("response_b")) {
            (Some(AttributeValue::N(s)), Some(AttributeValue::B(b))) if s == "1" => {
                let _: Receipt = serde_json::from_slice(b.as_ref())?;
                Ok(Some(Hit::Replayed))
            }
            _ => Ok(None),
        }
    }

    /// Claim, trivial work, complete: two requests.
    pub async fn fresh(&self, key: &[u8; 32], seed: u64) -> Result<Hit, BenchError> {
        let token: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        match self.claim(key, &token).await? {
            Claimed::Won => {
                self.complete(key, &token, seed).await?;
                Ok(Hit::Fresh)
            }
            Claimed::Old(_) => Err(BenchError::Unexpected(
                "raw PutItem found the key taken".into(),
            )),
        }
    }

    /// The claim of a completed key: one request, the result decoded from the old item.
    pub async fn replay(&self, key: &[u8; 32]) -> Result<Hit, BenchError> {
        let token: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        match self.claim(key, &token).await? {
            Claimed::Old(old) => Self::replayed(&old)?
                .ok_or_else(|| BenchError::Unexpected("raw replay found no stored result".into())),
            Claimed::Won => Err(BenchError::Unexpected("a raw replay took a new key".into())),
        }
    }

    /// Claim; on a new key run and complete, otherwise read the old item.
    pub async fn storm(&self, key: &[u8; 32], seed: u64) -> Result<Hit, BenchError> {
        let token: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        match self.claim(key, &token).await? {
            Claimed::Won => {
                self.complete(key, &token, seed).await?;
                Ok(Hit::Fresh)
            }
            Claimed::Old(old) => Ok(Self::replayed(&old)?.unwrap_or(Hit::Locked)),
        }
    }
}

/// The DynamoDB rows: fresh, replay and storm at 1, 8 and 32 tasks, idem and the baseline
/// interleaved.
pub async fn run(
    endpoint: &str,
    plan: &Plan,
    rows: &mut Vec<Row>,
    versions: &mut Vec<String>,
) -> Result<(), BenchError> {
    versions.push(format!("DynamoDB API at {endpoint}"));
    on_tables(endpoint, |engine, raw| async move {
        let subject = Subject::new("DynamoDB", Cpu::default(), engine, Some(raw));
        run_subject(subject, plan, rows, &BASELINES).await
    })
    .await
}

/// The consumer row on DynamoDB (`--consumer`): the batch API on a `DynamoStore` against the
/// same messages through the hand-written conditional writes above.
pub async fn consumer_row(
    endpoint: &str,
    messages: usize,
    rounds: usize,
) -> Result<crate::consumer::ConsumerRow, BenchError> {
    on_tables(endpoint, |engine, raw| async move {
        crate::consumer::run("DynamoDB", engine, &raw, messages, rounds).await
    })
    .await
}

/// Runs `rows` on an engine over a `DynamoStore` and on the hand-written requests, each on a
/// new table of its own, and deletes both tables at the end, whatever `rows` returned.
async fn on_tables<T, F, Fut>(endpoint: &str, rows: F) -> Result<T, BenchError>
where
    F: FnOnce(Idempotency, Raw) -> Fut,
    Fut: std::future::Future<Output = Result<T, BenchError>>,
{
    let client = DynamoStore::client_from_env(endpoint)?;
    let tag = format!("{:08x}", fastrand::u32(..));
    let (idem_table, raw_table) = (format!("bench_idem_{tag}"), format!("bench_raw_{tag}"));
    let outcome = async {
        let store = DynamoStore::builder()
            .table(&idem_table)
            .create_table_if_missing(true)
            .build(client.clone())
            .await?;
        DynamoStore::create_table(&client, &raw_table).await?;
        let raw = Raw::Dynamo(RawDynamo {
            client: client.clone(),
            table: raw_table.clone(),
        });
        rows(Idempotency::new(store), raw).await
    }
    .await;
    for t in [&idem_table, &raw_table] {
        let _ = client.delete_table().table_name(t.as_str()).send().await;
    }
    outcome
}
