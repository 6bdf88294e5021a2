//! The outbox's whole loop across processes (`tests/outbox_kill.rs`): a producing store's
//! outbox, the dispatcher node that publishes it to a broker, and the receiving node that
//! applies each message's effect once, in its own PostgreSQL database. The binary
//! `idem-outbox-node` runs either node; this module holds what it and the test share: which
//! store and which broker a node talks to, by its arguments.

use std::sync::Arc;
use std::time::Duration;

use idem::aws_sdk_dynamodb;
use idem::consumer::kafka::{rdkafka, KafkaPublisher};
use idem::consumer::nats::{async_nats, NatsPublisher};
use idem::consumer::sqs::aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use idem::consumer::sqs::aws_sdk_sqs::{Client as SqsClient, Config as SqsConfig};
use idem::consumer::sqs::SqsPublisher;
use idem::{DynamoOutbox, DynamoStore};
use idem_core::{Error, OutboxSource, Publisher, Store};
use idem_sql::{PostgresOutbox, PostgresStore, SqliteOutbox, SqliteStore};

/// The producing side's store: SQLite (a database file the test process writes too) or
/// PostgreSQL (a records table and an outbox table of the test's own).
#[derive(Debug, Clone)]
pub enum Producer {
    /// `sqlite:<path>`.
    Sqlite(String),
    /// `postgres:<url>`.
    Postgres(String),
    /// `dynamodb:<endpoint>` (moto): the dispatchers' lease in a DynamoStore table, the outbox
    /// in a table of its own.
    Dynamo(String),
}

impl Producer {
    /// The store named by `spec` (`sqlite:<path>`, `postgres:<url>` or `dynamodb:<endpoint>`).
    pub fn parse(spec: &str) -> Result<Producer, String> {
        match spec.split_once(':') {
            Some(("sqlite", path)) => Ok(Producer::Sqlite(path.to_owned())),
            Some(("postgres", url)) => Ok(Producer::Postgres(url.to_owned())),
            Some(("dynamodb", endpoint)) => Ok(Producer::Dynamo(endpoint.to_owned())),
            _ => Err(format!(
                "a producer is sqlite:<path>, postgres:<url> or dynamodb:<endpoint>, not {spec:?}"
            )),
        }
    }

    /// The store (for the dispatchers' lease, in `records`) and the outbox `table` on it.
    pub async fn open(
        &self,
        records: &str,
        table: &str,
    ) -> Result<(Arc<dyn Store>, Arc<dyn OutboxSource>), Error> {
        match self {
            Producer::Sqlite(path) => {
                let store = SqliteStore::builder().pruner(None).open(path).await?;
                let outbox = SqliteOutbox::new(store.pool().clone(), table).await?;
                Ok((Arc::new(store), Arc::new(outbox)))
            }
            Producer::Postgres(url) => {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(8)
                    .connect(url)
                    .await
                    .map_err(idem_sql::sql_error)?;
                let store = PostgresStore::builder()
                    .pruner(None)
                    .table(records)
                    .from_pool(pool.clone())
                    .await?;
                let outbox = PostgresOutbox::new(pool, table).await?;
                Ok((Arc::new(store), Arc::new(outbox)))
            }
            Producer::Dynamo(endpoint) => {
                let client = dynamo_client(endpoint);
                let store = DynamoStore::builder()
                    .table(records)
                    .create_table_if_missing(true)
                    .build(client.clone())
                    .await?;
                let outbox = DynamoOutbox::builder().table(table).build(client).await?;
                Ok((Arc::new(store), Arc::new(outbox)))
            }
        }
    }

    /// The spec as the node's argument.
    pub fn arg(&self) -> String {
        match self {
            Producer::Sqlite(path) => format!("sqlite:{path}"),
            Producer::Postgres(url) => format!("postgres:{url}"),
            Producer::Dynamo(endpoint) => format!("dynamodb:{endpoint}"),
        }
    }
}

/// A DynamoDB client of moto at `endpoint`, with placeholder credentials.
pub fn dynamo_client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "static"))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// The broker between the two nodes.
#[derive(Debug, Clone)]
pub enum BrokerSpec {
    /// `sqs:<endpoint>|<queue url>` (moto's endpoint).
    Sqs { endpoint: String, queue: String },
    /// `nats:<url>|<stream>`: messages go to `<stream>.<aggregate type>`.
    Nats { url: String, stream: String },
    /// `kafka:<bootstrap servers>|<topic>` (librdkafka's mock cluster, hosted by the test).
    Kafka { servers: String, topic: String },
}

