//! Opens a store by URL (`idem::store::url`, which documents the schemes), so one worker
//! mode runs against every backend this crate builds: PostgreSQL, DynamoDB and Redis (one
//! server or a cluster). `namespace` is the table (created on connect; a missing DynamoDB
//! table too) or Redis's key prefix.
//!
//! DynamoDB clients come from `DynamoStore::client_from_env`: credentials from
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (placeholders over plain HTTP when unset), the
//! region from `AWS_REGION`; nothing else is looked up.

use std::sync::Arc;
use std::time::Duration;

use idem::store::url::{ConnectOptions, StoreUrl};
use idem_core::Store;

/// The store behind `url`, its records under `namespace`. Panics with the reason when the URL
/// is refused or the store cannot be opened (this crate only runs tests).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = idem_stress::stores::open("dynamodb://127.0.0.1:8000", "idem_storm").await;
/// # let _ = store; }
/// ```
pub async fn open(url: &str, namespace: &str) -> Arc<dyn Store> {
    let options = ConnectOptions::new()
        .namespace(namespace)
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(30))
        .create_table_if_missing(true)
        // The storms count records: nothing deletes them behind the test.
        .background_pruner(false);
    let parsed = StoreUrl::parse(url).unwrap_or_else(|e| panic!("{e}"));
    match parsed.connect(&options).await {
        Ok(opened) => opened.into_store(),
        Err(e) => panic!("open the store at {url}: {e}"),
    }
}
