//! Opens a store by URL, so one worker mode runs against every backend:
//!
//! | URL | store | `namespace` is |
//! |---|---|---|
//! | `postgres://…` | [`idem_core::PostgresStore`] | its table (created on connect) |
//! | `dynamodb://HOST:PORT`, `dynamodb+http://HOST:PORT` | [`idem_core::DynamoStore`] on the endpoint `http://HOST:PORT` | its table (created if missing) |
//! | `dynamodb+https://HOST[:PORT]` | the same over HTTPS | |
//! | `redis://HOST:PORT` | [`idem_core::RedisStore`] on one server | its key prefix |
//! | `redis-cluster://HOST:PORT,HOST:PORT,…` | [`idem_core::RedisStore`] on a Redis Cluster, from those nodes | its key prefix |
//!
//! DynamoDB clients come from [`DynamoStore::client_from_env`]: credentials from
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (placeholders over plain HTTP when unset), the
//! region from `AWS_REGION`; nothing else is looked up.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{DynamoStore, PostgresStore, RedisStore, Store};

/// The store behind `url`, its records under `namespace`. Panics with the reason when the URL's
/// scheme is unknown or the store cannot be opened (this crate only runs tests).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = idem_stress::stores::open("dynamodb://127.0.0.1:8000", "idem_storm").await;
/// # let _ = store; }
/// ```
pub async fn open(url: &str, namespace: &str) -> Arc<dyn Store> {
    let opened: Result<Arc<dyn Store>, idem_core::Error> =
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            PostgresStore::builder()
                .table(namespace)
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(30))
                .connect(url)
                .await
                .map(|s| Arc::new(s) as Arc<dyn Store>)
        } else if let Some(endpoint) = DynamoStore::endpoint_of_url(url) {
            let client = DynamoStore::client_from_env(&endpoint)
                .unwrap_or_else(|e| panic!("a DynamoDB client for {url}: {e}"));
            DynamoStore::builder()
                .table(namespace)
                .create_table_if_missing(true)
                .build(client)
                .await
                .map(|s| Arc::new(s) as Arc<dyn Store>)
        } else if url.starts_with("redis://") {
            RedisStore::builder()
                .prefix(namespace)
                .connect(url)
                .await
                .map(|s| Arc::new(s) as Arc<dyn Store>)
        } else if let Some(nodes) = url.strip_prefix("redis-cluster://") {
            let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
            RedisStore::builder()
                .prefix(namespace)
                .connect_cluster(&nodes)
                .await
                .map(|s| Arc::new(s) as Arc<dyn Store>)
        } else {
            panic!(
                "unknown store URL {url:?}: use postgres://, dynamodb://, dynamodb+http(s)://, \
                 redis:// or redis-cluster://"
            )
        };
    opened.unwrap_or_else(|e| panic!("open the store at {url}: {e}"))
}
