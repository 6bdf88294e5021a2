//! Consumers with exactly-once effects (`Consumer::process_steps`, docs/consumers.md), on
//! SQLite, PostgreSQL (IDEM_TEST_PG_URL) and DynamoDB (moto: IDEM_TEST_DYNAMODB_URL): each
//! message's effect is a row (an item) written by one transactional step.
//!
//! - twins in a batch and across batches: one effect, the later ones replayed;
//! - a run that dies after its step committed (its handler fails after it): the redelivery
//!   replays the step without running its work and completes; still one effect;
//! - a claim taken over while its handler runs (the record evicted, the message run again
//!   elsewhere): the stale run's step is refused and rolled back; one effect;
//! - DynamoDB: a write whose own condition fails cancels the step (a `Query` store error naming
//!   it, nothing written), and a step of more than 98 writes is refused;
//! - a handler that panics fails its message only and leaves its key free (SQLite).

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{Error, Idempotency, Key, SqlSteps, SqliteStore, Steps, Store};
use idem_consumer::{Consumer, Failure, Message, MessageOutcome};
use tokio::sync::{Notify, Semaphore};

/// A store with a business table, and the effect written as the step "effect".
trait Shop: Clone + Send + Sync + 'static {
    fn engine(&self) -> Idempotency;
    /// Writes message `id`'s effect as the step "effect"; its value is the step's.
    fn apply(&self, steps: &Steps, id: &str) -> impl Future<Output = Result<u32, Error>> + Send;
    /// How many effects message `id` has.
    fn effects(&self, id: &str) -> impl Future<Output = i64> + Send;
}

/// The effect of message `id` on a SQL store, written in a transaction begun with `$begin`.
macro_rules! sql_shop {
    ($name:ident, $store:ty, $begin:literal) => {
        #[derive(Clone)]
        struct $name($store, String);

        impl Shop for $name {
            fn engine(&self) -> Idempotency {
                Idempotency::new(self.0.clone())
            }

            async fn apply(&self, steps: &Steps, id: &str) -> Result<u32, Error> {
                use sqlx::Connection;
                let (store, id) = (&self.0, id.to_owned());
                let sql = format!("INSERT INTO {} (id) VALUES ($1)", self.1);
                let mut conn = store.pool().acquire().await.map_err(idem::sql_error)?;
                let mut tx = conn.begin_with($begin).await.map_err(idem::sql_error)?;
                let value = steps
                    .tx(store, &mut tx, "effect", |tx| {
                        Box::pin(async move {
                            sqlx::query(&sql)
                                .bind(id)
                                .execute(&mut *tx)
                                .await
                                .map_err(idem::sql_error)?;
                            Ok::<_, Error>(7)
                        })
                    })
                    .await?;
                tx.commit().await.map_err(idem::sql_error)?;
                Ok(value)
            }

            async fn effects(&self, id: &str) -> i64 {
                sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {} WHERE id = $1", self.1))
                    .bind(id)
                    .fetch_one(self.0.pool())
                    .await
                    .unwrap()
            }
        }
    };
}

sql_shop!(SqliteShop, SqliteStore, "BEGIN IMMEDIATE");
sql_shop!(PgShop, idem::PostgresStore, "BEGIN");

async fn sqlite() -> SqliteShop {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("shop.db")).await.unwrap();
    std::mem::forget(dir);
    sqlx::query("CREATE TABLE effects (id TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    SqliteShop(store, "effects".into())
}
async fn postgres() -> Option<PgShop> {
    let url = idem_test_support::setting(
        &idem_test_support::current_test(),
        "IDEM_TEST_PG_URL",
        "IDEM_REQUIRE_PG",
    )?;
    let table = idem_test_support::unique_name("idem_cs");
    let store = idem::PostgresStore::builder()
        .table(&table)
        .pruner(None)
        .connect(&url)
        .await
        .unwrap();
    let effects = format!("{table}_effects");
    sqlx::query(&format!("CREATE TABLE {effects} (id TEXT NOT NULL)"))
        .execute(store.pool())
        .await
        .unwrap();
    Some(PgShop(store, effects))
}

