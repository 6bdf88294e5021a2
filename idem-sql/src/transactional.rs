//! Transactional mode: the claim, the work and the completion commit in one database
//! transaction, on the caller's own connection.
//!
//! When the work writes to the same SQL database as the idempotency records, this turns
//! at-most-once execution into an exactly-once *effect*: a crash anywhere before the commit
//! leaves neither the business write nor the claim, and a retry applies the work once.
//! Concurrent duplicates do not see the uncommitted claim: PostgreSQL makes their claim statement
//! wait on the first transaction's row, SQLite on its write lock (open transactions with
//! `BEGIN IMMEDIATE`), and then they replay the committed result.
//!
//! Round trips, on top of the caller's `BEGIN`/`COMMIT` and the work: one claim statement and one
//! completion statement (a replay is the claim statement, plus one read on SQLite).
//!
//! ```
//! use idem::{Error, Key, Outcome, SqliteStore, Transactional};
//! use sqlx::Connection;
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("bank.db")).await?;
//! let mut conn = store.pool().acquire().await?;
//! sqlx::query("CREATE TABLE ledger (request TEXT, cents INTEGER)").execute(&mut *conn).await?;
//! let idem = Transactional::new(store.clone());
//!
//! for _ in 0..2 {
//!     let key = Key::derive("deposit", "acct-1", "req-9")?;
//!     let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
//!     let out = idem
//!         .call(key)
//!         .run(&mut tx, |tx| Box::pin(async move {
//!             sqlx::query("INSERT INTO ledger VALUES ('req-9', 500)").execute(&mut *tx).await.map_err(idem::sql_error)?;
//!             Ok::<_, Error>(500u64)
//!         }))
//!         .await?;
//!     tx.commit().await?;
//!     assert_eq!(out.into_inner(), 500);
//! }
//! let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger").fetch_one(&mut *conn).await?;
//! assert_eq!(rows, 1); // the second delivery replayed
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::dialect::Backend;
use crate::{SqlStore, TransactionalStore};
use idem_core::adapter::{self, Core, EngineStore, Overrides};
use idem_core::Error;
use idem_core::{Claim, ClaimOutcome, ClaimRequest, Completion};
use idem_core::{Codec, JsonCodec};
use idem_core::{EngineBuilder, Outcome, Policy};
use idem_core::{Fingerprint, Key};

/// A boxed future borrowing the connection, as a transactional [`TxCall::run`]'s work returns.
pub type TxFuture<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// What a transactional [`TxCall::claim`] found.
#[derive(Debug)]
#[must_use = "run the work and call `finish`, or return the replayed value"]
pub enum TxClaimOutcome<T> {
    /// The key is new (in this transaction), or the call has no key: run the work on the same
    /// connection, then [`finish`](Transactional::finish).
    Run(TxClaim),
    /// The key completed earlier: this is its stored result.
    Replayed(T),
}

/// A claim made inside a transaction; it becomes visible to others only when the caller commits.
#[derive(Debug)]
pub struct TxClaim {
    /// `None` for a call without a key: nothing to store.
    claim: Option<Claim>,
    /// How long [`Transactional::finish`] keeps the result: chosen when the claim was made.
    retention: Duration,
}

/// The engine for transactional mode: a policy and codec over a [`TransactionalStore`].
///
/// Make a call with [`call`](Self::call), then [`run`](TxCall::run) it with a closure, or
/// [`claim`](TxCall::claim) it and [`finish`](Self::finish) it around your own code. Either way,
/// the caller opens and commits the transaction. If the work fails, its claim is deleted inside
/// the transaction, so committing or rolling back both leave the key free for a retry.
///
/// ```
/// use std::time::Duration;
/// use idem::{SqliteStore, Transactional};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let idem = Transactional::new(SqliteStore::open(":memory:").await?);
/// assert_eq!(idem.policy().retention(), Duration::from_secs(24 * 3600));
/// let hourly = Transactional::builder(SqliteStore::open(":memory:").await?)
///     .retention(Duration::from_secs(3600))
///     .build()?;
/// assert_eq!(hourly.policy().retention(), Duration::from_secs(3600));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Transactional<S, C = JsonCodec> {
    store: S,
    core: Core<C>,
}

