//! `cargo run --example outbox --features sqlite,consumer`
//!
//! The transactional outbox's whole loop in one process (docs/outbox.md). A shop writes each
//! order and its `OrderPlaced` message in one SQLite transaction, through the transactional
//! engine: a client's retry replays instead of writing a second order or message, and a declined
//! card rolls both back. A dispatcher publishes the outbox (here to a channel; SQS, NATS and
//! Kafka publishers are in `idem::consumer`), and publishes one message again, as a dispatcher
//! that crashed after the broker's acknowledgement would. The billing service consumes the
//! messages keyed by their outbox id and writes one invoice per order.

use std::sync::Arc;
use std::time::Duration;

use idem::consumer::{Consumer, Message};
use idem::{
    ChannelPublisher, Dispatcher, DispatcherConfig, Error, Idempotency, Key, MessageId,
    OutboxMessage, Publisher, SqliteOutbox, SqliteStore, Transactional,
};

#[tokio::main]
async fn main() -> Result<(), idem::BoxError> {
    let dir = tempfile::tempdir()?;

    // The shop: its orders, its outbox, beside its idempotency records.
    let shop = SqliteStore::open(dir.path().join("shop.db")).await?;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, cents INTEGER NOT NULL)")
        .execute(shop.pool())
        .await?;
    let outbox = Arc::new(SqliteOutbox::new(shop.pool().clone(), "outbox").await?);
    let engine = Transactional::new(shop.clone());

    // Order 3 is sent twice (a client's retry); order 4's card is declined.
    for (order, cents) in [(1, 4200), (2, 900), (3, 1500), (3, 1500), (4, 99_900)] {
        let key = Key::derive("orders", "shop-1", &format!("req-{order}"))?;
        let id = format!("o-{order}");
        let placed = OutboxMessage::new(
            MessageId::derive(&key, "placed"),
            "order",
            id.as_str(),
            "OrderPlaced",
            format!(r#"{{"order":"{id}","cents":{cents}}}"#).into_bytes(),
        )?;
        let mut tx = shop.pool().begin().await?;
        let outbox = outbox.clone();
        let placed_order = engine
            .call(key)
            .run(&mut tx, move |conn| {
                Box::pin(async move {
                    if cents > 50_000 {
                        return Err(Error::InvalidConfig("card declined".into()));
                    }
                    sqlx::query("INSERT INTO orders VALUES ($1, $2)")
                        .bind(&id)
                        .bind(cents)
                        .execute(&mut *conn)
                        .await
                        .map_err(idem::sql_error)?;
                    outbox.add(conn, &[placed]).await?;
                    Ok::<_, Error>(id)
                })
            })
            .await;
        match placed_order {
            Ok(outcome) => {
                tx.commit().await?;
                println!("order {order}: {outcome:?}");
            }
            Err(e) => {
                tx.rollback().await?;
                println!("order {order}: rolled back ({e})");
            }
        }
    }

    // The dispatcher publishes what committed, then (a crash's re-publish) order 1's again.
    let (publisher, mut broker) = ChannelPublisher::new(64);
    let dispatcher = Dispatcher::new(
        Arc::new(shop.clone()),
        outbox.clone(),
        Arc::new(publisher.clone()),
        DispatcherConfig::new(),
    )?;
    let report = dispatcher.run_once().await?;
    println!("dispatcher: published {}", report.published);
    let first = OutboxMessage::new(
        MessageId::derive(&Key::derive("orders", "shop-1", "req-1")?, "placed"),
        "order",
        "o-1",
        "OrderPlaced",
        br#"{"order":"o-1","cents":4200}"#.to_vec(),
    )?;
    publisher.publish(&first).await?;

    // Billing: its own store, keyed by the outbox id.
    let billing = SqliteStore::open(dir.path().join("billing.db")).await?;
    sqlx::query("CREATE TABLE invoices (message_id TEXT NOT NULL, body TEXT NOT NULL)")
        .execute(billing.pool())
        .await?;
    let consumer = Consumer::new(Idempotency::new(billing.clone()), "invoice")?;
    let mut batch = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), broker.recv()).await {
        let id = m.id.to_string();
        batch.push(Message::keyed(m, id));
    }
    let pool = billing.pool().clone();
    let outcomes = consumer
        .process(batch, move |m: OutboxMessage| {
            let pool = pool.clone();
            async move {
                sqlx::query("INSERT INTO invoices VALUES ($1, $2)")
                    .bind(m.id.to_string())
                    .bind(String::from_utf8_lossy(&m.payload).into_owned())
                    .execute(&pool)
                    .await?;
                Ok::<_, sqlx::Error>(())
            }
        })
        .await;
    println!("billing: {} deliveries", outcomes.len());
    let invoices: Vec<(String,)> = sqlx::query_as("SELECT body FROM invoices ORDER BY body")
        .fetch_all(billing.pool())
        .await?;
    for (body,) in &invoices {
        println!("invoice for {body}");
    }
    assert_eq!(invoices.len(), 3, "orders 1, 2 and 3, once each");
    Ok(())
}
