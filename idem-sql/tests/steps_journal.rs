//! How the SQL stores keep an operation's steps (docs/steps.md, "How a SQL store keeps them"):
//! a finished step is an entry appended to the journal in the claim's own record, one `UPDATE`
//! of the row it holds, not a row of its own; journals of the steps table's `''` row (schema
//! version 4) and steps in rows of their own (a begin, a large result, a store of an earlier
//! shape) are read beside it; a journal write is fenced by the record; and the record stays,
//! lapsed, while its journal is kept, for the claim that resumes it. Each test runs on SQLite
//! and on PostgreSQL.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Claim, ClaimOutcome, ClaimRequest, Error, Idempotency, Key, StepState, StepWrite, Store,
};
use idem_sql::{PostgresStore, SqliteStore};
use idem_test_support::postgres::{drop_store_tables, fresh_store, pg_url};

const DAY: Duration = Duration::from_secs(86_400);

/// A store under test, with its pool for the statements that look at (or write) its tables as
/// another process would.
enum Db {
    Sqlite {
        store: SqliteStore,
        _dir: tempfile::TempDir,
    },
    Postgres(PostgresStore),
}

impl Db {
    async fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::builder()
            .pruner(None)
            .open(dir.path().join("idem.db"))
            .await
            .unwrap();
        Db::Sqlite { store, _dir: dir }
    }

    async fn postgres(test: &str) -> Option<Db> {
        let url = pg_url(test)?;
        Some(Db::Postgres(fresh_store(&url, |b| b.pruner(None)).await))
    }

    fn store(&self) -> Arc<dyn Store> {
        match self {
            Db::Sqlite { store: s, .. } => Arc::new(s.clone()),
            Db::Postgres(s) => Arc::new(s.clone()),
        }
    }

    fn table(&self) -> &str {
        match self {
            Db::Sqlite { store: s, .. } => s.table(),
            Db::Postgres(s) => s.table(),
        }
    }

    /// `{t}` and `{s}` in `sql` are the records and steps tables, `{later}` a time a minute
    /// on and `{earlier}` one a second back, in the database's own type.
    fn sql(&self, sql: &str) -> String {
        let (later, earlier) = match self {
            Db::Sqlite { .. } => (
                "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + 60000)",
                "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - 1000)",
            ),
            Db::Postgres(_) => (
                "(clock_timestamp() + interval '1 minute')",
                "(clock_timestamp() - interval '1 second')",
            ),
        };
        sql.replace("{t}", &format!("\"{}\"", self.table()))
            .replace("{s}", &format!("\"{}_steps\"", self.table()))
            .replace("{later}", later)
            .replace("{earlier}", earlier)
    }

    /// Runs `sql` with the operation's key as `$1` (and `token` as `$2`): rows changed.
    async fn exec(&self, sql: &str, key: &Key, token: &[u8]) -> u64 {
        let sql = self.sql(sql);
        let key = &key.as_bytes()[..];
        match self {
            Db::Sqlite { store: s, .. } => sqlx::query(&sql)
                .bind(key)
                .bind(token)
                .execute(s.pool())
                .await
                .unwrap()
                .rows_affected(),
            Db::Postgres(s) => sqlx::query(&sql)
                .bind(key)
                .bind(token)
                .execute(s.pool())
                .await
                .unwrap()
                .rows_affected(),
        }
    }

    /// Ends the lease of `key`'s record, as its time passing would.
    async fn end_lease(&self, key: &Key) {
        let sql = "UPDATE {t} SET expires_at = {earlier} WHERE key = $1";
        assert_eq!(self.exec(sql, key, &[]).await, 1, "no record of the key");
    }

    /// The names of the steps table's rows of `key`, in order.
    async fn step_rows(&self, key: &Key) -> Vec<String> {
        let sql = self.sql("SELECT name FROM {s} WHERE key = $1 ORDER BY name");
        let key = &key.as_bytes()[..];
        match self {
            Db::Sqlite { store: s, .. } => sqlx::query_scalar(&sql)
                .bind(key)
                .fetch_all(s.pool())
                .await
                .unwrap(),
            Db::Postgres(s) => sqlx::query_scalar(&sql)
                .bind(key)
                .fetch_all(s.pool())
                .await
                .unwrap(),
        }
    }

    async fn end(self) {
        if let Db::Postgres(store) = self {
            drop_store_tables(&store).await;
        }
    }
}