/// Twins in one batch, and the same message again in a later batch: one effect.
async fn twins_apply_once(shop: impl Shop) {
    let consumer = Consumer::new(shop.engine(), "effects").unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let handler = |id: String, steps: Steps| {
        let (shop, runs) = (shop.clone(), runs.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            shop.apply(&steps, &id).await
        }
    };
    let batch = || {
        vec![
            Message::keyed("m-1".to_owned(), "m-1"),
            Message::keyed("m-2".to_owned(), "m-2"),
            Message::keyed("m-1".to_owned(), "m-1"),
        ]
    };
    let first = consumer.process_steps(batch(), handler).await;
    assert!(matches!(first[0], MessageOutcome::Done(7)), "{first:?}");
    assert!(matches!(first[1], MessageOutcome::Done(7)), "{first:?}");
    assert!(matches!(first[2], MessageOutcome::Replayed(7)), "{first:?}");
    let again = consumer.process_steps(batch(), handler).await;
    assert!(
        again
            .iter()
            .all(|o| matches!(o, MessageOutcome::Replayed(7))),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "handler runs");
    assert_eq!(shop.effects("m-1").await, 1);
    assert_eq!(shop.effects("m-2").await, 1);
}

/// A run that dies after its step committed (its handler fails after the step): the
/// redelivery replays the step, runs nothing of it, and completes.
async fn a_run_that_died_after_its_step_is_finished_by_the_redelivery(shop: impl Shop) {
    let consumer = Consumer::new(shop.engine(), "effects").unwrap();
    let work = Arc::new(AtomicU32::new(0));
    let handler = |(id, die): (String, bool), steps: Steps| {
        let (shop, work) = (shop.clone(), work.clone());
        async move {
            let value = steps
                .run("count", || async {
                    work.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(())
                })
                .await;
            value?;
            let value = shop.apply(&steps, &id).await?;
            if die {
                return Err(Error::InvalidConfig("died after its step".into()));
            }
            Ok(value + steps.attempt().number)
        }
    };
    let died = consumer
        .process_steps(
            vec![Message::keyed(("m-3".to_owned(), true), "m-3")],
            handler,
        )
        .await;
    assert!(
        matches!(&died[0], MessageOutcome::Failed(Failure::Handler(_))),
        "{died:?}"
    );
    assert_eq!(shop.effects("m-3").await, 1, "the step committed");
    let redelivered = consumer
        .process_steps(
            vec![Message::keyed(("m-3".to_owned(), false), "m-3")],
            handler,
        )
        .await;
    assert!(
        matches!(redelivered[0], MessageOutcome::Done(9)),
        "the second attempt replays the step (7) and completes: {redelivered:?}"
    );
    assert_eq!(shop.effects("m-3").await, 1, "applied once");
    assert_eq!(
        work.load(Ordering::SeqCst),
        1,
        "the first step replayed too"
    );
}

