//! `cargo run --example bank`
//!
//! The bank account of "Retry Requests Fearlessly with Idempotence" (open an account, deposit,
//! withdraw), protected against duplicate deliveries by each strategy the article describes,
//! side by side:
//!
//! 1. natural idempotency: opening an account by id is an insert-if-absent;
//! 2. expected version: a change names the version it was based on (versioned update), and
//!    writers that should simply win retry on conflict;
//! 3. a request-id history table, written in the same transaction as the business change;
//! 4. an event stream whose event ids derive from the request id, so a duplicate append is
//!    caught by a unique key;
//! 5. recent request ids kept inside the aggregate, for stores without transactions;
//! 6. `#[idempotent(transaction = …)]`: idem's claim, the change and the stored answer commit in
//!    one transaction.
//!
//! Each strategy gets the same requests, each delivered 10 times at once (as an impatient client
//! or an at-least-once queue would), and the example checks that every request took effect
//! exactly once; it exits with an error otherwise.
//!
//! The database is SQLite in a temporary file, or the one a URL names:
//!
//! ```text
//! cargo run --example bank
//! cargo run --example bank --features postgres -- --database-url postgres://user@host/db
//! DATABASE_URL=postgres://user@host/db cargo run --example bank --features postgres
//! ```
//!
//! Its tables get a random suffix and are dropped at the end; the run then checks that the
//! database holds none of them (idem's and the kit's `<table>_migrations` ledgers included).

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::kit::{
    event_ids, retry_on_conflict, Appended, Backend, ConcurrencyError, Entity, EventStreams,
    ExpectedVersion, Inserted, IsConflict, NewEvent, RecentIds, Recorded, RequestHistory,
    RetryPolicy, SqlQuery, Versioned, VersionedTable,
};
use idem::{idempotent, PrunerConfig, SqliteStore, Transactional, TransactionalStore};
use serde::{Deserialize, Serialize};
use sqlx::{Pool, Row};
use tokio::task::JoinSet;

/// How many times each request is delivered, all at once.
const DELIVERIES: usize = 10;
/// What every account is opened with.
const OPENING_BALANCE: i64 = 100;
/// The requests every strategy receives, one burst after the other.
const REQUESTS: [Request; 3] = [
    Request {
        id: "req-1",
        change: Change::Deposit(500),
    },
    Request {
        id: "req-2",
        change: Change::Deposit(250),
    },
    Request {
        id: "req-3",
        change: Change::Withdraw(300),
    },
];
/// 100 + 500 + 250 - 300: the balance once every request took effect exactly once.
const FINAL_BALANCE: i64 = 550;

// ---------------------------------------------------------------------------------------------
// The domain: an account, and the requests that change it.
// ---------------------------------------------------------------------------------------------

/// A change a client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Change {
    Deposit(i64),
    Withdraw(i64),
}

/// A request: the change, and the id the client keeps when it retries.
#[derive(Debug, Clone, Copy)]
struct Request {
    id: &'static str,
    change: Change,
}

/// The account aggregate. `recent` is used by strategy 5 only.
#[derive(Debug, Clone)]
struct Account {
    id: String,
    balance: i64,
    recent: RecentIds,
}

impl Account {
    fn open(id: &str) -> Account {
        Account {
            id: id.to_owned(),
            balance: OPENING_BALANCE,
            // The last 16 request ids: enough for the retries of this example's clients.
            recent: RecentIds::new(NonZeroUsize::MIN.saturating_add(15)),
        }
    }

    /// Applies `change`, refusing to overdraw (as the article's `Withdraw` does).
    fn apply(&mut self, change: Change) -> Result<(), BankError> {
        self.balance = after(self.balance, change)?;
        Ok(())
    }
}

/// The balance after `change`, or why it is refused.
fn after(balance: i64, change: Change) -> Result<i64, BankError> {
    match change {
        Change::Deposit(amount) => Ok(balance + amount),
        Change::Withdraw(amount) if amount > balance => {
            Err(BankError::Overdrawn { balance, amount })
        }
        Change::Withdraw(amount) => Ok(balance - amount),
    }
}