/// Runs `test` on SQLite, then on PostgreSQL.
macro_rules! on_both {
    ($name:ident, $test:ident) => {
        #[tokio::test]
        async fn $name() {
            let db = Db::sqlite().await;
            $test(&db).await;
            db.end().await;
            if let Some(db) = Db::postgres(stringify!($name)).await {
                $test(&db).await;
                db.end().await;
            }
        }
    };
}

async fn claim(store: &dyn Store, key: &Key, lease: Duration) -> Claim {
    match store.claim(ClaimRequest::new(key, lease)).await.unwrap() {
        ClaimOutcome::Claimed(claim) => claim,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// A claim of a new key `name` on `db`'s store, with its steps begun.
async fn begun(db: &Db, name: &str) -> (Arc<dyn Store>, Key, Claim) {
    let store = db.store();
    let key = Key::derive("journal", "", name).unwrap();
    let claim = claim(&*store, &key, DAY).await;
    store.begin_steps(&claim, DAY).await.unwrap();
    (store, key, claim)
}

fn finished<'a>(name: &'a str, position: u32, result: &'a [u8]) -> StepWrite<'a> {
    StepWrite::new(name, position, Some(result), DAY)
}

/// The steps of a log as (name, position, result), by position; `None` for one begun only.
fn steps_of(log: &idem_core::StepLog) -> Vec<(String, u32, Option<Vec<u8>>)> {
    log.steps
        .iter()
        .map(|s| {
            let result = match &s.state {
                StepState::Finished(r) => Some(r.clone()),
                StepState::Begun => None,
            };
            (s.name.clone(), s.position, result)
        })
        .collect()
}

on_both!(
    each_finished_step_is_an_entry_of_the_operations_row,
    finished_steps_are_entries_of_one_row
);

/// Three steps through the engine, the third failing: the operation's steps are its one `''`
/// row (a row each before the journal), and the retry replays the two finished steps from it
/// without running them.
async fn finished_steps_are_entries_of_one_row(db: &Db) {
    let engine = Idempotency::from_arc(db.store());
    let key = Key::derive("journal", "", "three").unwrap();
    let runs = AtomicUsize::new(0);
    let operation = |fail: bool| {
        let runs = &runs;
        engine.call(key).run_steps(move |steps| async move {
            let mut total = 0u32;
            for (i, name) in ["create", "charge"].into_iter().enumerate() {
                total += steps
                    .run(name, || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Error>(i as u32 + 1)
                    })
                    .await?;
            }
            if fail {
                return Err(Error::InvalidConfig("the third step failed".into()));
            }
            Ok::<_, Error>(total)
        })
    };
    assert!(operation(true).await.is_err());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(db.step_rows(&key).await, [""], "one row for the operation");
    let done = operation(false).await.unwrap();
    assert_eq!(done.into_inner(), 3);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the finished steps replayed"
    );
}

on_both!(
    steps_in_rows_of_their_own_are_read_beside_the_journal,
    rows_of_their_own_are_read_beside_the_journal
);

