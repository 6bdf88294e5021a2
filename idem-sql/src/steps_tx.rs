//! `steps.tx`: a step of a [`Steps`] operation whose writes and record commit together in the
//! caller's SQL transaction, as an extension of [`Steps`] ([`SqlSteps`]).

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::transactional::TxFuture;
use crate::TransactionalStore;
use idem_core::adapter::{atomic_step, StepsOf};
use idem_core::Codec;
use idem_core::Error;
use idem_core::Steps;

/// The SQL stores' atomic step on [`Steps`]: [`tx`](SqlSteps::tx). Bring it into scope with
/// `use idem::SqlSteps;`; it is implemented for [`Steps`] only.
///
/// An extension trait because the method shows sqlx's connection types, which idem-core's
/// `Steps` must not once the SQL stores are a crate of their own (idem-sql); named after what it
/// extends, as idem-dynamodb's `DynamoSteps`, so both sit in one `use idem::…` line.
pub trait SqlSteps: sealed::Sealed + StepsOf {
    /// Runs the step `name` as an atomic phase (SQLite and PostgreSQL): `work` runs on the
    /// caller's transaction `conn`, and the step's record is written on the same connection, so
    /// committing the transaction commits the step's writes and its record together, and a
    /// crash (or a rollback) before the commit leaves neither: the retry runs the step again
    /// on a clean slate. A step an earlier attempt committed replays its result and runs
    /// nothing on `conn`.
    ///
    /// `store` is the store the engine runs on, and `conn` a transaction on its database
    /// (on SQLite open it with `BEGIN IMMEDIATE`, as for [`Transactional`](crate::Transactional)).
    /// Commit only when this returns `Ok`: an `Err` (the work's, or [`Error::LeaseLost`](idem_core::Error::LeaseLost) when
    /// the operation was taken over) means roll back. The record's statement locks the
    /// operation's record row until the commit on PostgreSQL (SQLite's write lock is held
    /// anyway), so the lease renewal waits for it: keep the transaction well under a third of
    /// the lease. Errors as [`Step::run`](idem_core::Step::run)'s.
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, SqlSteps, SqliteStore};
    /// use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = SqliteStore::open(dir.path().join("rides.db")).await?;
    /// sqlx::query("CREATE TABLE rides (id INTEGER PRIMARY KEY, user_id TEXT)").execute(store.pool()).await?;
    /// let engine = Idempotency::new(store.clone());
    /// let key = Key::derive("rides", "user-7", "req-1")?;
    /// let store = &store;
    /// let ride = engine.call(key).run_steps(|steps| async move {
    ///     let mut conn = store.pool().acquire().await.map_err(idem::sql_error)?;
    ///     let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(idem::sql_error)?;
    ///     let id: i64 = steps.tx(store, &mut tx, "create ride", |tx| Box::pin(async move {
    ///         let id = sqlx::query_scalar("INSERT INTO rides (user_id) VALUES ('user-7') RETURNING id")
    ///             .fetch_one(&mut *tx).await.map_err(idem::sql_error)?;
    ///         Ok::<i64, Error>(id)
    ///     })).await?;
    ///     tx.commit().await.map_err(idem::sql_error)?;
    ///     Ok::<_, Error>(id)
    /// }).await?;
    /// assert_eq!(ride.into_inner(), 1);
    /// # Ok(()) }
    /// ```
    // Provided here and implemented for `Steps` alone, so a caller always has a concrete `Steps`
    // and sees the future's concrete type, which is `Send` when its parts are; a generic caller
    // bound by this trait cannot name it.
    #[allow(async_fn_in_trait)]
    async fn tx<S, T, E, F>(
        &self,
        store: &S,
        conn: &mut S::Connection,
        name: &str,
        work: F,
    ) -> Result<T, E>
    where
        S: TransactionalStore,
        F: for<'c> FnOnce(&'c mut S::Connection) -> TxFuture<'c, Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        atomic_step(self.steps(), name, |step| async move {
            let value = work(&mut *conn).await?;
            let bytes = step.encode(&value)?;
            if let Some(claim) = step.claim() {
                store
                    .write_step_in(conn, claim, step.finished(&bytes))
                    .await?;
            }
            Ok(value)
        })
        .await
    }
}

impl<C: Codec> SqlSteps for Steps<C> {}

mod sealed {
    /// Keeps the extension to [`Steps`](idem_core::Steps) alone.
    pub trait Sealed {}

    impl<C> Sealed for idem_core::Steps<C> {}
}
