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
//! DynamoDB clients take their credentials from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`
//! (static test values when unset) and their region from `AWS_REGION` (`us-east-1` when unset);
//! nothing else is looked up.

use std::sync::Arc;
use std::time::Duration;

use idem_core::aws_sdk_dynamodb::config::{
    timeout::TimeoutConfig, BehaviorVersion, Credentials, Region,
};
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
        } else if let Some(endpoint) = dynamodb_endpoint(url) {
            DynamoStore::builder()
                .table(namespace)
                .create_table_if_missing(true)
                .build(dynamodb_client(&endpoint))
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

/// The HTTP endpoint of a `dynamodb://`, `dynamodb+http://` or `dynamodb+https://` URL.
///
/// ```
/// use idem_stress::stores::dynamodb_endpoint;
/// assert_eq!(dynamodb_endpoint("dynamodb://127.0.0.1:8000").as_deref(), Some("http://127.0.0.1:8000"));
/// assert_eq!(dynamodb_endpoint("dynamodb+https://dynamodb.eu-west-1.amazonaws.com").as_deref(),
///            Some("https://dynamodb.eu-west-1.amazonaws.com"));
/// assert_eq!(dynamodb_endpoint("postgres://x"), None);
/// ```
pub fn dynamodb_endpoint(url: &str) -> Option<String> {
    if let Some(rest) = url.strip_prefix("dynamodb+https://") {
        return Some(format!("https://{rest}"));
    }
    url.strip_prefix("dynamodb+http://")
        .or_else(|| url.strip_prefix("dynamodb://"))
        .map(|rest| format!("http://{rest}"))
}

fn dynamodb_client(endpoint: &str) -> idem_core::aws_sdk_dynamodb::Client {
    let var = |name: &str, default: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_owned())
    };
    let config = idem_core::aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(var("AWS_REGION", "us-east-1")))
        .credentials_provider(Credentials::new(
            var("AWS_ACCESS_KEY_ID", "idem-test"),
            var("AWS_SECRET_ACCESS_KEY", "idem-test"),
            None,
            None,
            "idem-stress",
        ))
        .endpoint_url(endpoint)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(Duration::from_secs(20))
                .build(),
        )
        .build();
    idem_core::aws_sdk_dynamodb::Client::from_conf(config)
}
