//! The outbox end to end, across processes, with kills. 10,000 business transactions each
//! write an order row and an outbox message in one transaction; one in ten rolls back. A
//! dispatcher node (`idem-outbox-node dispatch`) publishes the outbox and is SIGKILLed twice
//! mid-publish; a receiving node (`idem-outbox-node apply`) applies each message's effect (a
//! row in its own PostgreSQL table, committed with its step record) and is SIGKILLed once
//! mid-batch. At the end every committed transaction's message was delivered and its effect
//! applied exactly once (one row per message id in the receiving service's table), and no
//! rolled-back transaction's message was published or applied.
//!
//! Pairs: SQLite's outbox to SQS (moto, a standard queue: the consumer absorbs the dispatcher's
//! re-publishes), PostgreSQL's outbox to NATS JetStream (nats-server, a stream with its
//! duplicate window), and DynamoDB's outbox (moto) to Kafka (librdkafka's mock cluster, hosted
//! by this test process, which the nodes connect to over loopback). Each store and each broker
//! runs in one pair; the dispatcher and the receiving node are the same code for every pair.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use idem_core::{Key, MessageId, OutboxMessage};
use idem_sql::{PostgresOutbox, SqliteOutbox};
use idem_stress::outbox_loop::{create_effects_table, sqs_client, BrokerSpec, Producer};
use idem_stress::worker::Worker;
use idem_test_support::unique_name;

const NODE: &str = env!("CARGO_BIN_EXE_idem-outbox-node");
/// Transactions per pair under scripts/test, unless `IDEM_OUTBOX_TXNS` says otherwise: the
/// acceptance run sets `IDEM_OUTBOX_TXNS=10000`. On a loaded 2-core machine the receiving node
/// (a debug build, beside every other test) applies 10-20 messages a second, and every pair's
/// SQS and DynamoDB requests queue at the one moto, which answers one at a time: 2,000 per pair
/// took 153 s alone and 364-457 s beside the other lane of `scripts/test`, the longest binary
/// of the suite. 1,000 still spans both dispatcher kills (at a fifth and a half) and the
/// receiving node's (at a third), each with a page of messages in flight.
const TXNS: usize = 1_000;