#[derive(Debug, thiserror::Error)]
enum BankError {
    #[error("cannot withdraw {amount}: the balance is {balance}")]
    Overdrawn { balance: i64, amount: i64 },
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Kit(#[from] ConcurrencyError),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("a delivery task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("check failed: {0}")]
    Violated(String),
}

/// Lets `retry_on_conflict` see a version conflict inside our error type.
impl IsConflict for BankError {
    fn is_conflict(&self) -> bool {
        matches!(self, BankError::Kit(e) if e.is_conflict())
    }
}

/// Returns [`BankError::Violated`] unless `ok`: the example's checks.
fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), BankError> {
    if ok {
        Ok(())
    } else {
        Err(BankError::Violated(what()))
    }
}

/// How an account is stored: `(id, balance, recent, version)`. Written once for every database
/// sqlx can bind and read these column types in.
impl<DB: Backend> Entity<DB> for Account
where
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    String: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    for<'a> &'a str: sqlx::ColumnIndex<DB::Row>,
{
    type Id = String;
    const COLUMNS: &'static [&'static str] = &["balance", "recent"];

    fn id(&self) -> &String {
        &self.id
    }

    fn bind<'q>(&'q self, query: SqlQuery<'q, DB>) -> SqlQuery<'q, DB> {
        // A number and a list of strings always serialize; were it ever empty, loading the row
        // would report a decode error rather than lose the ids silently.
        let recent = serde_json::to_string(&self.recent).unwrap_or_default();
        query.bind(self.balance).bind(recent)
    }

    fn from_row(row: &DB::Row) -> Result<Self, sqlx::Error> {
        let recent: String = row.try_get("recent")?;
        Ok(Account {
            id: row.try_get("id")?,
            balance: row.try_get("balance")?,
            recent: serde_json::from_str(&recent).map_err(|e| sqlx::Error::Decode(e.into()))?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The two databases.
// ---------------------------------------------------------------------------------------------

/// What differs between SQLite and PostgreSQL in this example. Everything else is written once.
trait BankDb: Backend {
    /// idem's store in the same database, for strategy 6.
    type Store: TransactionalStore<Connection = Self::Connection> + Clone;
    /// The column type of a 64-bit integer.
    const BIGINT: &'static str;
    /// How a writing transaction starts. SQLite's `BEGIN IMMEDIATE` takes the write lock up
    /// front, so concurrent writers queue for it instead of failing when a reading transaction
    /// tries to write.
    const BEGIN: &'static str;

    fn pool(store: &Self::Store) -> &Pool<Self>;

    /// Runs one statement without parameters (schema changes).
    fn execute_ddl<'a>(
        pool: &'a Pool<Self>,
        sql: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// The tables whose name contains `part`, from the database's catalog.
    fn tables_named_like<'a>(
        pool: &'a Pool<Self>,
        part: &'a str,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send + 'a;
}

impl BankDb for sqlx::Sqlite {
    type Store = SqliteStore;
    const BIGINT: &'static str = "INTEGER";
    const BEGIN: &'static str = "BEGIN IMMEDIATE";

    fn pool(store: &SqliteStore) -> &Pool<Self> {
        store.pool()
    }

    async fn execute_ddl(pool: &Pool<Self>, sql: &str) -> Result<(), sqlx::Error> {
        sqlx::query(sql).execute(pool).await.map(drop)
    }

    async fn tables_named_like(pool: &Pool<Self>, part: &str) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND instr(name, $1) > 0",
        )
        .bind(part)
        .fetch_all(pool)
        .await
    }
}

#[cfg(feature = "postgres")]
impl BankDb for sqlx::Postgres {
    type Store = idem::PostgresStore;
    const BIGINT: &'static str = "BIGINT";
    // READ COMMITTED, the default: a duplicate waits on the first one's row lock, then sees it.
    const BEGIN: &'static str = "BEGIN";

    fn pool(store: &idem::PostgresStore) -> &Pool<Self> {
        store.pool()
    }

    async fn execute_ddl(pool: &Pool<Self>, sql: &str) -> Result<(), sqlx::Error> {
        sqlx::query(sql).execute(pool).await.map(drop)
    }

    async fn tables_named_like(pool: &Pool<Self>, part: &str) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT schemaname || '.' || tablename FROM pg_tables WHERE strpos(tablename, $1) > 0",
        )
        .bind(part)
        .fetch_all(pool)
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// The bank: the tables every strategy uses.
// ---------------------------------------------------------------------------------------------

struct Bank<DB: BankDb> {
    pool: Pool<DB>,
    /// Accounts with a version column (strategies 1, 2, 3, 5 and 6).
    accounts: VersionedTable<Account, DB>,
    /// Processed request ids (strategy 3).
    history: RequestHistory<DB>,
    /// Account events (strategy 4).
    events: EventStreams<DB>,
    /// idem in transactional mode (strategy 6).
    idem: Transactional<DB::Store>,
    /// How many times strategy 6's handler body ran.
    runs: AtomicUsize,
    /// Every table this run created, dropped at the end: the run's own, the kit's and idem's,
    /// each with its `<table>_migrations` ledger where it has one.
    tables: Vec<String>,
    /// What every table name of this run contains, to check that none is left.
    suffix: String,
}

/// What one delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Handled {
    /// The change took effect.
    Applied,
    /// Recognised as a duplicate: nothing changed.
    Duplicate,
    /// Refused because the account moved on since the version the request names.
    Stale,
}

