//! The table: its name's rules, the check that it has the store's key, and its creation.

use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::create_table::{CreateTableError, CreateTableOutput};
use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};
use aws_sdk_dynamodb::Client;

use idem_core::{Error, StoreError, StoreErrorKind};

use crate::errors::{table_error, CREATE_STORE_TABLE};
use crate::item::{PK, TTL};

/// How long [`create`] waits for a new table to become `ACTIVE`.
const ACTIVE_WITHIN: Duration = Duration::from_secs(120);

/// DynamoDB's rules for a table name: 3 to 255 characters of `a-z A-Z 0-9 _ - .`.
pub(crate) fn validate_name(name: &str) -> Result<(), Error> {
    let ok_len = (3..=255).contains(&name.len());
    let bad = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')));
    if ok_len && bad.is_none() {
        return Ok(());
    }
    let why = match bad {
        Some(c) => format!("it contains {c:?}"),
        None => format!("it is {} characters long", name.len()),
    };
    Err(Error::InvalidConfig(format!(
        "DynamoDB table name {name:?} is not valid ({why}): use 3 to 255 characters of a-z, A-Z, \
         0-9, '_', '-' and '.'"
    )))
}

/// `table`'s description (`DescribeTable`); a missing table's error says to create it with
/// `create_with`.
pub(crate) async fn describe(
    client: &Client,
    table: &str,
    create_with: &str,
) -> Result<DescribeTableOutput, Error> {
    client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|e| table_error("DescribeTable", table, create_with, e))
}

/// Checks that `table` exists and that its only key is the string hash key `pk`.
pub(crate) async fn check(client: &Client, table: &str) -> Result<(), Error> {
    let out = describe(client, table, CREATE_STORE_TABLE).await?;
    let keys = out.table().map(|t| t.key_schema()).unwrap_or_default();
    match keys {
        [k] if k.attribute_name() == PK && *k.key_type() == KeyType::Hash => Ok(()),
        _ => Err(Error::InvalidConfig(format!(
            "DynamoDB table `{table}` does not have the key DynamoStore needs (only a string \
             hash key named `{PK}`); create one with DynamoStore::create_table"
        ))),
    }
}

/// Creates `table` (on-demand billing, string hash key `pk`) unless it exists, waits until it
/// is `ACTIVE`, and enables TTL on `ttl_s` where the server supports it.
pub(crate) async fn create(client: &Client, table: &str) -> Result<(), Error> {
    validate_name(table)?;
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(PK)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| Error::InvalidConfig(e.to_string()))?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(PK)
                .key_type(KeyType::Hash)
                .build()
                .map_err(|e| Error::InvalidConfig(e.to_string()))?,
        )
        .send()
        .await;
    finish_create(client, table, created, CREATE_STORE_TABLE).await?;
    check(client, table).await?;
    enable_ttl(client, table).await
}

/// Finishes a `CreateTable` of `table`: a table that exists already (another node created it
/// first) will do; then waits until it is `ACTIVE`. `create_with` is what a missing table's
/// error tells to do.
pub(crate) async fn finish_create(
    client: &Client,
    table: &str,
    created: Result<CreateTableOutput, SdkError<CreateTableError, HttpResponse>>,
    create_with: &str,
) -> Result<(), Error> {
    match created {
        Ok(_) => {}
        Err(SdkError::ServiceError(ctx)) if ctx.err().is_resource_in_use_exception() => {}
        Err(e) => return Err(table_error("CreateTable", table, create_with, e)),
    }
    wait_active(client, table, create_with).await
}

/// Waits (two minutes at most) until `table` is `ACTIVE`.
async fn wait_active(client: &Client, table: &str, create_with: &str) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + ACTIVE_WITHIN;
    let mut pause = Duration::from_millis(50);
    loop {
        let out = describe(client, table, create_with).await?;
        if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            return Ok(());
        }
        if tokio::time::Instant::now() + pause > deadline {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("DynamoDB table `{table}` did not become ACTIVE within {ACTIVE_WITHIN:?}"),
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Enables TTL on `ttl_s`. A server without TTL (some emulators) only gets a warning: the store
/// judges expiry from the item's own times and `prune_expired` deletes expired items anyway.
async fn enable_ttl(client: &Client, table: &str) -> Result<(), Error> {
    let described = client
        .describe_time_to_live()
        .table_name(table)
        .send()
        .await;
    let current = match described {
        Ok(out) => out.time_to_live_description,
        Err(SdkError::ServiceError(ctx)) if !is_missing_table(ctx.err().code()) => {
            tracing::warn!(table, code = ?ctx.err().code(), "the server does not describe TTL; leaving it to prune_expired");
            return Ok(());
        }
        Err(e) => {
            return Err(table_error(
                "DescribeTimeToLive",
                table,
                CREATE_STORE_TABLE,
                e,
            ))
        }
    };
    let status = current.as_ref().and_then(|d| d.time_to_live_status());
    let attribute = current.as_ref().and_then(|d| d.attribute_name());
    match status {
        Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling) if attribute == Some(TTL) => {
            return Ok(())
        }
        Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling) => {
            tracing::warn!(table, attribute, "TTL is enabled on another attribute; DynamoDB will not delete idem's items by itself (prune_expired still does)");
            return Ok(());
        }
        _ => {}
    }
    let spec = TimeToLiveSpecification::builder()
        .enabled(true)
        .attribute_name(TTL)
        .build()
        .map_err(|e| Error::InvalidConfig(e.to_string()))?;
    match client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(spec)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(SdkError::ServiceError(ctx)) if !is_missing_table(ctx.err().code()) => {
            tracing::warn!(table, code = ?ctx.err().code(), "could not enable TTL; leaving it to prune_expired");
            Ok(())
        }
        Err(e) => Err(table_error(
            "UpdateTimeToLive",
            table,
            CREATE_STORE_TABLE,
            e,
        )),
    }
}

fn is_missing_table(code: Option<&str>) -> bool {
    code == Some("ResourceNotFoundException")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_follow_dynamodb_rules() {
        for good in ["idem", "idem_records", "a.b-c_D9", &"x".repeat(255)] {
            validate_name(good).unwrap();
        }
        for bad in ["", "ab", "has space", "ünï", "a/b", &"x".repeat(256)] {
            let Err(Error::InvalidConfig(msg)) = validate_name(bad) else {
                panic!("{bad:?} accepted");
            };
            assert!(msg.contains("3 to 255 characters"), "{msg}");
        }
    }
}