/// A step written as a store of the earlier shape wrote it (a row of its own, finished) is read
/// back with the journal's, by position, and one written before the steps began is in the
/// journal (its write created the `''` row); a step finished in its own row keeps that result
/// when the journal has it too.
async fn rows_of_their_own_are_read_beside_the_journal(db: &Db) {
    let store = db.store();
    let key = Key::derive("journal", "", "mixed").unwrap();
    let first = claim(&*store, &key, DAY).await;
    // Before the steps began: no `''` row yet, so this write creates it.
    store
        .write_step(&first, finished("early", 0, b"e"))
        .await
        .unwrap();
    store.begin_steps(&first, DAY).await.unwrap();
    let token = first.token().to_bytes();
    let written = db
        .exec(
            "INSERT INTO {s} (key, name, position, token, attempt, finished, result, expires_at) \
             VALUES ($1, 'legacy', 1, $2, 0, true, $2, {later})",
            &key,
            &token,
        )
        .await;
    assert_eq!(written, 1);
    store
        .write_step(&first, finished("late", 2, b"l"))
        .await
        .unwrap();
    // Written again into the journal: the row's result stands.
    store
        .write_step(&first, finished("legacy", 1, b"other"))
        .await
        .unwrap();
    assert_eq!(db.step_rows(&key).await, ["", "legacy"]);
    store.abort(&first).await.unwrap();

    let retry = claim(&*store, &key, DAY).await;
    let log = store.begin_steps(&retry, DAY).await.unwrap();
    assert_eq!(log.attempt, 2);
    assert_eq!(
        steps_of(&log),
        [
            ("early".to_owned(), 0, Some(b"e".to_vec())),
            ("legacy".to_owned(), 1, Some(token.to_vec())),
            ("late".to_owned(), 2, Some(b"l".to_vec())),
        ]
    );
}

on_both!(
    a_journal_write_of_a_claim_taken_over_writes_nothing,
    journal_write_is_fenced_by_the_record
);

/// A claim whose lease ended and whose key was claimed again (the new holder not having begun
/// the steps, so the `''` row still carries the old token) writes nothing to the journal: the
/// record no longer carries its token. The new holder's begin reads only the step written
/// while the old claim held.
async fn journal_write_is_fenced_by_the_record(db: &Db) {
    let (store, key, old) = begun(db, "fenced").await;
    store
        .write_step(&old, finished("create", 0, b"1"))
        .await
        .unwrap();
    // The lease ends (as its time passing would), and another claim takes the key.
    db.end_lease(&key).await;
    let new = claim(&*store, &key, DAY).await;
    let stale = store.write_step(&old, finished("charge", 1, b"2")).await;
    assert!(matches!(stale, Err(Error::LeaseLost)), "{stale:?}");
    assert_eq!(db.step_rows(&key).await, [""], "nothing written");
    let log = store.begin_steps(&new, DAY).await.unwrap();
    assert_eq!(log.attempt, 2);
    assert_eq!(
        steps_of(&log),
        [("create".to_owned(), 0, Some(b"1".to_vec()))]
    );
}

on_both!(
    large_results_are_rows_of_their_own_past_the_journals_bound,
    large_results_past_the_bound
);

/// The journal is rewritten at each step, so it is bounded (16 KiB): a result that would take
/// it past that is a row of its own, written once. Every result reads back whole, wherever it
/// was kept.
async fn large_results_past_the_bound(db: &Db) {
    let (store, key, first) = begun(db, "large").await;
    let results: Vec<Vec<u8>> = [7_000, 7_000, 7_000, 20_000, 10]
        .iter()
        .zip(1u8..)
        .map(|(&n, b)| vec![b; n])
        .collect();
    let names = ["a", "b", "c", "d", "e"];
    for ((name, result), position) in names.iter().zip(&results).zip(0u32..) {
        store
            .write_step(&first, finished(name, position, result))
            .await
            .unwrap();
    }
    // a and b fit, c would pass the bound, d is past it alone, e fits again.
    assert_eq!(db.step_rows(&key).await, ["", "c", "d"]);
    store.abort(&first).await.unwrap();
    let retry = claim(&*store, &key, DAY).await;
    let log = store.begin_steps(&retry, DAY).await.unwrap();
    let expected: Vec<_> = names
        .iter()
        .zip(&results)
        .zip(0u32..)
        .map(|((name, result), position)| ((*name).to_owned(), position, Some(result.clone())))
        .collect();
    assert_eq!(steps_of(&log), expected);
}