impl<S: TransactionalStore> Transactional<S, JsonCodec> {
    /// Transactional mode over `store` with the default policy and the JSON codec.
    pub fn new(store: S) -> Transactional<S, JsonCodec> {
        Transactional::of(store, adapter::core(JsonCodec))
    }

    /// A [`EngineBuilder`] to set the policy (lease, retention, response limit) or codec.
    pub fn builder(store: S) -> EngineBuilder<S> {
        adapter::builder(store, JsonCodec)
    }
}

impl<S: TransactionalStore, C> Transactional<S, C> {
    /// The engine of `store` and `core`, fitted to the store's limits.
    fn of(store: S, core: Core<C>) -> Transactional<S, C> {
        let core = adapter::fit(core, &store);
        Transactional { store, core }
    }
}

/// An [`EngineBuilder`] over a SQL store builds its transactional engine.
impl<DB: Backend, C: Codec> EngineStore<C> for SqlStore<DB> {
    type Engine = Transactional<SqlStore<DB>, C>;

    fn engine(store: Self, core: Core<C>) -> Self::Engine {
        Transactional::of(store, core)
    }
}

impl<S: TransactionalStore, C: Codec> Transactional<S, C> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        adapter::policy(&self.core)
    }

    /// Starts a call guarded by `key` (`None`: the work runs without deduplication); set what
    /// differs from the policy on the returned [`TxCall`], then [`run`](TxCall::run) or
    /// [`claim`](TxCall::claim) it on the caller's connection.
    pub fn call(&self, key: impl Into<Option<Key>>) -> TxCall<'_, S, C> {
        TxCall {
            engine: self,
            key: key.into(),
            fingerprint: None,
            overrides: Overrides::default(),
        }
    }

    /// Stores `value` as the claim's result, inside the caller's transaction, for the retention
    /// chosen when the call began, and keeps the key for the policy's
    /// [`key_retention`](Policy::key_retention) after it (a tombstone: a retry then gets
    /// [`Error::ResultExpired`]). It becomes the replayed answer when the caller commits. A
    /// value larger than [`Policy::max_response_bytes`] (or one the codec refuses) is not kept:
    /// the key is recorded as completed without it, and a retry gets
    /// [`Error::ResultNotRetained`].
    pub async fn finish<T: Serialize>(
        &self,
        conn: &mut S::Connection,
        claim: TxClaim,
        value: &T,
    ) -> Result<(), Error> {
        let Some(claim_) = claim.claim else {
            return Ok(());
        };
        let sealed = adapter::seal(&self.core, value, claim_.key());
        let done = Completion {
            response: Some(&sealed),
            is_error: false,
            retention: claim.retention,
            key_retention: self.policy().key_retention(),
        };
        self.store.complete_in(conn, &claim_, done).await
    }

    /// Deletes the claim inside the transaction after the work failed, so a commit leaves the key
    /// free. Errors are ignored: an aborted transaction must be rolled back anyway, which also
    /// removes the claim.
    pub async fn release(&self, conn: &mut S::Connection, claim: TxClaim) {
        let Some(claim) = claim.claim else {
            return;
        };
        if let Err(e) = self.store.abort_in(conn, &claim).await {
            tracing::debug!(key = %claim.key(), error = %e, "releasing a transactional claim failed; rolling back removes it");
        }
    }
}

/// One call of a [`Transactional`] engine, made by [`Transactional::call`]: set what differs from
/// the policy, then [`run`](Self::run) or [`claim`](Self::claim) it on the caller's connection.
#[derive(Debug)]
#[must_use = "a call does nothing until it is run and awaited"]
pub struct TxCall<'e, S, C = JsonCodec> {
    engine: &'e Transactional<S, C>,
    key: Option<Key>,
    fingerprint: Option<Fingerprint>,
    overrides: Overrides,
}

impl<S, C> TxCall<'_, S, C> {
    /// The fingerprint of the request (`None`: no fingerprint). A key completed with another
    /// fingerprint is refused with [`Error::KeyReused`].
    pub fn fingerprint(mut self, fingerprint: impl Into<Option<Fingerprint>>) -> Self {
        self.fingerprint = fingerprint.into();
        self
    }

    /// The claim's lease for this call, in place of the policy's.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.overrides = adapter::with_lease(self.overrides, lease);
        self
    }

    /// How long this call's result is kept, in place of the policy's.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.overrides = adapter::with_retention(self.overrides, retention);
        self
    }

    /// The options `#[idempotent]` gives (`__private::tx_begin`).
    pub(crate) fn overrides(mut self, overrides: Overrides) -> Self {
        self.overrides = overrides;
        self
    }
}