/// How many transactions a pair runs: `IDEM_OUTBOX_TXNS`, else `default`.
fn txns(default: usize) -> usize {
    std::env::var("IDEM_OUTBOX_TXNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
/// Generous bounds for a loaded 2-core machine: 15 minutes, and 0.3 s more per transaction
/// (the receiving node applies 10-20 a second there); the test never asserts speed.
fn run_bound(txns: usize) -> Duration {
    Duration::from_secs(900) + Duration::from_millis(300) * txns as u32
}
/// How long a node gets to print `ready`.
const RUN: Duration = Duration::from_secs(900);
const POLL: Duration = Duration::from_millis(200);

/// The message of transaction `i`: its id from the operation's key, 100 aggregates.
fn message(i: usize) -> OutboxMessage {
    let key = Key::derive("orders", "", &format!("order-{i}")).unwrap();
    OutboxMessage::new(
        MessageId::derive(&key, "placed"),
        "order",
        format!("o-{}", i % 100),
        "OrderPlaced",
        format!("{{\"order\":{i}}}").into_bytes(),
    )
    .unwrap()
}

/// What the producer committed: the message ids of committed and rolled-back transactions.
struct Produced {
    committed: HashSet<String>,
    rolled_back: HashSet<String>,
}

impl Produced {
    fn new() -> Produced {
        Produced {
            committed: HashSet::new(),
            rolled_back: HashSet::new(),
        }
    }

    fn record(&mut self, i: usize, committed: bool) {
        let id = message(i).id.to_string();
        if committed {
            self.committed.insert(id);
        } else {
            self.rolled_back.insert(id);
        }
    }
}

/// The transactions on SQLite: an order row and its message, every tenth rolled back.
async fn produce_sqlite(pool: &sqlx::SqlitePool, table: &str, txns: usize) -> Produced {
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .execute(pool)
        .await
        .unwrap();
    let outbox = SqliteOutbox::new(pool.clone(), table).await.unwrap();
    let mut produced = Produced::new();
    for i in 0..txns {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO orders (id) VALUES ($1)")
            .bind(i as i64)
            .execute(&mut *tx)
            .await
            .unwrap();
        assert_eq!(outbox.add(&mut tx, &[message(i)]).await.unwrap(), 1);
        let commit = i % 10 != 0;
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
        produced.record(i, commit);
    }
    produced
}

/// The same on PostgreSQL, eight transactions at a time.
async fn produce_postgres(pool: &sqlx::PgPool, orders: &str, table: &str, txns: usize) -> Produced {
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{orders}\" (id BIGINT PRIMARY KEY)"
    ))
    .execute(pool)
    .await
    .unwrap();
    let outbox = PostgresOutbox::new(pool.clone(), table).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..8 {
        let (pool, outbox, orders) = (pool.clone(), outbox.clone(), orders.to_owned());
        tasks.spawn(async move {
            let mut done = Vec::new();
            for i in (lane..txns).step_by(8) {
                let mut tx = pool.begin().await.unwrap();
                sqlx::query(&format!("INSERT INTO \"{orders}\" (id) VALUES ($1)"))
                    .bind(i as i64)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                assert_eq!(outbox.add(&mut tx, &[message(i)]).await.unwrap(), 1);
                let commit = i % 10 != 0;
                if commit {
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
                done.push((i, commit));
            }
            done
        });
    }
    let mut produced = Produced::new();
    while let Some(done) = tasks.join_next().await {
        for (i, commit) in done.unwrap() {
            produced.record(i, commit);
        }
    }
    produced
}

/// The receiving service's database: its records table and its effects table.
struct Receiving {
    pool: sqlx::PgPool,
    url: String,
    records: String,
    effects: String,
}

impl Receiving {
    async fn new(url: &str) -> Receiving {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(url)
            .await
            .unwrap();
        let effects = unique_name("effects");
        create_effects_table(&pool, &effects).await.unwrap();
        Receiving {
            pool,
            url: url.to_owned(),
            records: unique_name("receiving"),
            effects,
        }
    }

    async fn applied(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM \"{}\"", self.effects))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    fn node(&self, name: &str, broker: &BrokerSpec) -> Worker {
        let args: Vec<String> = [
            "apply",
            "--broker",
            &broker.arg(),
            "--pg",
            &self.url,
            "--records",
            &self.records,
            "--effects",
            &self.effects,
            "--lease-ms",
            "5000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Worker::spawn(name, NODE, &args, &[])
    }

    async fn drop_tables(&self) {
        for table in [&self.effects, &self.records] {
            let _ = sqlx::raw_sql(&format!("DROP TABLE IF EXISTS \"{table}\""))
                .execute(&self.pool)
                .await;
        }
    }
}

/// Runs the nodes over a produced outbox, with the kills, until every committed message's
/// effect is applied; then checks exactly once. `sent` reads how many messages the outbox
/// holds as sent.
async fn run_loop<F, Fut>(
    producer: &Producer,
    records: &str,
    outbox: &str,
    broker: &BrokerSpec,
    receiving: &Receiving,
    produced: &Produced,
    sent: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let producer_arg = producer.arg();
    let dispatcher = |name: &str| {
        let args: Vec<String> = [
            "dispatch",
            "--producer",
            &producer_arg,
            "--records",
            records,
            "--outbox",
            outbox,
            "--broker",
            &broker.arg(),
            "--lease-ms",
            "1000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Worker::spawn(name, NODE, &args, &[])
    };
    let committed = produced.committed.len() as i64;
    let mut apply = receiving.node("apply-1", broker);
    apply.wait_for("ready", RUN).await;
    let mut dispatch = dispatcher("dispatch-1");
    dispatch.wait_for("ready", RUN).await;

    // Kill the dispatcher at a fifth and at a half of the messages sent, the receiving node at
    // a third applied; restart each at once.
    let mut dispatcher_kills = [committed / 5, committed / 2].into_iter().peekable();
    let mut apply_killed = false;
    let started = Instant::now();
    let mut said = Instant::now();
    loop {
        let bound = run_bound(produced.committed.len() + produced.rolled_back.len());
        assert!(
            started.elapsed() < bound,
            "not every effect was applied within {bound:?}: sent {}, applied {}",
            sent().await,
            receiving.applied().await
        );
        let (sent_now, applied) = (sent().await, receiving.applied().await);
        if said.elapsed() >= Duration::from_secs(10) {
            eprintln!(
                "after {:?}: sent {sent_now}, applied {applied}",
                started.elapsed()
            );
            said = Instant::now();
        }
        if let Some(&at) = dispatcher_kills.peek()
            && sent_now >= at
        {
            dispatch.kill9().await;
            let n = 4 - dispatcher_kills.len();
            dispatcher_kills.next();
            dispatch = dispatcher(&format!("dispatch-{n}"));
            dispatch.wait_for("ready", RUN).await;
        }
        if !apply_killed && applied >= committed / 3 {
            apply.kill9().await;
            apply_killed = true;
            apply = receiving.node("apply-2", broker);
            apply.wait_for("ready", RUN).await;
        }
        // Done once every effect is applied and the dispatcher marked every message sent (it
        // marks a page after the broker acknowledged all of it, so a fast consumer can apply
        // the last page before it is marked).
        if dispatcher_kills.peek().is_none()
            && apply_killed
            && applied >= committed
            && sent_now >= committed
        {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    dispatch.kill9().await;
    apply.kill9().await;

    let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT message_id, count(*) FROM \"{}\" GROUP BY message_id",
        receiving.effects
    ))
    .fetch_all(&receiving.pool)
    .await
    .unwrap();
    let counts: HashMap<String, i64> = rows.into_iter().collect();
    let twice: Vec<(&String, &i64)> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "effects applied more than once: {twice:?}"
    );
    let applied: HashSet<String> = counts.into_keys().collect();
    assert_eq!(
        applied.len(),
        produced.committed.len(),
        "every committed message's effect, once"
    );
    assert!(
        applied == produced.committed,
        "the applied messages are the committed ones"
    );
    assert!(
        applied.is_disjoint(&produced.rolled_back),
        "a rolled-back transaction's message was applied"
    );
    assert_eq!(
        sent().await,
        committed,
        "every committed message is marked sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_outbox_to_sqs_with_kills() {
    let Some(endpoint) = idem_test_support::setting(
        "sqlite_outbox_to_sqs_with_kills",
        "IDEM_TEST_DYNAMODB_URL",
        "IDEM_REQUIRE_DYNAMODB",
    ) else {
        return;
    };
    let Some(pg) = idem_test_support::postgres::pg_url("sqlite_outbox_to_sqs_with_kills") else {
        return;
    };
    let client = sqs_client(&endpoint);
    let queue = client
        .create_queue()
        .queue_name(unique_name("outbox"))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let broker = BrokerSpec::Sqs {
        endpoint: endpoint.clone(),
        queue,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.db");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(30));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let produced = produce_sqlite(&pool, "outbox", txns(TXNS)).await;
    let receiving = Receiving::new(&pg).await;
    let producer = Producer::Sqlite(path.display().to_string());
    let sent = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    run_loop(
        &producer,
        "idem_records",
        "outbox",
        &broker,
        &receiving,
        &produced,
        sent,
    )
    .await;
    receiving.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_to_nats_with_kills() {
    use idem::consumer::nats::async_nats::{self, jetstream};
    let Some(pg) = idem_test_support::postgres::pg_url("postgres_outbox_to_nats_with_kills") else {
        return;
    };
    let Some(nats) = idem_test_support::setting(
        "postgres_outbox_to_nats_with_kills",
        "IDEM_TEST_NATS_URL",
        "IDEM_REQUIRE_NATS",
    ) else {
        return;
    };
    let js = jetstream::new(async_nats::connect(&nats).await.unwrap());
    let stream = unique_name("outbox").replace(['-', '.'], "_");
    js.create_stream(jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{stream}.>")],
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .unwrap()
    .create_consumer(jetstream::consumer::pull::Config {
        durable_name: Some("apply".into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(5),
        ..Default::default()
    })
    .await
    .unwrap();
    let broker = BrokerSpec::Nats {
        url: nats.clone(),
        stream: stream.clone(),
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(9)
        .connect(&pg)
        .await
        .unwrap();
    let (orders, outbox, records) = (
        unique_name("orders"),
        unique_name("outbox"),
        unique_name("producer"),
    );
    let produced = produce_postgres(&pool, &orders, &outbox, txns(TXNS)).await;
    let receiving = Receiving::new(&pg).await;
    let producer = Producer::Postgres(pg.clone());
    let sql = format!("SELECT count(*) FROM \"{outbox}\" WHERE sent_at IS NOT NULL");
    let sent = || async {
        sqlx::query_scalar::<_, i64>(&sql)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    run_loop(
        &producer, &records, &outbox, &broker, &receiving, &produced, sent,
    )
    .await;
    receiving.drop_tables().await;
    for table in [&orders, &outbox, &records] {
        let _ = sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS \"{table}\", \"{table}_migrations\""
        ))
        .execute(&pool)
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_outbox_to_kafka_with_kills() {
    use idem::aws_sdk_dynamodb::types::{
        AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put,
        ScalarAttributeType, TransactWriteItem,
    };
    use idem::consumer::kafka::rdkafka::mocking::MockCluster;
    use idem::consumer::kafka::rdkafka::producer::DefaultProducerContext;
    use idem::{DynamoOutbox, OutboxSource};
    use idem_stress::outbox_loop::dynamo_client;
    let Some(endpoint) = idem_test_support::setting(
        "dynamodb_outbox_to_kafka_with_kills",
        "IDEM_TEST_DYNAMODB_URL",
        "IDEM_REQUIRE_DYNAMODB",
    ) else {
        return;
    };
    let Some(pg) = idem_test_support::postgres::pg_url("dynamodb_outbox_to_kafka_with_kills")
    else {
        return;
    };
    let mock: MockCluster<'static, DefaultProducerContext> = MockCluster::new(3).unwrap();
    let topic = "outbox";
    mock.create_topic(topic, 4, 3).unwrap();
    let broker = BrokerSpec::Kafka {
        servers: mock.bootstrap_servers(),
        topic: topic.into(),
    };

    let client = dynamo_client(&endpoint);
    let (orders, outbox_table, records) = (
        unique_name("orders"),
        unique_name("outbox"),
        unique_name("producer"),
    );
    client
        .create_table()
        .table_name(&orders)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
    let outbox = DynamoOutbox::builder()
        .table(&outbox_table)
        .create_table_if_missing(true)
        .build(client.clone())
        .await
        .unwrap();

    // Each transaction puts its order (unless it exists) and its message; one in ten finds its
    // order there already (put beforehand), so the transaction is cancelled: a rollback.
    let txns = txns(TXNS);
    let put_order = |i: usize| {
        Put::builder()
            .table_name(&orders)
            .item("pk", AttributeValue::S(format!("order-{i}")))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .unwrap()
    };
    let mut produced = Produced::new();
    for i in 0..txns {
        let commit = i % 10 != 0;
        if !commit {
            client
                .put_item()
                .table_name(&orders)
                .item("pk", AttributeValue::S(format!("order-{i}")))
                .send()
                .await
                .unwrap();
        }
        let sent = client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(put_order(i)).build())
            .transact_items(outbox.put(&message(i)).unwrap())
            .send()
            .await;
        assert_eq!(sent.is_ok(), commit, "transaction {i}: {sent:?}");
        produced.record(i, commit);
    }

    let receiving = Receiving::new(&pg).await;
    let producer = Producer::Dynamo(endpoint.clone());
    let committed = produced.committed.len() as i64;
    let sent = || async {
        let pending = outbox.pending(txns as u32 + 1).await.unwrap().len() as i64;
        committed - pending
    };
    run_loop(
        &producer,
        &records,
        &outbox_table,
        &broker,
        &receiving,
        &produced,
        sent,
    )
    .await;
    receiving.drop_tables().await;
    for table in [&orders, &outbox_table, &records] {
        let _ = client.delete_table().table_name(table).send().await;
    }
}