/// What strategy 6 answers; every delivery of a request gets the same one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    request_id: String,
    balance: i64,
}

impl<DB: BankDb> Bank<DB>
where
    Account: Entity<DB, Id = String>,
{
    /// Creates this run's tables, named with `suffix`.
    async fn create(store: DB::Store, suffix: &str) -> Result<Bank<DB>, BankError> {
        let pool = DB::pool(&store).clone();
        let accounts = format!("bank_accounts_{suffix}");
        let history = format!("bank_history_{suffix}");
        let events = format!("bank_events_{suffix}");
        DB::execute_ddl(
            &pool,
            &format!(
                "CREATE TABLE {accounts} (id TEXT PRIMARY KEY, balance {b} NOT NULL, \
                 recent TEXT NOT NULL, version {b} NOT NULL)",
                b = DB::BIGINT
            ),
        )
        .await?;
        let bank = Bank {
            accounts: VersionedTable::new(&accounts)?,
            history: RequestHistory::new(&history)?,
            events: EventStreams::new(&events)?,
            idem: Transactional::new(store),
            runs: AtomicUsize::new(0),
            tables: vec![
                accounts,
                format!("{history}_pruner"),
                format!("{history}_migrations"),
                history,
                format!("{events}_migrations"),
                events,
                format!("{}_migrations", records_table(suffix)),
                records_table(suffix),
            ],
            suffix: suffix.to_owned(),
            pool,
        };
        let mut conn = bank.pool.acquire().await?;
        bank.history.ensure_schema(&mut conn).await?;
        bank.events.ensure_schema(&mut conn).await?;
        Ok(bank)
    }

    /// Drops this run's tables, and fails if the database still holds one.
    async fn drop_tables(&self) -> Result<(), BankError> {
        for table in &self.tables {
            DB::execute_ddl(&self.pool, &format!("DROP TABLE IF EXISTS {table}")).await?;
        }
        let left = DB::tables_named_like(&self.pool, &self.suffix).await?;
        ensure(left.is_empty(), || {
            format!("the run left tables behind: {}", left.join(", "))
        })
    }

    /// Opens `id`, or does nothing if it is open already (see strategy 1).
    async fn open_account(&self, id: &str) -> Result<Inserted<Account>, BankError> {
        let mut conn = self.pool.acquire().await?;
        Ok(self.accounts.insert(&mut conn, Account::open(id)).await?)
    }

    async fn balance(&self, id: &str) -> Result<i64, BankError> {
        let mut conn = self.pool.acquire().await?;
        Ok(self.accounts.load(&mut conn, &id.to_owned()).await?.balance)
    }

    /// Checks that `account` ended at [`FINAL_BALANCE`] and prints it.
    async fn check_final_balance(&self, account: &str) -> Result<(), BankError> {
        let balance = self.balance(account).await?;
        ensure(balance == FINAL_BALANCE, || {
            format!("{account} ended at {balance}, not {FINAL_BALANCE}")
        })?;
        println!("   final balance {balance} = {OPENING_BALANCE} + 500 + 250 - 300: each request applied once");
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // 1. Natural idempotency: opening an account by its id.
    // -----------------------------------------------------------------------------------------

    /// Opening is an insert-if-absent on the account id (`INSERT … ON CONFLICT (id) DO
    /// NOTHING`): a duplicate finds the account there (`Inserted::Exists`) and changes nothing.
    /// No extra table, no extra round trip. Deposits and withdrawals are not like that: the
    /// other strategies deal with them.
    async fn natural_idempotency(self: &Arc<Self>) -> Result<(), BankError> {
        println!("\n1. Natural idempotency: open an account by id (insert-if-absent)");
        let outcomes = burst(|| {
            let bank = self.clone();
            async move {
                Ok(match bank.open_account("acct-1").await? {
                    Inserted::New(_) => Handled::Applied,
                    Inserted::Exists(_) => Handled::Duplicate,
                })
            }
        })
        .await?;
        report(
            "open acct-1 with 100",
            &outcomes,
            "already open (Inserted::Exists)",
        )?;
        let balance = self.balance("acct-1").await?;
        ensure(balance == OPENING_BALANCE, || {
            format!("acct-1 was opened with {balance}")
        })?;
        println!("   balance {balance}: opened once");
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // 2. Expected version: the client names the version its change is based on.
    // -----------------------------------------------------------------------------------------

    /// Every save is `UPDATE … SET …, version = version + 1 WHERE id = ? AND version = ?`. A
    /// request carrying the version the client read is applied once: after that the account is
    /// at a newer version, so every duplicate is refused as stale. It cannot tell a duplicate
    /// from a concurrent change, though: the client must reload and decide.
    ///
    /// Writers that should simply win (no client-side version) reload and retry on conflict
    /// instead: no update is lost, but a retried duplicate would apply twice.
    async fn expected_version(self: &Arc<Self>) -> Result<(), BankError> {
        println!("\n2. Expected version (versioned update)");
        let _ = self.open_account("acct-2").await?;
        for request in REQUESTS {
            // The client read the account, and sends the version it saw with every delivery.
            let seen = {
                let mut conn = self.pool.acquire().await?;
                self.accounts
                    .load(&mut conn, &"acct-2".to_owned())
                    .await?
                    .version()
            };
            let outcomes = burst(|| {
                let bank = self.clone();
                async move {
                    let mut conn = bank.pool.acquire().await?;
                    let current = bank.accounts.load(&mut conn, &"acct-2".to_owned()).await?;
                    let mut account = Versioned::new(current.into_inner(), seen);
                    account.apply(request.change)?;
                    match bank.accounts.save(&mut conn, &mut account).await {
                        Ok(_) => Ok(Handled::Applied),
                        Err(ConcurrencyError::Conflict { .. }) => Ok(Handled::Stale),
                        Err(e) => Err(e.into()),
                    }
                }
            })
            .await?;
            let what = format!("{} {:?} at version {seen}", request.id, request.change);
            report(&what, &outcomes, "refused as stale (Conflict)")?;
        }
        self.check_final_balance("acct-2").await?;

        // Twenty different deposits at once, each retried on conflict: none is lost.
        let attempts = Arc::new(AtomicUsize::new(0));
        let mut writers = JoinSet::new();
        for amount in 1..=20 {
            let (bank, attempts) = (self.clone(), attempts.clone());
            writers.spawn(async move {
                let policy = RetryPolicy::new(20)
                    .backoff(Duration::from_millis(1), Duration::from_millis(20));
                retry_on_conflict(&policy, || async {
                    attempts.fetch_add(1, Ordering::SeqCst);
                    let mut conn = bank.pool.acquire().await?;
                    let mut account = bank.accounts.load(&mut conn, &"acct-2".to_owned()).await?;
                    account.apply(Change::Deposit(amount))?;
                    bank.accounts.save(&mut conn, &mut account).await?;
                    Ok::<_, BankError>(())
                })
                .await
            });
        }
        while let Some(done) = writers.join_next().await {
            done??;
        }
        let balance = self.balance("acct-2").await?;
        ensure(balance == FINAL_BALANCE + 210, || {
            format!("acct-2 ended at {balance} after 20 concurrent deposits: an update was lost")
        })?;
        println!(
            "   20 concurrent deposits of 1..=20 with retry_on_conflict: {} attempts, balance \
             {balance} = {FINAL_BALANCE} + 210, no update lost",
            attempts.load(Ordering::SeqCst)
        );
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // 3. Request history in the business transaction.
    // -----------------------------------------------------------------------------------------

    /// The request id is inserted into a history table in the transaction that changes the
    /// account; a duplicate insert means "already done". Both commit together, so a request
    /// takes effect exactly once, even if the process dies in between. One insert on top of
    /// the transaction you run anyway; a pruner deletes old ids off the hot path.
    async fn request_history(self: &Arc<Self>) -> Result<(), BankError> {
        println!("\n3. Request-id history table in the business transaction");
        let _ = self.open_account("acct-3").await?;
        for request in REQUESTS {
            let outcomes = burst(|| {
                let bank = self.clone();
                async move { bank.apply_with_history("acct-3", request).await }
            })
            .await?;
            let what = format!("{} {:?}", request.id, request.change);
            report(
                &what,
                &outcomes,
                "already in the history (Recorded::Duplicate)",
            )?;
        }
        self.check_final_balance("acct-3").await?;

        let pruner = self.history.pruner(
            self.pool.clone(),
            Duration::from_secs(24 * 3600),
            PrunerConfig::new(),
        )?;
        let report = pruner.run_once().await?;
        ensure(report.deleted == 0, || {
            format!("the pruner deleted {} fresh ids", report.deleted)
        })?;
        println!(
            "   pruner (retention 24 h): deleted {} ids, the {} fresh ones stay",
            report.deleted,
            REQUESTS.len()
        );
        Ok(())
    }

    /// One delivery of strategy 3.
    async fn apply_with_history(
        &self,
        account_id: &str,
        request: Request,
    ) -> Result<Handled, BankError> {
        let mut tx = self.pool.begin_with(DB::BEGIN).await?;
        if self.history.record(&mut tx, "bank", request.id).await? == Recorded::Duplicate {
            // Dropping the transaction rolls back; there is nothing to undo anyway.
            return Ok(Handled::Duplicate);
        }
        let mut account = self.accounts.load(&mut tx, &account_id.to_owned()).await?;
        // An error here drops the transaction, and the history row with it: a retry runs again.
        account.apply(request.change)?;
        self.accounts.save(&mut tx, &mut account).await?;
        tx.commit().await?;
        Ok(Handled::Applied)
    }

    // -----------------------------------------------------------------------------------------
    // 4. Event stream with event ids derived from the request id.
    // -----------------------------------------------------------------------------------------

    /// The account is a stream of events under a unique `(stream, version)`. A request's event
    /// ids are UUID v5 of the request id, and unique in the table, so appending the same
    /// request twice is caught exactly (`Appended::Duplicate`), even after the stream moved on.
    /// One append per change; a conflict costs a reload.
    async fn event_stream(self: &Arc<Self>) -> Result<(), BankError> {
        println!("\n4. Event stream with deterministic event ids");
        let opened = [NewEvent::json("opened", &OPENING_BALANCE)?];
        let mut conn = self.pool.acquire().await?;
        let _ = self
            .events
            .append(
                &mut conn,
                "acct-4",
                "open-acct-4",
                ExpectedVersion::NoStream,
                &opened,
            )
            .await?;
        drop(conn);
        for request in REQUESTS {
            let outcomes = burst(|| {
                let bank = self.clone();
                async move { bank.append_change("acct-4", request).await }
            })
            .await?;
            let first_id = event_ids("acct-4", request.id).next().unwrap_or_default();
            let what = format!("{} {:?} (event id {first_id})", request.id, request.change);
            report(
                &what,
                &outcomes,
                "caught by their event id (Appended::Duplicate)",
            )?;
        }

        let mut conn = self.pool.acquire().await?;
        let events = self.events.read(&mut conn, "acct-4").await?;
        let balance = replay(&events)?;
        ensure(
            balance == FINAL_BALANCE && events.len() == 1 + REQUESTS.len(),
            || format!("acct-4 has {} events and balance {balance}", events.len()),
        )?;
        println!(
            "   {} events (opened + one per request), final balance {balance}",
            events.len()
        );
        Ok(())
    }

    /// One delivery of strategy 4: rebuild the account from its events, decide, append at the
    /// version it was rebuilt from; on a conflict, do it again on fresh events.
    async fn append_change(&self, stream: &str, request: Request) -> Result<Handled, BankError> {
        retry_on_conflict(&burst_retry_policy(), || async {
            let mut conn = self.pool.acquire().await?;
            let history = self.events.read(&mut conn, stream).await?;
            let version = history.last().map(|e| e.version).unwrap_or_default();
            // Refuses an overdraft before anything is appended.
            after(replay(&history)?, request.change)?;
            let event = [NewEvent::json("changed", &request.change)?];
            let expected = ExpectedVersion::Exact(version);
            match self
                .events
                .append(&mut conn, stream, request.id, expected, &event)
                .await?
            {
                Appended::New { .. } => Ok(Handled::Applied),
                Appended::Duplicate { .. } => Ok(Handled::Duplicate),
            }
        })
        .await
    }

    // -----------------------------------------------------------------------------------------
    // 5. Recent request ids inside the aggregate.
    // -----------------------------------------------------------------------------------------

    /// For stores without transactions: the account remembers its last request ids and is
    /// saved with a versioned update, ids and balance together. A concurrent duplicate
    /// conflicts, reloads, and finds its id. No extra table or round trip, but only the last
    /// N ids are remembered.
    async fn recent_ids(self: &Arc<Self>) -> Result<(), BankError> {
        println!("\n5. Recent request ids in the aggregate");
        let _ = self.open_account("acct-5").await?;
        for request in REQUESTS {
            let outcomes = burst(|| {
                let bank = self.clone();
                async move { bank.apply_with_recent_ids("acct-5", request).await }
            })
            .await?;
            let what = format!("{} {:?}", request.id, request.change);
            report(&what, &outcomes, "found among the account's recent ids")?;
        }
        self.check_final_balance("acct-5").await
    }

    /// One delivery of strategy 5.
    async fn apply_with_recent_ids(
        &self,
        account_id: &str,
        request: Request,
    ) -> Result<Handled, BankError> {
        retry_on_conflict(&burst_retry_policy(), || async {
            let mut conn = self.pool.acquire().await?;
            let mut account = self
                .accounts
                .load(&mut conn, &account_id.to_owned())
                .await?;
            if account.recent.insert(request.id) == Recorded::Duplicate {
                return Ok(Handled::Duplicate);
            }
            account.apply(request.change)?;
            self.accounts.save(&mut conn, &mut account).await?;
            Ok(Handled::Applied)
        })
        .await
    }

    // -----------------------------------------------------------------------------------------
    // 6. The transactional attribute.
    // -----------------------------------------------------------------------------------------

    /// idem claims the request's key, runs the body and stores its answer, all inside the
    /// caller's transaction: a crash before the commit leaves nothing, a concurrent duplicate
    /// waits for the first one's commit and replays its receipt. Works for any request and
    /// any answer, without touching the domain model; costs two statements per new request
    /// (claim, completion) and one per replay.
    async fn transactional_attribute(self: &Arc<Self>) -> Result<(), BankError> {
        println!(
            "\n6. #[idempotent(transaction = tx)]: claim, change and receipt in one transaction"
        );
        let _ = self.open_account("acct-6").await?;

        // A delivery that crashes after the change, before the commit: nothing is left.
        let mut tx = self.pool.begin_with(DB::BEGIN).await?;
        let receipt = self
            .apply_in_transaction(&mut tx, "acct-6", REQUESTS[0])
            .await?;
        drop(tx);
        let balance = self.balance("acct-6").await?;
        ensure(balance == OPENING_BALANCE, || {
            format!("a rolled-back delivery left acct-6 at {balance}")
        })?;
        println!(
            "   {} crashed before the commit (balance would have been {}): nothing kept, \
             balance {balance}",
            REQUESTS[0].id, receipt.balance
        );

        for request in REQUESTS {
            let receipts = burst(|| {
                let bank = self.clone();
                async move {
                    let mut tx = bank.pool.begin_with(DB::BEGIN).await?;
                    let receipt = bank
                        .apply_in_transaction(&mut tx, "acct-6", request)
                        .await?;
                    tx.commit().await?;
                    Ok(receipt)
                }
            })
            .await?;
            ensure(receipts.windows(2).all(|pair| pair[0] == pair[1]), || {
                format!(
                    "{}: deliveries got different receipts: {receipts:?}",
                    request.id
                )
            })?;
            let balance = receipts.first().map_or(0, |r| r.balance);
            println!(
                "   {} {:?}: {DELIVERIES} deliveries, all answered \"balance {balance}\"",
                request.id, request.change
            );
        }
        // The crashed delivery ran the body too; its effect was rolled back.
        let runs = self.runs.load(Ordering::SeqCst);
        ensure(runs == 1 + REQUESTS.len(), || {
            format!("the handler ran {runs} times")
        })?;
        println!(
            "   the handler body ran {runs} times: once per request, plus the crashed delivery"
        );
        self.check_final_balance("acct-6").await
    }

    /// Strategy 6's handler: the body is ordinary code on the caller's transaction `tx`.
    #[idempotent(
        key = request.id,
        caller = account_id,
        scope = "bank",
        engine = self.idem,
        transaction = tx,
        fingerprint = request.change,
        retention = "7d",
    )]
    async fn apply_in_transaction(
        &self,
        tx: &mut DB::Connection,
        account_id: &str,
        request: Request,
    ) -> Result<Receipt, BankError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let mut account = self.accounts.load(tx, &account_id.to_owned()).await?;
        account.apply(request.change)?;
        self.accounts.save(tx, &mut account).await?;
        Ok(Receipt {
            request_id: request.id.to_owned(),
            balance: account.balance,
        })
    }
}