/// A claim taken over while its handler runs: the stale run's step is refused and rolled back.
async fn a_taken_over_claim_applies_nothing(shop: impl Shop) {
    let consumer = Consumer::new(shop.engine(), "effects").unwrap();
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Semaphore::new(0)));
    let stale = {
        let (shop, started, gate) = (shop.clone(), started.clone(), gate.clone());
        let consumer = consumer.clone();
        tokio::spawn(async move {
            let handler = |id: String, steps: Steps| {
                let (shop, started, gate) = (shop.clone(), started.clone(), gate.clone());
                async move {
                    started.notify_one();
                    gate.acquire().await.unwrap().forget();
                    shop.apply(&steps, &id).await
                }
            };
            consumer
                .process_steps(vec![Message::keyed("m-4".to_owned(), "m-4")], handler)
                .await
        })
    };
    started.notified().await;
    // Its record is gone (as after a lease that ended), and the redelivery runs elsewhere.
    let key = Key::derive("effects", "", "m-4").unwrap();
    assert!(shop.engine().store().evict(&key).await.unwrap());
    let fresh = consumer
        .process_steps(
            vec![Message::keyed("m-4".to_owned(), "m-4")],
            |id: String, steps: Steps| {
                let shop = shop.clone();
                async move { shop.apply(&steps, &id).await }
            },
        )
        .await;
    assert!(matches!(fresh[0], MessageOutcome::Done(7)), "{fresh:?}");
    gate.add_permits(1);
    let stale = stale.await.unwrap();
    assert!(
        matches!(&stale[0], MessageOutcome::Failed(_)),
        "the stale run: {stale:?}"
    );
    assert_eq!(
        shop.effects("m-4").await,
        1,
        "the stale run applied nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_twins_apply_once() {
    twins_apply_once(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_run_that_died_after_its_step_is_finished_by_the_redelivery() {
    a_run_that_died_after_its_step_is_finished_by_the_redelivery(sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_taken_over_claim_applies_nothing() {
    a_taken_over_claim_applies_nothing(sqlite().await).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_twins_apply_once() {
    let Some(shop) = postgres().await else { return };
    twins_apply_once(shop).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_run_that_died_after_its_step_is_finished_by_the_redelivery() {
    let Some(shop) = postgres().await else { return };
    a_run_that_died_after_its_step_is_finished_by_the_redelivery(shop).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_taken_over_claim_applies_nothing() {
    let Some(shop) = postgres().await else { return };
    a_taken_over_claim_applies_nothing(shop).await;
}
mod dynamodb {
    use idem::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
    use idem::aws_sdk_dynamodb::Client;
    use idem::{DynamoSteps, DynamoStore, Error, Idempotency, Steps, StoreErrorKind};
    use idem_consumer::{Consumer, Failure, Message, MessageOutcome};
    use idem_test_support::dynamodb::LoseAnAnswer;

    use super::Shop;

    #[derive(Clone)]
    pub struct DynamoShop(DynamoStore, String);

    fn add_one(table: &str, id: &str) -> TransactWriteItem {
        let update = Update::builder()
            .table_name(table)
            .key("pk", AttributeValue::S(id.to_owned()))
            .update_expression("ADD applied :one")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .unwrap();
        TransactWriteItem::builder().update(update).build()
    }

    impl Shop for DynamoShop {
        fn engine(&self) -> Idempotency {
            Idempotency::new(self.0.clone())
        }

        async fn apply(&self, steps: &Steps, id: &str) -> Result<u32, Error> {
            let write = add_one(&self.1, id);
            steps
                .dynamo_tx(&self.0, "effect", || async {
                    Ok::<_, Error>((7, vec![write]))
                })
                .await
        }

        async fn effects(&self, id: &str) -> i64 {
            let item = self
                .0
                .client()
                .get_item()
                .table_name(&self.1)
                .key("pk", AttributeValue::S(id.to_owned()))
                .consistent_read(true)
                .send()
                .await
                .unwrap()
                .item;
            match item.as_ref().and_then(|i| i.get("applied")) {
                Some(AttributeValue::N(n)) => n.parse().unwrap(),
                _ => 0,
            }
        }
    }

    pub async fn shop() -> Option<DynamoShop> {
        let endpoint = idem_test_support::setting(
            &idem_test_support::current_test(),
            "IDEM_TEST_DYNAMODB_URL",
            "IDEM_REQUIRE_DYNAMODB",
        )?;
        Some(shop_on(DynamoStore::client_from_env(&endpoint).unwrap()).await)
    }

    /// A shop on a fresh table of the server `client` reaches.
    async fn shop_on(client: Client) -> DynamoShop {
        let table = idem_test_support::unique_name("idem_cs");
        let store = DynamoStore::builder()
            .table(&table)
            .create_table_if_missing(true)
            .build(client)
            .await
            .unwrap();
        let effects = format!("{table}_effects");
        DynamoStore::create_table(store.client(), &effects)
            .await
            .unwrap();
        DynamoShop(store, effects)
    }

    /// A step's commit whose answer is lost is sent again by the SDK (standard retries), and
    /// moto, unlike DynamoDB, ignores the transaction's `ClientRequestToken`: the second copy
    /// finds the step finished, writes nothing, and is answered as done. The effect is applied
    /// once and the message is done. (The consumer_kill test met it: a commit that waited out
    /// its attempt timeout in moto's queue, sent again, applied its effect twice.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dynamodb_a_commit_sent_twice_applies_its_effect_once() {
        let Some(endpoint) = idem_test_support::setting(
            &idem_test_support::current_test(),
            "IDEM_TEST_DYNAMODB_URL",
            "IDEM_REQUIRE_DYNAMODB",
        ) else {
            return;
        };
        let lose = LoseAnAnswer::default();
        let shop = shop_on(Client::from_conf(
            idem_test_support::dynamodb::config(&endpoint)
                .interceptor(lose.clone())
                .build(),
        ))
        .await;
        let consumer = Consumer::new(shop.engine(), "effects").unwrap();
        let handler = |id: String, steps: Steps| {
            let (shop, lose) = (shop.clone(), lose.clone());
            async move {
                // Armed here, after the claim and the steps' begin: the next transaction is
                // the step's commit.
                lose.arm(&["TransactWriteItems"]);
                shop.apply(&steps, &id).await
            }
        };
        let outcomes = consumer
            .process_steps(vec![Message::keyed("m-1".to_owned(), "m-1")], handler)
            .await;
        assert_eq!(
            lose.lost(),
            ["TransactWriteItems"],
            "the commit's answer was lost, and the SDK sent it again"
        );
        assert!(
            matches!(outcomes[0], MessageOutcome::Done(7)),
            "{outcomes:?}"
        );
        assert_eq!(shop.effects("m-1").await, 1, "the effect applied once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dynamodb_twins_apply_once() {
        let Some(shop) = shop().await else { return };
        super::twins_apply_once(shop).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dynamodb_a_run_that_died_after_its_step_is_finished_by_the_redelivery() {
        let Some(shop) = shop().await else { return };
        super::a_run_that_died_after_its_step_is_finished_by_the_redelivery(shop).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dynamodb_a_taken_over_claim_applies_nothing() {
        let Some(shop) = shop().await else { return };
        super::a_taken_over_claim_applies_nothing(shop).await;
    }

    /// A write whose own condition fails cancels the step: nothing written, a `Query` store
    /// error naming the write; the key is free, so the redelivery (the condition now met) runs.
    /// And a step of more than 98 writes is refused before anything is sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dynamodb_a_refused_condition_writes_nothing() {
        let Some(shop) = shop().await else { return };
        let consumer = Consumer::new(shop.engine(), "effects").unwrap();
        let handler = |(id, guarded): (String, bool), steps: Steps| {
            let shop = shop.clone();
            async move {
                let mut writes = vec![add_one(&shop.1, &id)];
                if guarded {
                    // Passes once the item `gate` exists.
                    let check = Put::builder()
                        .table_name(&shop.1)
                        .item("pk", AttributeValue::S("gate".into()))
                        .condition_expression("attribute_exists(pk)")
                        .build()
                        .unwrap();
                    writes.push(TransactWriteItem::builder().put(check).build());
                }
                steps
                    .dynamo_tx(&shop.0, "effect", || async {
                        Ok::<_, Error>((7u32, writes))
                    })
                    .await
            }
        };
        let refused = consumer
            .process_steps(
                vec![Message::keyed(("m-5".to_owned(), true), "m-5")],
                handler,
            )
            .await;
        let MessageOutcome::Failed(Failure::Handler(Error::Store(e))) = &refused[0] else {
            panic!("{refused:?}");
        };
        assert_eq!(e.kind(), StoreErrorKind::Query, "{e}");
        assert!(e.to_string().contains("write 1"), "{e}");
        assert_eq!(shop.effects("m-5").await, 0, "nothing written");
        shop.0
            .client()
            .put_item()
            .table_name(&shop.1)
            .item("pk", AttributeValue::S("gate".into()))
            .send()
            .await
            .unwrap();
        let again = consumer
            .process_steps(
                vec![Message::keyed(("m-5".to_owned(), true), "m-5")],
                handler,
            )
            .await;
        assert!(matches!(again[0], MessageOutcome::Done(7)), "{again:?}");
        assert_eq!(shop.effects("m-5").await, 1);

        let too_many = consumer
            .process_steps(
                vec![Message::keyed("m-6".to_owned(), "m-6")],
                |id: String, steps: Steps| {
                    let shop = shop.clone();
                    async move {
                        let writes = (0..99).map(|i| add_one(&shop.1, &format!("{id}-{i}")));
                        let writes: Vec<_> = writes.collect();
                        steps
                            .dynamo_tx(&shop.0, "effect", || async {
                                Ok::<_, Error>((7u32, writes))
                            })
                            .await
                    }
                },
            )
            .await;
        let MessageOutcome::Failed(Failure::Handler(Error::Store(e))) = &too_many[0] else {
            panic!("{too_many:?}");
        };
        assert!(e.to_string().contains("at most 98"), "{e}");
        assert_eq!(shop.effects("m-6-0").await, 0, "nothing written");
    }
}

/// A handler that panics fails its message only, and leaves its key free: the redelivery runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_panicking_handler_fails_its_message_only() {
    let shop = sqlite().await;
    let consumer = Consumer::new(shop.engine(), "effects").unwrap();
    let handler = |(id, panics): (String, bool), steps: Steps| {
        let shop = shop.clone();
        async move {
            assert!(!panics, "the handler of {id} panicked");
            shop.apply(&steps, &id).await
        }
    };
    let batch = vec![
        Message::keyed(("m-7".to_owned(), true), "m-7"),
        Message::keyed(("m-8".to_owned(), false), "m-8"),
    ];
    let out = consumer.process_steps(batch, handler).await;
    assert!(
        matches!(&out[0], MessageOutcome::Failed(Failure::Panicked(m)) if m.contains("m-7")),
        "{out:?}"
    );
    assert!(matches!(out[1], MessageOutcome::Done(7)), "{out:?}");
    let again = consumer
        .process_steps(
            vec![Message::keyed(("m-7".to_owned(), false), "m-7")],
            handler,
        )
        .await;
    assert!(matches!(again[0], MessageOutcome::Done(7)), "{again:?}");
    assert_eq!(shop.effects("m-7").await, 1);
}
