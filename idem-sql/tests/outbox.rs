//! The SQL outbox on SQLite (a database file in a temporary directory) and PostgreSQL (a table
//! of its own on `IDEM_TEST_PG_URL`): messages added in the caller's transaction commit or roll
//! back with it, a retried operation adds no second copy, the dispatcher publishes each
//! committed message once in order per aggregate and marks it sent, and old sent ones are
//! pruned. The transactional mode adds its messages beside the business write and the
//! completion: one statement more in the caller's transaction.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    ChannelPublisher, Dispatcher, DispatcherConfig, Error, Key, MessageId, OutboxMessage,
    OutboxSource,
};
use idem_sql::{SqlOutbox, Transactional};
use sqlx::{Pool, Postgres, Sqlite};

fn message(operation: &str, aggregate: &str, name: &str) -> OutboxMessage {
    let key = Key::derive("orders", "", operation).unwrap();
    OutboxMessage::new(
        MessageId::derive(&key, name),
        "order",
        aggregate,
        name,
        format!("{{\"op\":\"{operation}\"}}").into_bytes(),
    )
    .unwrap()
}

async fn sqlite() -> (Pool<Sqlite>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("outbox.db").display()
    );
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    (pool, dir)
}

async fn postgres(test: &str) -> Option<Pool<Postgres>> {
    let url = idem_test_support::postgres::pg_url(test)?;
    Some(
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap(),
    )
}