impl<S: TransactionalStore, C: Codec> TxCall<'_, S, C> {
    /// Claims the call's key inside the caller's transaction, or returns the stored result.
    /// The call's lease and retention are checked before anything is written; its retention
    /// applies when the claim is [`finish`](Transactional::finish)ed.
    ///
    /// [`Error::Locked`] means a claim made outside any transaction (by the pooled engine) is
    /// running; [`Error::KeyReused`] (or [`Error::PolicyChanged`]) that the fingerprint differs
    /// from the stored one; [`Error::ResultExpired`] that the key completed and its result's
    /// retention ended, its tombstone still running ([`Policy::key_retention`]): the work is
    /// not run again; [`Error::Uncertain`] that a claim made outside any transaction with
    /// `OnLapse::Uncertain` lapsed with no completion (resolve it first).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Error, Key, SqliteStore, Transactional, TxClaimOutcome};
    /// use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = SqliteStore::connect("sqlite::memory:").await?;
    /// let idem = Transactional::new(store.clone());
    /// let mut conn = store.pool().acquire().await?;
    /// let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// let key = Key::derive("statement", "acct-1", "2026-11")?;
    /// if let TxClaimOutcome::<u64>::Run(claim) = idem.call(key).retention(week).claim(&mut tx).await? {
    ///     idem.finish(&mut tx, claim, &42u64).await?; // kept for a week
    /// }
    /// tx.commit().await?;
    ///
    /// let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    /// let other = Key::derive("statement", "acct-1", "2026-12")?;
    /// let refused = idem.call(other).retention(Duration::ZERO).claim::<u64>(&mut tx).await;
    /// assert!(matches!(refused, Err(Error::InvalidConfig(_))));
    /// # Ok(()) }
    /// ```
    pub async fn claim<T: DeserializeOwned>(
        self,
        conn: &mut S::Connection,
    ) -> Result<TxClaimOutcome<T>, Error> {
        let engine = self.engine;
        let resolved = adapter::resolve(&engine.core, &self.overrides)?;
        let Some(key) = self.key else {
            return Ok(TxClaimOutcome::Run(TxClaim {
                claim: None,
                retention: resolved.retention,
            }));
        };
        let request =
            ClaimRequest::new(&key, resolved.lease).fingerprint(self.fingerprint.as_ref());
        match engine.store.claim_in(conn, request).await? {
            ClaimOutcome::Claimed(claim) => Ok(TxClaimOutcome::Run(TxClaim {
                claim: Some(claim),
                retention: resolved.retention,
            })),
            ClaimOutcome::Completed(cached) => {
                adapter::replay(&engine.core, cached).map(TxClaimOutcome::Replayed)
            }
            ClaimOutcome::Locked { retry_after } => Err(Error::Locked { retry_after }),
            // A claim made outside any transaction with `OnLapse::Uncertain` lapsed: not run
            // again here either. (This mode's own claims are `OnLapse::Release`: a transaction
            // that dies rolls its claim back with its writes, so nothing is left uncertain.)
            ClaimOutcome::Uncertain { since } => Err(Error::Uncertain {
                operation: key,
                since,
            }),
            ClaimOutcome::Expired { since } => Err(Error::ResultExpired { since }),
        }
    }

    /// Claims the call's key, runs `work` on the same connection and stores its `Ok` value, all
    /// inside the caller's transaction; a completed key replays instead. A call without a key
    /// runs the work without deduplication. An `Err` releases the claim and is returned as is:
    /// roll back.
    pub async fn run<T, E, F>(self, conn: &mut S::Connection, work: F) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: for<'c> FnOnce(&'c mut S::Connection) -> TxFuture<'c, Result<T, E>>,
    {
        let engine = self.engine;
        let claim = match self.claim(conn).await? {
            TxClaimOutcome::Replayed(value) => return Ok(Outcome::Replayed(value)),
            TxClaimOutcome::Run(claim) => claim,
        };
        match work(conn).await {
            Ok(value) => {
                engine.finish(conn, claim, &value).await?;
                Ok(Outcome::Fresh(value))
            }
            Err(e) => {
                engine.release(conn, claim).await;
                Err(e)
            }
        }
    }
}