impl BrokerSpec {
    /// The broker named by `spec`.
    pub fn parse(spec: &str) -> Result<BrokerSpec, String> {
        let (kind, rest) = spec
            .split_once(':')
            .ok_or("a broker is sqs:…, nats:… or kafka:…")?;
        let (a, b) = rest
            .split_once('|')
            .ok_or_else(|| format!("a broker spec is kind:<address>|<name>, not {spec:?}"))?;
        match kind {
            "sqs" => Ok(BrokerSpec::Sqs {
                endpoint: a.to_owned(),
                queue: b.to_owned(),
            }),
            "nats" => Ok(BrokerSpec::Nats {
                url: a.to_owned(),
                stream: b.to_owned(),
            }),
            "kafka" => Ok(BrokerSpec::Kafka {
                servers: a.to_owned(),
                topic: b.to_owned(),
            }),
            _ => Err(format!("unknown broker {kind:?}")),
        }
    }

    /// The spec as the node's argument.
    pub fn arg(&self) -> String {
        match self {
            BrokerSpec::Sqs { endpoint, queue } => format!("sqs:{endpoint}|{queue}"),
            BrokerSpec::Nats { url, stream } => format!("nats:{url}|{stream}"),
            BrokerSpec::Kafka { servers, topic } => format!("kafka:{servers}|{topic}"),
        }
    }

    /// The publisher a dispatcher node uses.
    pub async fn publisher(&self) -> Result<Arc<dyn Publisher>, String> {
        Ok(match self {
            BrokerSpec::Sqs { endpoint, queue } => Arc::new(DepthBounded {
                publisher: SqsPublisher::new(sqs_client(endpoint), queue.clone()),
                client: sqs_client(endpoint),
                queue: queue.clone(),
                since_check: tokio::sync::Mutex::new(0),
            }),
            BrokerSpec::Nats { url, stream } => {
                let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
                Arc::new(NatsPublisher::new(
                    async_nats::jetstream::new(client),
                    stream.clone(),
                ))
            }
            BrokerSpec::Kafka { servers, topic } => {
                let producer: rdkafka::producer::FutureProducer =
                    KafkaPublisher::producer_config(servers)
                        .create()
                        .map_err(|e| e.to_string())?;
                Arc::new(KafkaPublisher::new(producer, topic.clone()))
            }
        })
    }
}

/// How many messages moto's queue may hold (visible and in flight) before the dispatcher node
/// waits for the receiving node to catch up.
pub const MOTO_QUEUE_DEPTH: i64 = 300;

/// An [`SqsPublisher`] that keeps moto's queue at most [`MOTO_QUEUE_DEPTH`] deep: it asks the
/// queue's depth every 20 publishes and waits (up to 2 minutes, then publishes anyway) while it
/// is deeper. moto keeps a queue as a list it scans for every send, receive, delete and
/// visibility change, so its throughput falls with the depth: 60 receive-and-delete a second
/// at 500 messages, 4 at 5,000 (measured on this machine). A dispatcher free to publish 10,000
/// messages ahead of the consumer would test moto's list, not idem; SQS has no such limit.
struct DepthBounded {
    publisher: SqsPublisher,
    client: SqsClient,
    queue: String,
    since_check: tokio::sync::Mutex<u32>,
}

impl DepthBounded {
    async fn depth(&self) -> Result<i64, String> {
        use idem::consumer::sqs::aws_sdk_sqs::types::QueueAttributeName as A;
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| {
                idem::consumer::sqs::aws_sdk_sqs::error::DisplayErrorContext(e).to_string()
            })?;
        let attributes = out.attributes.unwrap_or_default();
        let count = |name: &A| {
            attributes
                .get(name)
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(0)
        };
        Ok(count(&A::ApproximateNumberOfMessages)
            + count(&A::ApproximateNumberOfMessagesNotVisible))
    }
}

#[async_trait::async_trait]
impl Publisher for DepthBounded {
    async fn publish(&self, message: &idem_core::OutboxMessage) -> Result<(), idem_core::BoxError> {
        {
            // One publisher at a time checks; the others wait on the lock meanwhile.
            let mut since = self.since_check.lock().await;
            *since += 1;
            if *since >= 20 {
                *since = 0;
                for _ in 0..600 {
                    if self.depth().await? <= MOTO_QUEUE_DEPTH {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        self.publisher.publish(message).await
    }
}

/// An SQS client of moto at `endpoint`, with placeholder credentials.
pub fn sqs_client(endpoint: &str) -> SqsClient {
    let config = SqsConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "static"))
        .endpoint_url(endpoint)
        .timeout_config(
            idem::consumer::sqs::aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(30))
                .build(),
        )
        .build();
    SqsClient::from_conf(config)
}

/// The receiving service's table of applied effects: one row per application of a message's
/// effect, with no unique key, so a second application would show as a second row.
pub async fn create_effects_table(pool: &sqlx::PgPool, table: &str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (message_id TEXT NOT NULL, body TEXT NOT NULL)"
    ))
    .execute(pool)
    .await?;
    Ok(())
}