/// The balance an account's events add up to.
fn replay(events: &[idem::kit::Event]) -> Result<i64, BankError> {
    let mut balance = 0;
    for event in events {
        balance = match event.event_type.as_str() {
            "opened" => event.json()?,
            _ => after(balance, event.json()?)?,
        };
    }
    Ok(balance)
}

/// Retries for one delivery of a burst: each conflict means another delivery got through, so
/// one attempt per delivery (and one more) lets every delivery finish.
fn burst_retry_policy() -> RetryPolicy {
    RetryPolicy::new(DELIVERIES as u32 + 1)
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
}

/// Delivers one request [`DELIVERIES`] times at once, each delivery in a task of its own, and
/// collects what each one did.
async fn burst<T, F, Fut>(deliver: F) -> Result<Vec<T>, BankError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, BankError>> + Send + 'static,
    T: Send + 'static,
{
    let mut deliveries = JoinSet::new();
    for _ in 0..DELIVERIES {
        deliveries.spawn(deliver());
    }
    let mut outcomes = Vec::with_capacity(DELIVERIES);
    while let Some(done) = deliveries.join_next().await {
        outcomes.push(done??);
    }
    Ok(outcomes)
}

/// Prints what a burst did, and checks that exactly one delivery took effect.
fn report(what: &str, outcomes: &[Handled], others: &str) -> Result<(), BankError> {
    let mut counts = BTreeMap::new();
    for outcome in outcomes {
        *counts.entry(*outcome).or_insert(0) += 1;
    }
    let applied = counts.remove(&Handled::Applied).unwrap_or(0);
    let rest: usize = counts.values().sum();
    println!("   {what}: {DELIVERIES} deliveries, {applied} applied, {rest} {others}");
    ensure(applied == 1, || {
        format!("{what}: {applied} deliveries took effect")
    })
}

