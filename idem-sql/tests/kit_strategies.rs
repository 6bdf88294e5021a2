//! The concurrency kit against real databases: SQLite always, PostgreSQL when
//! `IDEM_TEST_PG_URL` is set. One suite, written once by `suite!` and instantiated per backend;
//! every test works on tables of its own (random suffix) and drops them at the end.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

use std::time::Duration;

use idem_core::kit::RetryPolicy;

/// Enough attempts for every one of `writers` contenders: each conflict of one writer is another
/// writer's success, so nobody can lose more than `writers - 1` times.
fn policy_for(writers: usize) -> RetryPolicy {
    RetryPolicy::new(u32::try_from(writers).unwrap())
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
}

macro_rules! suite {
    (
        $module:ident,
        db = $db:ty,
        pool = $pool:path,
        bigint = $bigint:literal,
        past = $past:literal,
        future = $future:literal,
        expired_ids = $expired:path $(,)?
    ) => {
        mod $module {
            use std::collections::HashSet;
            use std::sync::Arc;
            use std::time::Duration;

            use idem_core::kit::{retry_on_conflict, RecentIds, Recorded, Version};
            use idem_sql::kit::{
                Appended, ConcurrencyError, Entity, EventStreams, ExpectedVersion, Inserted,
                NewEvent, RequestHistory, SqlQuery, VersionedTable,
            };
            use idem_core::{PruneReport, PrunerConfig};
            use sqlx::{Pool, Row};
            use tokio::task::JoinSet;

            use idem_test_support::bank::{DELIVERIES, DEPOSITS, DEPOSITS_TOTAL};
            use idem_test_support::unique_name;

            use super::policy_for;

            type Db = $db;

            #[derive(Debug, Clone)]
            struct Account {
                id: String,
                balance: i64,
                recent: RecentIds,
            }

            impl Entity<Db> for Account {
                type Id = String;
                const COLUMNS: &'static [&'static str] = &["balance", "recent"];

                fn id(&self) -> &String {
                    &self.id
                }

                fn bind<'q>(&'q self, query: SqlQuery<'q, Db>) -> SqlQuery<'q, Db> {
                    let recent = serde_json::to_string(&self.recent).unwrap();
                    query.bind(self.balance).bind(recent)
                }

                fn from_row(row: &<Db as sqlx::Database>::Row) -> Result<Self, sqlx::Error> {
                    let recent: String = row.try_get("recent")?;
                    Ok(Account {
                        id: row.try_get("id")?,
                        balance: row.try_get("balance")?,
                        recent: serde_json::from_str(&recent)
                            .map_err(|e| sqlx::Error::Decode(e.into()))?,
                    })
                }
            }

            async fn exec(pool: &Pool<Db>, sql: &str) {
                sqlx::query(sql).execute(pool).await.unwrap();
            }

            async fn count(pool: &Pool<Db>, sql: &str) -> i64 {
                sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await.unwrap()
            }

            /// An accounts table holding one account "acct" at balance 0, version 1.
            async fn accounts(
                pool: &Pool<Db>,
            ) -> (String, VersionedTable<Account, Db>, Arc<String>) {
                let table = unique_name("accounts");
                exec(
                    pool,
                    &format!(
                        "CREATE TABLE {table} (id TEXT PRIMARY KEY, balance {b} NOT NULL, \
                         recent TEXT NOT NULL, version {b} NOT NULL)",
                        b = $bigint
                    ),
                )
                .await;
                let accounts = VersionedTable::<Account, Db>::new(&table).unwrap();
                let open = Account {
                    id: "acct".into(),
                    balance: 0,
                    recent: RecentIds::default(),
                };
                assert!(matches!(
                    accounts.insert(&mut *pool.acquire().await.unwrap(), open).await.unwrap(),
                    Inserted::New(v) if v.version() == Version::INITIAL
                ));
                (table, accounts, Arc::new("acct".to_string()))
            }

            async fn drop_tables(pool: &Pool<Db>, tables: &[&str]) {
                for t in tables {
                    exec(pool, &format!("DROP TABLE IF EXISTS {t}")).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn versioned_insert_load_save_and_errors() {
                let Some((pool, _dir)) = $pool("versioned_insert_load_save_and_errors").await
                else {
                    return;
                };
                let (table, accounts, id) = accounts(&pool).await;

                let again = Account { id: "acct".into(), balance: 99, recent: RecentIds::default() };
                assert!(matches!(
                    accounts.insert(&mut *pool.acquire().await.unwrap(), again).await.unwrap(),
                    Inserted::Exists(a) if a.balance == 99
                ));

                let mut fresh = accounts.load(&mut *pool.acquire().await.unwrap(), &id).await.unwrap();
                let mut stale = accounts.load(&mut *pool.acquire().await.unwrap(), &id).await.unwrap();
                fresh.balance += 5;
                assert_eq!(accounts.save(&mut *pool.acquire().await.unwrap(), &mut fresh).await.unwrap(), Version::new(2));
                assert_eq!(fresh.version(), Version::new(2));

                stale.balance += 7;
                let err = accounts.save(&mut *pool.acquire().await.unwrap(), &mut stale).await.unwrap_err();
                assert!(
                    matches!(err, ConcurrencyError::Conflict { expected, actual }
                        if expected == Version::INITIAL && actual == Version::new(2)),
                    "{err:?}"
                );
                assert_eq!(stale.version(), Version::INITIAL, "a failed save moves nothing");

                let loaded = accounts.load(&mut *pool.acquire().await.unwrap(), &id).await.unwrap();
                assert_eq!((loaded.balance, loaded.version()), (5, Version::new(2)));

                assert!(matches!(
                    accounts.load(&mut *pool.acquire().await.unwrap(), &"nobody".to_string()).await,
                    Err(ConcurrencyError::NotFound)
                ));
                let mut ghost = idem_sql::kit::Versioned::new(
                    Account { id: "nobody".into(), balance: 1, recent: RecentIds::default() },
                    Version::INITIAL,
                );
                assert!(matches!(
                    accounts.save(&mut *pool.acquire().await.unwrap(), &mut ghost).await,
                    Err(ConcurrencyError::NotFound)
                ));

                // Inside a transaction, and rolled back with it.
                let mut tx = pool.begin().await.unwrap();
                let mut in_tx = accounts.load(&mut *tx, &id).await.unwrap();
                in_tx.balance = 1_000;
                accounts.save(&mut *tx, &mut in_tx).await.unwrap();
                tx.rollback().await.unwrap();
                assert_eq!(accounts.load(&mut *pool.acquire().await.unwrap(), &id).await.unwrap().balance, 5);

                drop_tables(&pool, &[&table]).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fifty_concurrent_deposits_lose_no_update() {
                let Some((pool, _dir)) = $pool("fifty_concurrent_deposits_lose_no_update").await
                else {
                    return;
                };
                let (table, accounts, id) = accounts(&pool).await;
                let accounts = Arc::new(accounts);

                let mut tasks = JoinSet::new();
                for amount in 1..=50_i64 {
                    let (pool, accounts, id) = (pool.clone(), accounts.clone(), id.clone());
                    tasks.spawn(async move {
                        retry_on_conflict(&policy_for(50), || async {
                            let mut account = accounts.load(&mut *pool.acquire().await.unwrap(), &id).await?;
                            account.balance += amount;
                            accounts.save(&mut *pool.acquire().await.unwrap(), &mut account).await
                        })
                        .await
                    });
                }
                let mut versions = HashSet::new();
                while let Some(saved) = tasks.join_next().await {
                    let version = saved.unwrap().expect("every deposit gets through");
                    assert!(versions.insert(version), "two saves produced version {version}");
                }

                let account = accounts.load(&mut *pool.acquire().await.unwrap(), &id).await.unwrap();
                assert_eq!(account.balance, (1..=50).sum::<i64>());
                assert_eq!(account.version(), Version::new(51));
                drop_tables(&pool, &[&table]).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn history_table_applies_each_delivery_once() {
                let Some((pool, _dir)) = $pool("history_table_applies_each_delivery_once").await
                else {
                    return;
                };
                let (table, _accounts, _id) = accounts(&pool).await;
                let history_table = unique_name("history");
                let history = Arc::new(RequestHistory::<Db>::new(&history_table).unwrap());
                history.ensure_schema(&mut *pool.acquire().await.unwrap()).await.unwrap();
                let update = Arc::new(format!(
                    "UPDATE {table} SET balance = balance + $1 WHERE id = 'acct'"
                ));

                let mut tasks = JoinSet::new();
                for _ in 0..DELIVERIES {
                    for (request_id, amount) in DEPOSITS {
                        let (pool, history, update) =
                            (pool.clone(), history.clone(), update.clone());
                        tasks.spawn(async move {
                            let mut tx = pool.begin().await?;
                            let recorded = history.record(&mut *tx, "deposit", request_id).await?;
                            if recorded == Recorded::New {
                                sqlx::query(update.as_str()).bind(amount).execute(&mut *tx).await?;
                                tx.commit().await?;
                            }
                            Ok::<_, ConcurrencyError>(recorded)
                        });
                    }
                }
                let mut applied = 0;
                while let Some(outcome) = tasks.join_next().await {
                    if outcome.unwrap().unwrap() == Recorded::New {
                        applied += 1;
                    }
                }

                assert_eq!(applied, DEPOSITS.len());
                let balance =
                    count(&pool, &format!("SELECT balance FROM {table} WHERE id = 'acct'")).await;
                assert_eq!(balance, DEPOSITS_TOTAL);
                drop_tables(&pool, &[&table, &history_table, &format!("{history_table}_pruner")])
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_duplicate_in_a_transaction_leaves_it_usable() {
                let Some((pool, _dir)) = $pool("a_duplicate_in_a_transaction_leaves_it_usable").await
                else {
                    return;
                };
                let history_table = unique_name("history");
                let history = RequestHistory::<Db>::new(&history_table).unwrap();
                history.ensure_schema(&mut *pool.acquire().await.unwrap()).await.unwrap();
                let events_table = unique_name("events");
                let streams = EventStreams::<Db>::new(&events_table).unwrap();
                streams.ensure_schema(&mut *pool.acquire().await.unwrap()).await.unwrap();
                let opened = [NewEvent::json("opened", &0).unwrap()];
                let _ = history.record(&mut *pool.acquire().await.unwrap(), "deposit", "req-1").await.unwrap();
                let _ = streams
                    .append(&mut *pool.acquire().await.unwrap(), "acct", "req-1", ExpectedVersion::NoStream, &opened)
                    .await
                    .unwrap();

                let mut tx = pool.begin().await.unwrap();
                assert_eq!(
                    history.record(&mut tx, "deposit", "req-1").await.unwrap(),
                    Recorded::Duplicate
                );
                assert_eq!(
                    streams
                        .append(&mut tx, "acct", "req-1", ExpectedVersion::NoStream, &opened)
                        .await
                        .unwrap(),
                    Appended::Duplicate { first: Version::INITIAL }
                );
                assert!(matches!(
                    streams
                        .append(&mut tx, "acct", "req-2", ExpectedVersion::NoStream, &opened)
                        .await,
                    Err(ConcurrencyError::Conflict { .. })
                ));
                // Still usable: PostgreSQL would refuse this if a statement above had failed.
                assert_eq!(
                    history.record(&mut tx, "deposit", "req-2").await.unwrap(),
                    Recorded::New
                );
                tx.commit().await.unwrap();
                assert!(history.contains(&mut *pool.acquire().await.unwrap(), "deposit", "req-2").await.unwrap());
                drop_tables(
                    &pool,
                    &[&history_table, &format!("{history_table}_pruner"), &events_table],
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn event_stream_applies_each_delivery_once() {
                let Some((pool, _dir)) = $pool("event_stream_applies_each_delivery_once").await
                else {
                    return;
                };
                let events_table = unique_name("events");
                let streams = Arc::new(EventStreams::<Db>::new(&events_table).unwrap());
                streams.ensure_schema(&mut *pool.acquire().await.unwrap()).await.unwrap();
                let opened = [NewEvent::json("opened", &0_i64).unwrap()];
                let _ = streams
                    .append(&mut *pool.acquire().await.unwrap(), "acct", "open", ExpectedVersion::NoStream, &opened)
                    .await
                    .unwrap();

                let mut tasks = JoinSet::new();
                for _ in 0..DELIVERIES {
                    for (request_id, amount) in DEPOSITS {
                        let (pool, streams) = (pool.clone(), streams.clone());
                        tasks.spawn(async move {
                            let deposited = [NewEvent::json("deposited", &amount)?];
                            // Decide on the version read, as a handler rebuilding the account
                            // from its events would.
                            let appended = retry_on_conflict(&policy_for(50), || async {
                                let at = streams.version(&mut *pool.acquire().await.unwrap(), "acct").await?;
                                streams
                                    .append(&mut *pool.acquire().await.unwrap(), "acct", request_id, ExpectedVersion::Exact(at), &deposited)
                                    .await
                            })
                            .await?;
                            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(appended)
                        });
                    }
                }
                let mut new = 0;
                while let Some(outcome) = tasks.join_next().await {
                    if matches!(outcome.unwrap().unwrap(), Appended::New { .. }) {
                        new += 1;
                    }
                }
                assert_eq!(new, DEPOSITS.len());

                let events = streams.read(&mut *pool.acquire().await.unwrap(), "acct").await.unwrap();
                assert_eq!(events.len(), 1 + DEPOSITS.len());
                for (i, event) in events.iter().enumerate() {
                    assert_eq!(event.version, Version::new(i as u64 + 1), "versions have no gaps");
                }
                let balance: i64 = events.iter().map(|e| e.json::<i64>().unwrap()).sum();
                assert_eq!(balance, DEPOSITS_TOTAL);
                let requests: HashSet<_> = events.iter().map(|e| e.request_id.as_str()).collect();
                assert_eq!(requests.len(), events.len());
                drop_tables(&pool, &[&events_table]).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn recent_ids_in_the_aggregate_apply_each_delivery_once() {
                let Some((pool, _dir)) =
                    $pool("recent_ids_in_the_aggregate_apply_each_delivery_once").await
                else {
                    return;
                };
                let (table, accounts, id) = accounts(&pool).await;
                let accounts = Arc::new(accounts);

                let mut tasks = JoinSet::new();
                for _ in 0..DELIVERIES {
                    for (request_id, amount) in DEPOSITS {
                        let (pool, accounts, id) = (pool.clone(), accounts.clone(), id.clone());
                        tasks.spawn(async move {
                            retry_on_conflict(&policy_for(50), || async {
                                let mut account = accounts.load(&mut *pool.acquire().await.unwrap(), &id).await?;
                                if account.recent.insert(request_id) == Recorded::Duplicate {
                                    return Ok(false);
                                }
                                account.balance += amount;
                                accounts.save(&mut *pool.acquire().await.unwrap(), &mut account).await?;
                                Ok::<_, ConcurrencyError>(true)
                            })
                            .await
                        });
                    }
                }
                let mut applied = 0;
                while let Some(outcome) = tasks.join_next().await {
                    if outcome.unwrap().unwrap() {
                        applied += 1;
                    }
                }
                assert_eq!(applied, DEPOSITS.len());
                let account = accounts.load(&mut *pool.acquire().await.unwrap(), &id).await.unwrap();
                assert_eq!(account.balance, DEPOSITS_TOTAL);
                assert_eq!(account.recent.len(), DEPOSITS.len());
                drop_tables(&pool, &[&table]).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn appending_a_request_twice_adds_its_events_once() {
                let Some((pool, _dir)) =
                    $pool("appending_a_request_twice_adds_its_events_once").await
                else {
                    return;
                };
                let events_table = unique_name("events");
                let streams = EventStreams::<Db>::new(&events_table).unwrap();
                streams.ensure_schema(&mut *pool.acquire().await.unwrap()).await.unwrap();
                let two = [
                    NewEvent::json("opened", &0).unwrap(),
                    NewEvent::json("deposited", &10).unwrap(),
                ];

                let first = streams
                    .append(&mut *pool.acquire().await.unwrap(), "acct", "req-1", ExpectedVersion::NoStream, &two)
                    .await
                    .unwrap();
                assert_eq!(first, Appended::New { first: Version::new(1), last: Version::new(2) });
                for expected in [
                    ExpectedVersion::NoStream,
                    ExpectedVersion::Any,
                    ExpectedVersion::Exact(Version::new(2)),
                ] {
                    let again = streams.append(&mut *pool.acquire().await.unwrap(), "acct", "req-1", expected, &two).await;
                    assert_eq!(again.unwrap(), Appended::Duplicate { first: Version::INITIAL });
                }
                let stored = streams.read(&mut *pool.acquire().await.unwrap(), "acct").await.unwrap();
                assert_eq!(stored.len(), 2);
                let ids: Vec<_> =
                    idem_sql::kit::event_ids("acct", "req-1").take(2).collect();
                assert_eq!(stored.iter().map(|e| e.event_id).collect::<Vec<_>>(), ids);

                let one = [NewEvent::json("deposited", &5).unwrap()];
                for (expected, want) in [
                    (ExpectedVersion::NoStream, Version::NONE),
                    (ExpectedVersion::Exact(Version::new(1)), Version::new(1)),
                    (ExpectedVersion::Exact(Version::new(7)), Version::new(7)),
                ] {
                    let err = streams.append(&mut *pool.acquire().await.unwrap(), "acct", "req-2", expected, &one).await.unwrap_err();
                    assert!(
                        matches!(err, ConcurrencyError::Conflict { expected, actual }
                            if expected == want && actual == Version::new(2)),
                        "{err:?}"
                    );
                }
                assert_eq!(streams.version(&mut *pool.acquire().await.unwrap(), "acct").await.unwrap(), Version::new(2));
                assert_eq!(
                    streams
                        .append(&mut *pool.acquire().await.unwrap(), "acct", "req-2", ExpectedVersion::Exact(Version::new(2)), &one)
                        .await
                        .unwrap(),
                    Appended::New { first: Version::new(3), last: Version::new(3) }
                );
                assert_eq!(
                    streams.append(&mut *pool.acquire().await.unwrap(), "acct", "req-3", ExpectedVersion::Any, &one).await.unwrap(),
                    Appended::New { first: Version::new(4), last: Version::new(4) }
                );
                // The same request may write to another stream: the ids include the stream.
                assert!(matches!(
                    streams.append(&mut *pool.acquire().await.unwrap(), "other", "req-1", ExpectedVersion::NoStream, &one).await.unwrap(),
                    Appended::New { .. }
                ));
                let page = streams.read_after(&mut *pool.acquire().await.unwrap(), "acct", Version::new(1), 2).await.unwrap();
                assert_eq!(page.iter().map(|e| e.version.get()).collect::<Vec<_>>(), [2, 3]);

                assert!(matches!(
                    streams.append(&mut *pool.acquire().await.unwrap(), "acct", "req-4", ExpectedVersion::Any, &[]).await,
                    Err(ConcurrencyError::InvalidInput(_))
                ));
                assert!(matches!(
                    streams.append(&mut *pool.acquire().await.unwrap(), "acct", "bad\nid", ExpectedVersion::Any, &one).await,
                    Err(ConcurrencyError::InvalidKey(_))
                ));
                assert_eq!(streams.version(&mut *pool.acquire().await.unwrap(), "acct").await.unwrap(), Version::new(4));
                drop_tables(&pool, &[&events_table]).await;
            }

            async fn history_with(pool: &Pool<Db>) -> (String, RequestHistory<Db>) {
                let table = unique_name("history");
                let history = RequestHistory::<Db>::new(&table).unwrap();
                history.ensure_schema(&mut *pool.acquire().await.unwrap()).await.unwrap();
                (table, history)
            }

            fn hour() -> Duration {
                Duration::from_secs(3600)
            }

            /// Batches without a pause between them: these tests drain whole tables.
            fn back_to_back() -> PrunerConfig {
                PrunerConfig::new().pause(Duration::ZERO)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn two_pruners_delete_exactly_the_expired_ids_while_new_ones_arrive() {
                let Some((pool, _dir)) = $pool(
                    "two_pruners_delete_exactly_the_expired_ids_while_new_ones_arrive",
                )
                .await
                else {
                    return;
                };
                let (table, history) = history_with(&pool).await;
                exec(&pool, &$expired(&table, 5_000)).await;
                let config = back_to_back().batch_size(500).interval(hour());
                let mut a = history.pruner(pool.clone(), hour(), config.clone()).unwrap().spawn();
                let mut b = history.pruner(pool.clone(), hour(), config).unwrap().spawn();

                let history = Arc::new(history);
                let mut inserts = JoinSet::new();
                for worker in 0..4 {
                    let (pool, history) = (pool.clone(), history.clone());
                    inserts.spawn(async move {
                        for i in 0..250 {
                            let id = format!("fresh-{worker}-{i}");
                            assert_eq!(
                                history.record(&mut *pool.acquire().await.unwrap(), "deposit", &id).await.unwrap(),
                                Recorded::New
                            );
                        }
                    });
                }
                let (ra, rb) = tokio::join!(a.next_report(), b.next_report());
                while let Some(done) = inserts.join_next().await {
                    done.unwrap();
                }
                a.shutdown().await;
                b.shutdown().await;

                let reports: Vec<PruneReport> = [ra, rb].into_iter().map(Option::unwrap).collect();
                assert_eq!(reports.iter().map(|r| r.deleted).sum::<u64>(), 5_000, "{reports:?}");
                assert!(reports.iter().any(|r| !r.skipped && r.drained), "{reports:?}");
                assert!(reports.iter().all(|r| r.largest_batch <= 500), "{reports:?}");
                assert_eq!(count(&pool, &format!("SELECT COUNT(*) FROM {table}")).await, 1_000);
                assert_eq!(
                    count(&pool, &format!("SELECT COUNT(*) FROM {table} WHERE request_id LIKE 'fresh-%'")).await,
                    1_000
                );
                drop_tables(&pool, &[&table, &format!("{table}_pruner")]).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn pruning_a_hundred_thousand_ids_runs_in_bounded_batches() {
                let Some((pool, _dir)) =
                    $pool("pruning_a_hundred_thousand_ids_runs_in_bounded_batches").await
                else {
                    return;
                };
                let (table, history) = history_with(&pool).await;
                exec(&pool, &$expired(&table, 100_000)).await;
                for i in 0..10 {
                    let _ = history.record(&mut *pool.acquire().await.unwrap(), "deposit", &format!("fresh-{i}")).await.unwrap();
                }
                let pruner = history.pruner(pool.clone(), hour(),
                    back_to_back().batch_size(1_000),
                )
                .unwrap();

                let report = pruner.run_once().await.unwrap();
                assert_eq!(report.deleted, 100_000);
                assert_eq!(report.batches, 100);
                assert_eq!(report.largest_batch, 1_000);
                assert!(report.drained && !report.skipped);
                assert_eq!(count(&pool, &format!("SELECT COUNT(*) FROM {table}")).await, 10);

                let again = pruner.run_once().await.unwrap();
                assert_eq!((again.deleted, again.batches, again.drained), (0, 0, true));
                drop_tables(&pool, &[&table, &format!("{table}_pruner")]).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_history_pruner_paces_and_caps_its_batches() {
                let Some((pool, _dir)) =
                    $pool("a_history_pruner_paces_and_caps_its_batches").await
                else {
                    return;
                };
                let (table, history) = history_with(&pool).await;
                exec(&pool, &$expired(&table, 250)).await;
                let pause = Duration::from_millis(100);
                let config = PrunerConfig::new().batch_size(100).pause(pause);
                let capped = history.pruner(pool.clone(), hour(), config.clone().max_batches(2))
                    .unwrap();

                let first = capped.run_once().await.unwrap();
                assert_eq!((first.deleted, first.batches, first.drained), (200, 2, false));
                assert!(first.elapsed >= pause, "one pause between the two batches: {first:?}");
                assert_eq!(count(&pool, &format!("SELECT COUNT(*) FROM {table}")).await, 50);
                let rest = capped.run_once().await.unwrap();
                assert_eq!((rest.deleted, rest.batches, rest.drained), (50, 1, true));

                // Without a lease a pruner runs even while another holds it, and leaves it be.
                exec(&pool, &$expired(&table, 250)).await;
                exec(
                    &pool,
                    &format!("UPDATE {table}_pruner SET holder = 'elsewhere', lease_until = {}", $future),
                )
                .await;
                let unleased = history.pruner(pool.clone(), hour(), config.without_lease())
                    .unwrap();
                let paced = unleased.run_once().await.unwrap();
                assert_eq!(
                    (paced.deleted, paced.batches, paced.drained, paced.skipped),
                    (250, 3, true, false)
                );
                assert!(paced.elapsed >= pause * 2, "a pause after each full batch: {paced:?}");
                assert_eq!(
                    count(&pool, &format!("SELECT COUNT(*) FROM {table}_pruner WHERE holder = 'elsewhere'")).await,
                    1
                );
                drop_tables(&pool, &[&table, &format!("{table}_pruner")]).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_pruner_skips_while_another_holds_the_lease() {
                let Some((pool, _dir)) =
                    $pool("a_pruner_skips_while_another_holds_the_lease").await
                else {
                    return;
                };
                let (table, history) = history_with(&pool).await;
                exec(&pool, &$expired(&table, 10)).await;
                exec(
                    &pool,
                    &format!(
                        "INSERT INTO {table}_pruner (id, holder, lease_until) VALUES (1, 'elsewhere', {})",
                        $future
                    ),
                )
                .await;
                let pruner =
                    history.pruner(pool.clone(), hour(), PrunerConfig::new()).unwrap();

                let skipped = pruner.run_once().await.unwrap();
                assert!(skipped.skipped && !skipped.drained);
                assert_eq!(skipped.deleted, 0);
                assert_eq!(count(&pool, &format!("SELECT COUNT(*) FROM {table}")).await, 10);

                // The other holder crashed: its lease runs out and this pruner takes over.
                exec(&pool, &format!("UPDATE {table}_pruner SET lease_until = {}", $past)).await;
                let ran = pruner.run_once().await.unwrap();
                assert_eq!((ran.deleted, ran.skipped), (10, false));
                drop_tables(&pool, &[&table, &format!("{table}_pruner")]).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_spawned_pruner_runs_on_start_and_every_interval() {
                let Some((pool, _dir)) =
                    $pool("a_spawned_pruner_runs_on_start_and_every_interval").await
                else {
                    return;
                };
                let (table, history) = history_with(&pool).await;
                exec(&pool, &$expired(&table, 3)).await;
                let config = PrunerConfig::new().interval(Duration::from_millis(50));
                let mut handle = history.pruner(pool.clone(), hour(), config).unwrap().spawn();

                // The handle keeps the latest report only: a test thread slower than the 50 ms
                // interval sees a later run's. Any successful run deleted what had expired
                // before it, so the table tells that the run on start did.
                let rows = format!("SELECT COUNT(*) FROM {table}");
                let first = tokio::time::timeout(Duration::from_secs(30), handle.next_report())
                    .await
                    .unwrap()
                    .unwrap();
                assert!(!first.skipped);
                assert_eq!(count(&pool, &rows).await, 0);

                exec(&pool, &$expired(&table, 4)).await;
                // Runs keep coming every 50 ms; wait (bounded) for one that deletes the new ids.
                for _ in 0..200 {
                    tokio::time::timeout(Duration::from_secs(30), handle.next_report())
                        .await
                        .unwrap()
                        .unwrap();
                    if count(&pool, &rows).await == 0 {
                        break;
                    }
                }
                assert_eq!(count(&pool, &rows).await, 0);
                handle.shutdown().await;
                // The lease was released on the way out: another pruner may run at once.
                let next = history.pruner(pool.clone(), hour(), PrunerConfig::new())
                    .unwrap()
                    .run_once()
                    .await
                    .unwrap();
                assert!(!next.skipped);
                drop_tables(&pool, &[&table, &format!("{table}_pruner")]).await;
            }
        }
    };
}

#[cfg(feature = "sqlite")]
mod sqlite_support {
    use std::time::Duration;

    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

    /// A database file of its own in WAL mode, with room for concurrent connections.
    pub async fn pool(_test: &str) -> Option<(SqlitePool, Option<tempfile::TempDir>)> {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("kit.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(60));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .unwrap();
        Some((pool, Some(dir)))
    }

    pub fn expired_ids(table: &str, n: u32) -> String {
        format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n}) \
             INSERT INTO {table} (scope, request_id, created_at) \
             SELECT 'deposit', 'old-' || hex(randomblob(8)) || '-' || i, \
                    CAST(unixepoch('subsec') * 1000 AS INTEGER) - 7200000 FROM n"
        )
    }
}

#[cfg(feature = "sqlite")]
suite!(
    sqlite,
    db = sqlx::Sqlite,
    pool = crate::sqlite_support::pool,
    bigint = "INTEGER",
    past = "(CAST(unixepoch('subsec') * 1000 AS INTEGER) - 7200000)",
    future = "(CAST(unixepoch('subsec') * 1000 AS INTEGER) + 3600000)",
    expired_ids = crate::sqlite_support::expired_ids,
);

#[cfg(feature = "postgres")]
mod postgres_support {
    use sqlx::postgres::{PgPool, PgPoolOptions};

    /// The server of `IDEM_TEST_PG_URL`; without it the test is skipped, unless
    /// `IDEM_REQUIRE_PG=1` makes that a failure.
    pub async fn pool(test: &str) -> Option<(PgPool, Option<tempfile::TempDir>)> {
        let url = idem_test_support::postgres::pg_url(test)?;
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect(&url)
            .await
            .unwrap();
        Some((pool, None))
    }

    pub fn expired_ids(table: &str, n: u32) -> String {
        format!(
            "INSERT INTO {table} (scope, request_id, created_at) \
             SELECT 'deposit', 'old-' || md5(random()::text) || '-' || i, \
                    clock_timestamp() - interval '2 hours' \
             FROM generate_series(1, {n}) AS i"
        )
    }
}

#[cfg(feature = "postgres")]
suite!(
    postgres,
    db = sqlx::Postgres,
    pool = crate::postgres_support::pool,
    bigint = "BIGINT",
    past = "(clock_timestamp() - interval '2 hours')",
    future = "(clock_timestamp() + interval '1 hour')",
    expired_ids = crate::postgres_support::expired_ids,
);