/// PostgreSQL: a journal write whose statement runs while a takeover is in flight (its
/// transaction not committed yet) waits for that takeover, as it updates the record the
/// takeover holds, and then writes nothing: the record carries the new claim's token. Its
/// entry is not in the new holder's log.
#[tokio::test]
async fn postgres_a_journal_write_racing_a_takeover_waits_and_is_refused() {
    use idem_sql::TransactionalStore;
    let Some(db) =
        Db::postgres("postgres_a_journal_write_racing_a_takeover_waits_and_is_refused").await
    else {
        return;
    };
    let Db::Postgres(pg) = &db else {
        unreachable!("Db::postgres makes a PostgreSQL store")
    };
    let (store, key, old) = begun(&db, "racing").await;
    db.end_lease(&key).await;
    let mut takeover = pg.pool().begin().await.unwrap();
    let new = match pg
        .claim_in(&mut takeover, ClaimRequest::new(&key, DAY))
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed(claim) => claim,
        other => panic!("expected the takeover to claim, got {other:?}"),
    };
    let writer = store.clone();
    let write =
        tokio::spawn(async move { writer.write_step(&old, finished("create", 0, b"1")).await });
    // The write waits for the takeover's row lock: seen waiting for a lock (bounded: 30 s).
    let mut waiting = false;
    for _ in 0..3_000 {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND position($1 in query) > 0 \
               AND query LIKE 'UPDATE%journal%'",
        )
        .bind(pg.table())
        .fetch_one(pg.pool())
        .await
        .unwrap();
        if n > 0 || write.is_finished() {
            waiting = n > 0;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waiting, "the journal write did not wait for the takeover");
    takeover.commit().await.unwrap();
    let stale = tokio::time::timeout(Duration::from_secs(30), write)
        .await
        .expect("the journal write ends once the takeover committed")
        .unwrap();
    assert!(matches!(stale, Err(Error::LeaseLost)), "{stale:?}");
    let log = store.begin_steps(&new, DAY).await.unwrap();
    assert_eq!((log.attempt, log.steps.len()), (2, 0), "{log:?}");
    db.end().await;
}

/// `claim_steps` of `key`: the claim and its log (the claim must win).
async fn claim_steps(store: &dyn Store, key: &Key) -> (Claim, idem_core::StepLog) {
    match store
        .claim_steps(ClaimRequest::new(key, DAY), DAY)
        .await
        .unwrap()
    {
        (ClaimOutcome::Claimed(claim), Some(log)) => (claim, log),
        other => panic!("expected a claim with its log, got {other:?}"),
    }
}

on_both!(
    a_new_operation_is_claimed_and_begun_without_a_steps_row,
    new_operation_writes_no_steps_row
);

/// A new operation's claim begins its steps without writing to the steps table (its log is
/// attempt 1, no steps, as the hand-written claim writes the record alone), and its finished
/// steps go to its record's journal, not the steps table; the claim's own begin reads them.
/// Released, the record stays (the key free: no record to `get`, the released claim's writes
/// refused), and the next claim takes it over with the journal, attempt 2.
async fn new_operation_writes_no_steps_row(db: &Db) {
    let store = db.store();
    let key = Key::derive("journal", "", "lazy").unwrap();
    let (first, log) = claim_steps(&*store, &key).await;
    assert_eq!((log.attempt, log.steps.len()), (1, 0), "{log:?}");
    assert!(db.step_rows(&key).await.is_empty(), "no steps row yet");
    store
        .write_step(&first, finished("create", 0, b"1"))
        .await
        .unwrap();
    assert!(
        db.step_rows(&key).await.is_empty(),
        "the entry is the record's"
    );
    let log = store.begin_steps(&first, DAY).await.unwrap();
    assert_eq!(log.attempt, 1);
    assert_eq!(
        steps_of(&log),
        [("create".to_owned(), 0, Some(b"1".to_vec()))]
    );
    store.abort(&first).await.unwrap();
    assert!(store.get(&key).await.unwrap().is_none(), "released");
    let late = store.write_step(&first, finished("charge", 1, b"2")).await;
    assert!(matches!(late, Err(Error::LeaseLost)), "{late:?}");
    let (_, log) = claim_steps(&*store, &key).await;
    assert_eq!(log.attempt, 2);
    assert_eq!(
        steps_of(&log),
        [("create".to_owned(), 0, Some(b"1".to_vec()))]
    );
}