/// A committed add is pending, a rolled-back one is not, a retry's add is not a second copy;
/// pending reads in order; a bad message writes nothing; marking sent takes a message out, twice
/// marks nothing; pruning deletes what was sent. A macro, as the two pools' transactions are
/// different types.
macro_rules! outbox_cases {
    ($pool:expr, $table:expr) => {{
        let pool = $pool;
        let outbox = SqlOutbox::new(pool.clone(), $table).await.unwrap();
        // Rolled back: nothing.
        let mut tx = pool.begin().await.unwrap();
        assert_eq!(
            outbox
                .add(&mut tx, &[message("op-0", "o-0", "placed")])
                .await
                .unwrap(),
            1
        );
        tx.rollback().await.unwrap();
        assert!(
            outbox.pending(10).await.unwrap().is_empty(),
            "a rolled-back add left a message"
        );

        // Committed: pending, in order; a retry's copy is not added.
        let mut tx = pool.begin().await.unwrap();
        let first = [
            message("op-1", "o-1", "placed"),
            message("op-1", "o-1", "paid"),
        ];
        assert_eq!(outbox.add(&mut tx, &first).await.unwrap(), 2);
        tx.commit().await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        let again = [
            message("op-1", "o-1", "placed"),
            message("op-2", "o-2", "placed"),
        ];
        assert_eq!(
            outbox.add(&mut tx, &again).await.unwrap(),
            1,
            "only op-2's is new"
        );
        tx.commit().await.unwrap();
        let pending = outbox.pending(10).await.unwrap();
        let kinds: Vec<(&str, &str)> = pending
            .iter()
            .map(|p| (p.message.aggregate_id.as_str(), p.message.kind.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [("o-1", "placed"), ("o-1", "paid"), ("o-2", "placed")]
        );
        assert!(pending.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(pending[0].message, first[0]);
        let age = std::time::SystemTime::now()
            .duration_since(pending[0].added_at)
            .unwrap_or_default();
        assert!(
            age < Duration::from_secs(60),
            "added_at is the database's now: {age:?}"
        );

        // A bad message writes nothing.
        let mut bad = message("op-3", "o-3", "placed");
        bad.aggregate_type.clear();
        let mut conn = pool.acquire().await.unwrap();
        assert!(matches!(
            outbox
                .add(&mut conn, &[message("op-3", "o-3", "ok"), bad])
                .await,
            Err(Error::InvalidConfig(_))
        ));
        drop(conn);
        assert_eq!(outbox.pending(10).await.unwrap().len(), 3);

        // Sent: out of pending; twice marks nothing; pruning deletes them.
        let ids: Vec<MessageId> = pending.iter().take(2).map(|p| p.message.id).collect();
        assert_eq!(outbox.mark_sent(&ids).await.unwrap(), 2);
        assert_eq!(outbox.mark_sent(&ids).await.unwrap(), 0);
        assert_eq!(outbox.pending(10).await.unwrap().len(), 1);
        assert_eq!(
            outbox
                .prune_sent(Duration::from_secs(3600), 10)
                .await
                .unwrap(),
            0
        );
        assert_eq!(outbox.prune_sent(Duration::ZERO, 10).await.unwrap(), 2);
        assert_eq!(outbox.pending(10).await.unwrap().len(), 1);
        outbox
    }};
}

#[tokio::test]
async fn sqlite_outbox_commits_rolls_back_dedupes_and_prunes() {
    let (pool, _dir) = sqlite().await;
    outbox_cases!(pool, "outbox");
}

#[tokio::test]
async fn postgres_outbox_commits_rolls_back_dedupes_and_prunes() {
    let Some(pool) = postgres("postgres_outbox_commits_rolls_back_dedupes_and_prunes").await else {
        return;
    };
    let table = idem_test_support::unique_name("outbox");
    outbox_cases!(pool.clone(), &table);
    sqlx::query(&format!("DROP TABLE \"{table}\", \"{table}_migrations\""))
        .execute(&pool)
        .await
        .unwrap();
}

/// The transactional mode: an order's write, its message and the claim's completion commit
/// together; a retry replays without adding a message; a failed operation rolls its message
/// back; the dispatcher publishes the committed one once.
#[tokio::test]
async fn transactional_mode_adds_messages_with_the_completion() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_sql::SqliteStore::builder()
        .pruner(None)
        .open(dir.path().join("idem.db"))
        .await
        .unwrap();
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let outbox = Arc::new(SqlOutbox::new(pool.clone(), "outbox").await.unwrap());
    let engine = Transactional::new(store.clone());
    for (attempt, fail) in [(0, true), (1, false), (2, false)] {
        let key = Key::derive("orders", "shop", "req-1").unwrap();
        let mut tx = pool.begin().await.unwrap();
        let o = outbox.clone();
        let out = engine
            .call(key)
            .run(&mut tx, move |conn| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO orders VALUES ('o-1')")
                        .execute(&mut *conn)
                        .await
                        .map_err(|e| Error::Store(idem_sql::sql_error(e)))?;
                    o.add(conn, &[message("req-1", "o-1", "placed")]).await?;
                    if fail {
                        return Err(Error::InvalidConfig("the card was declined".into()));
                    }
                    Ok::<_, Error>(format!("order o-1, attempt {attempt}"))
                })
            })
            .await;
        match out {
            Ok(done) => {
                tx.commit().await.unwrap();
                assert_eq!(done.into_inner(), "order o-1, attempt 1");
            }
            Err(_) => tx.rollback().await.unwrap(),
        }
    }
    let pending = outbox.pending(10).await.unwrap();
    assert_eq!(
        pending.len(),
        1,
        "the failed attempt's message rolled back, the replay added none"
    );

    let (publisher, mut received) = ChannelPublisher::new(16);
    let dispatcher = Dispatcher::new(
        Arc::new(store),
        outbox.clone(),
        Arc::new(publisher),
        DispatcherConfig::new(),
    )
    .unwrap();
    let report = dispatcher.run_once().await.unwrap();
    assert_eq!((report.published, report.drained), (1, true));
    let got = received.recv().await.unwrap();
    assert_eq!(
        got.id,
        MessageId::derive(&Key::derive("orders", "", "req-1").unwrap(), "placed")
    );
    assert!(outbox.pending(10).await.unwrap().is_empty());
    assert_eq!(
        dispatcher.run_once().await.unwrap().published,
        0,
        "nothing twice"
    );
}