/// Runs every strategy on `store`'s database, then drops the tables.
async fn run<DB: BankDb>(store: DB::Store, suffix: &str) -> Result<(), BankError>
where
    Account: Entity<DB, Id = String>,
{
    println!(
        "Each request is delivered {DELIVERIES} times at once, on {}.",
        <DB as sqlx::Database>::NAME
    );
    let bank = Arc::new(Bank::<DB>::create(store, suffix).await?);
    let outcome = async {
        bank.natural_idempotency().await?;
        bank.expected_version().await?;
        bank.request_history().await?;
        bank.event_stream().await?;
        bank.recent_ids().await?;
        bank.transactional_attribute().await
    }
    .await;
    bank.drop_tables().await?;
    outcome?;
    println!("\nEvery strategy applied every request exactly once.");
    Ok(())
}

/// idem's records table of this run.
fn records_table(suffix: &str) -> String {
    format!("bank_idem_{suffix}")
}

/// `--database-url URL`, else the environment's `DATABASE_URL`, else none (SQLite in a
/// temporary file).
fn database_url() -> Result<Option<String>, String> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next(), args.next()) {
        (None, ..) => Ok(std::env::var("DATABASE_URL").ok()),
        (Some("--database-url"), Some(url), None) => Ok(Some(url)),
        _ => Err("usage: bank [--database-url postgres://user@host/db | sqlite://path]".into()),
    }
}