on_both!(
    a_lapsed_claim_stays_while_its_journal_is_kept,
    lapsed_claim_with_a_journal_is_not_pruned
);

/// The pruner removes a claim that lapsed longer ago than a late holder may complete it, but
/// not while its steps' journal is kept: the claim that resumes the operation takes it over
/// with the journal. Once the journal's retention ended, the record goes.
async fn lapsed_claim_with_a_journal_is_not_pruned(db: &Db) {
    let store = db.store();
    let key = Key::derive("journal", "", "lapsed-long-ago").unwrap();
    let (first, _) = claim_steps(&*store, &key).await;
    store
        .write_step(&first, finished("create", 0, b"1"))
        .await
        .unwrap();
    let long_ago = match db {
        Db::Sqlite { .. } => "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - 2 * 86400000)",
        Db::Postgres(_) => "(clock_timestamp() - interval '2 days')",
    };
    let lapsed = format!("UPDATE {{t}} SET expires_at = {long_ago} WHERE key = $1");
    assert_eq!(db.exec(&lapsed, &key, &[]).await, 1);
    store.prune_expired(100).await.unwrap();
    let (second, log) = claim_steps(&*store, &key).await;
    assert_eq!(log.attempt, 2);
    assert_eq!(
        steps_of(&log),
        [("create".to_owned(), 0, Some(b"1".to_vec()))]
    );

    // Lapsed again, and its journal's retention over: pruned.
    assert_eq!(db.exec(&lapsed, &key, &[]).await, 1);
    let ended = "UPDATE {t} SET journal_until = {earlier} WHERE key = $1";
    assert_eq!(db.exec(ended, &key, &[]).await, 1);
    let pruned = store.prune_expired(100).await.unwrap();
    let row = "UPDATE {t} SET expires_at = expires_at WHERE key = $1";
    assert_eq!(db.exec(row, &key, &[]).await, 0, "pruned ({pruned} rows)");
    let stale = store.write_step(&second, finished("charge", 1, b"2")).await;
    assert!(matches!(stale, Err(Error::LeaseLost)), "{stale:?}");
}

on_both!(
    a_new_life_of_a_key_starts_without_the_journal,
    new_life_starts_without_a_journal
);

/// A completed record whose retention ended is replaced by the next claim of its key, which
/// starts a new operation: the journal of the one before is not resumed.
async fn new_life_starts_without_a_journal(db: &Db) {
    let store = db.store();
    let key = Key::derive("journal", "", "lives").unwrap();
    let (first, _) = claim_steps(&*store, &key).await;
    store
        .write_step(&first, finished("create", 0, b"1"))
        .await
        .unwrap();
    let done = idem_core::Completion {
        response: Some(b"done"),
        is_error: false,
        retention: DAY,
        key_retention: Duration::ZERO,
    };
    store.complete(&first, done).await.unwrap();
    let ended = "UPDATE {t} SET expires_at = {earlier}, result_until = {earlier} WHERE key = $1";
    assert_eq!(db.exec(ended, &key, &[]).await, 1);
    let (second, log) = claim_steps(&*store, &key).await;
    assert_eq!((log.attempt, log.steps.len()), (1, 0), "{log:?}");
    // Nor does a begin of the new claim (after a failed step, say) find it.
    let log = store.begin_steps(&second, DAY).await.unwrap();
    assert!(log.steps.is_empty(), "{log:?}");
}

on_both!(
    a_journal_of_the_steps_row_is_read_before_the_records,
    steps_row_journal_is_read_first
);

