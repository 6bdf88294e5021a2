//! DynamoDB failures as [`StoreError`]s, classified by the SDK's error variant and DynamoDB's
//! error code (never by message text). Condition-check failures never come here: they are the
//! protocol, and each call decides them itself.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

use idem_core::{Error, StoreError, StoreErrorKind};

/// The codes DynamoDB answers when a request may succeed if sent again later.
const TRANSIENT_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TransactionConflictException",
    "LimitExceededException",
    "InternalServerError",
    "ServiceUnavailable",
];

/// The kind of a failed request: see [`DynamoStore`](crate::DynamoStore#errors).
pub(crate) fn kind_of<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> StoreErrorKind {
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreErrorKind::Unavailable
        }
        SdkError::ServiceError(ctx) => {
            let code = ctx.err().code().unwrap_or_default();
            // An item collection (the items of one partition key value of a table with a local
            // secondary index, such as the outbox's shards) reached DynamoDB's 10 GB.
            if code == "ItemCollectionSizeLimitExceededException" {
                return StoreErrorKind::Full;
            }
            if TRANSIENT_CODES.contains(&code) || ctx.raw().status().is_server_error() {
                StoreErrorKind::Transient
            } else {
                StoreErrorKind::Query
            }
        }
        _ => StoreErrorKind::Query,
    }
}

/// How the store's table is created: what a missing table's error tells to do.
pub(crate) const CREATE_STORE_TABLE: &str =
    "DynamoStore::create_table or the builder's create_table_if_missing(true)";

/// `e`, from the request `op` on `table`, as an [`Error::Store`]. A missing table is named,
/// with how to create it (`create_with`: the store's or the outbox's helpers).
pub(crate) fn table_error<E>(
    op: &'static str,
    table: &str,
    create_with: &str,
    e: SdkError<E, HttpResponse>,
) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let kind = kind_of(&e);
    if let SdkError::ServiceError(ctx) = &e
        && ctx.err().code() == Some("ResourceNotFoundException")
    {
        return Error::Store(StoreError::new(
            kind,
            format!(
                "DynamoDB {op} failed: the table `{table}` does not exist (or is not ACTIVE) \
                     in this region and endpoint; create it with {create_with}"
            ),
        ));
    }
    Error::Store(StoreError::new(kind, DynamoError { op, source: e }))
}

/// The SDK's error with the request it failed.
#[derive(Debug, thiserror::Error)]
#[error("DynamoDB {op} failed: {}", aws_sdk_dynamodb::error::DisplayErrorContext(&self.source))]
struct DynamoError<E: std::error::Error + 'static> {
    op: &'static str,
    #[source]
    source: SdkError<E, HttpResponse>,
}