#[cfg(feature = "postgres")]
async fn run_postgres(url: &str, suffix: &str) -> Result<(), Box<dyn std::error::Error>> {
    let store = idem::PostgresStore::builder()
        .table(records_table(suffix))
        .connect(url)
        .await?;
    Ok(run::<sqlx::Postgres>(store, suffix).await?)
}

#[cfg(not(feature = "postgres"))]
async fn run_postgres(_url: &str, _suffix: &str) -> Result<(), Box<dyn std::error::Error>> {
    Err(
        "a PostgreSQL URL was given, but this build has no PostgreSQL support: run \
         `cargo run --example bank --features postgres -- --database-url postgres://…`"
            .into(),
    )
}

#[tokio::main]
async fn main() {
    if let Err(e) = choose_database_and_run().await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// SQLite in a temporary file, or the database a URL names.
async fn choose_database_and_run() -> Result<(), Box<dyn std::error::Error>> {
    let url = database_url()?;
    let suffix = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let records = records_table(&suffix);
    match url.as_deref() {
        None => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("bank.db");
            println!("SQLite database: {}", path.display());
            let store = SqliteStore::builder().table(records).open(&path).await?;
            run::<sqlx::Sqlite>(store, &suffix).await?;
        }
        Some(url) if url.starts_with("sqlite:") => {
            let store = SqliteStore::builder().table(records).connect(url).await?;
            run::<sqlx::Sqlite>(store, &suffix).await?;
        }
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            run_postgres(url, &suffix).await?;
        }
        Some(url) => {
            return Err(format!(
                "unsupported database URL {url:?}: use postgres://… (with --features postgres) \
                 or sqlite://…"
            )
            .into())
        }
    }
    Ok(())
}