/// A journal written by schema version 4 (in the steps table's `''` row) is read, before the
/// record's: a step in both keeps the older result, and each is read once.
async fn steps_row_journal_is_read_first(db: &Db) {
    let (store, key, first) = begun(db, "upgraded").await;
    // One entry, as version 4 wrote it: position, name and result, lengths big-endian.
    let mut entry = 0u32.to_be_bytes().to_vec();
    entry.extend(1u16.to_be_bytes());
    entry.extend(b"a");
    entry.extend(3u32.to_be_bytes());
    entry.extend(b"old");
    let written = db
        .exec(
            "UPDATE {s} SET journal = $2 WHERE key = $1 AND name = ''",
            &key,
            &entry,
        )
        .await;
    assert_eq!(written, 1);
    store
        .write_step(&first, finished("a", 0, b"new"))
        .await
        .unwrap();
    store
        .write_step(&first, finished("b", 1, b"b"))
        .await
        .unwrap();
    let log = store.begin_steps(&first, DAY).await.unwrap();
    assert_eq!(
        steps_of(&log),
        [
            ("a".to_owned(), 0, Some(b"old".to_vec())),
            ("b".to_owned(), 1, Some(b"b".to_vec())),
        ]
    );
}

on_both!(
    an_attempt_that_stored_nothing_is_counted_when_its_claim_is_taken_over,
    taken_over_attempt_is_counted
);

/// A first attempt that began its steps without a steps row and stored nothing before its
/// holder died is still an attempt: the claim that takes its lapsed record over is attempt 2,
/// through `claim_steps` and through a bare claim with `begin_steps`, where its steps rows
/// (an at-most-once step's begin) tell of it.
async fn taken_over_attempt_is_counted(db: &Db) {
    let store = db.store();
    let key = Key::derive("journal", "", "died").unwrap();
    claim_steps(&*store, &key).await;
    db.end_lease(&key).await;
    let (second, log) = claim_steps(&*store, &key).await;
    assert_eq!((log.attempt, log.steps.len()), (2, 0), "{log:?}");
    assert_eq!(store.begin_steps(&second, DAY).await.unwrap().attempt, 2);

    let other = Key::derive("journal", "", "died-after-a-begin").unwrap();
    let (first, _) = claim_steps(&*store, &other).await;
    let begun = StepWrite::new("charge", 0, None, DAY);
    store.write_step(&first, begun).await.unwrap();
    db.end_lease(&other).await;
    let second = claim(&*store, &other, DAY).await;
    let log = store.begin_steps(&second, DAY).await.unwrap();
    assert_eq!(log.attempt, 2, "{log:?}");
    assert_eq!(steps_of(&log), [("charge".to_owned(), 0, None)]);
}

on_both!(
    an_attempt_that_failed_having_stored_nothing_is_counted,
    failed_attempt_is_counted
);

/// Through the engine: a first attempt whose first step fails (so it stored nothing) releases
/// its claim, and the retry is attempt 2 all the same.
async fn failed_attempt_is_counted(db: &Db) {
    let engine = Idempotency::from_arc(db.store());
    let key = Key::derive("journal", "", "failed").unwrap();
    let attempt = |fail: bool| {
        engine.call(key).run_steps(move |steps| async move {
            let number = steps.attempt().number;
            steps
                .run("charge", || async move {
                    match fail {
                        true => Err(Error::InvalidConfig("the card was declined".into())),
                        false => Ok(number),
                    }
                })
                .await
        })
    };
    assert!(attempt(true).await.is_err());
    assert_eq!(attempt(false).await.unwrap().into_inner(), 2);
}

on_both!(
    a_first_attempt_that_stored_only_its_input_is_found_abandoned,
    input_only_attempt_is_abandoned
);

/// An operation whose first attempt stored its input (`run_steps_with`) and died before any
/// step finished has no `''` row; the completer's query finds it all the same.
async fn input_only_attempt_is_abandoned(db: &Db) {
    let store = db.store();
    let key = Key::derive("journal", "", "input").unwrap();
    let (first, _) = claim_steps(&*store, &key).await;
    let input = idem_core::Abandoned::encode_input("rides", b"{\"ride\":7}");
    let write = StepWrite::new(idem_core::INPUT_STEP, i32::MAX as u32, Some(&input), DAY);
    store.write_step(&first, write).await.unwrap();
    assert_eq!(db.step_rows(&key).await, [idem_core::INPUT_STEP]);
    db.end_lease(&key).await;
    let found = store
        .find_abandoned(idem_core::AbandonedQuery::first(10))
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].key, key);
    assert_eq!(found[0].input, b"{\"ride\":7}");
}
