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
//! use idem_core::{Error, Key, Outcome, SqliteStore, Transactional};
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
//!         .run(&mut tx, Some(key), None, |tx| Box::pin(async move {
//!             sqlx::query("INSERT INTO ledger VALUES ('req-9', 500)").execute(&mut *tx).await?;
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

use crate::codec::{Codec, JsonCodec};
use crate::engine::{replay, seal, CallOptions, Encoded, Outcome, Policy};
use crate::error::Error;
use crate::key::{Fingerprint, Key};
use crate::record::{Claim, Completion, Start};
use crate::store::check_duration;
// Moved to the store module; re-exported here for `private.rs`, which still imports it from here.
pub(crate) use crate::store::TransactionalStore;

/// A boxed future borrowing the connection, as [`Transactional::run`]'s work returns.
pub type TxFuture<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// What [`Transactional::begin`] found.
#[derive(Debug)]
#[must_use = "run the work and call `finish`, or return the replayed value"]
pub enum TxStart<T> {
    /// The key is new (in this transaction): run the work on the same connection, then
    /// [`finish`](Transactional::finish).
    Run(TxClaim),
    /// The key completed earlier: this is its stored result.
    Replayed(T),
}

/// A claim made inside a transaction; it becomes visible to others only when the caller commits.
#[derive(Debug)]
pub struct TxClaim {
    claim: Claim,
    /// How long [`Transactional::finish`] keeps the result: chosen when the claim was made.
    retention: Duration,
}

/// The engine for transactional mode: [`Policy`] and codec over a [`TransactionalStore`].
///
/// Use [`run`](Self::run) with a closure, or [`begin`](Self::begin) and
/// [`finish`](Self::finish) around your own code. Either way, the caller opens and commits the
/// transaction. If the work fails, its claim is deleted inside the transaction, so committing or
/// rolling back both leave the key free for a retry.
///
/// ```
/// use idem_core::{SqliteStore, Transactional};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let idem = Transactional::new(SqliteStore::open(":memory:").await?);
/// assert_eq!(idem.policy().retention.as_secs(), 24 * 3600);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Transactional<S, C = JsonCodec> {
    store: S,
    policy: Policy,
    codec: C,
}

impl<S: TransactionalStore> Transactional<S, JsonCodec> {
    /// Transactional mode over `store` with the default policy and the JSON codec.
    pub fn new(store: S) -> Transactional<S, JsonCodec> {
        Transactional {
            store,
            policy: Policy::default(),
            codec: JsonCodec,
        }
    }
}

impl<S: TransactionalStore, C: Codec> Transactional<S, C> {
    /// Replaces the policy (lease, retention, response limit; `on_locked` does not apply: a
    /// concurrent duplicate waits on the database's lock).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::{Policy, SqliteStore, Transactional};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let policy = Policy { retention: Duration::from_secs(3600), ..Policy::default() };
    /// let idem = Transactional::new(SqliteStore::open(":memory:").await?).with_policy(policy)?;
    /// # let _ = idem; Ok(()) }
    /// ```
    pub fn with_policy(self, policy: Policy) -> Result<Self, Error> {
        policy.validate()?;
        Ok(Transactional { policy, ..self })
    }

    /// Uses another codec for stored results.
    pub fn with_codec<C2: Codec>(self, codec: C2) -> Transactional<S, C2> {
        Transactional {
            store: self.store,
            policy: self.policy,
            codec,
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Claims `key` inside the caller's transaction, or returns the stored result.
    ///
    /// [`Error::Locked`] means a claim made outside any transaction (by the ordinary engine) is
    /// running; [`Error::KeyReused`] that the fingerprint differs from the stored one.
    pub async fn begin<T: DeserializeOwned>(
        &self,
        conn: &mut S::Connection,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<TxStart<T>, Error> {
        self.begin_with(conn, &CallOptions::default(), key, fingerprint)
            .await
    }

    /// [`begin`](Self::begin) with per-call overrides of the policy's lease and retention (the
    /// retention applies when the claim is [`finish`](Self::finish)ed; `on_locked` is ignored:
    /// a concurrent duplicate waits on the database's lock). Both durations are checked before
    /// anything is written.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::{CallOptions, Error, Key, SqliteStore, Transactional, TxStart};
    /// use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = SqliteStore::connect("sqlite::memory:").await?;
    /// let idem = Transactional::new(store.clone());
    /// let mut conn = store.pool().acquire().await?;
    /// let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    /// let week = CallOptions { retention: Some(Duration::from_secs(7 * 24 * 3600)), ..CallOptions::default() };
    /// let key = Key::derive("statement", "acct-1", "2026-11")?;
    /// if let TxStart::<u64>::Run(claim) = idem.begin_with(&mut tx, &week, &key, None).await? {
    ///     idem.finish(&mut tx, claim, &42u64).await?; // kept for a week
    /// }
    /// tx.commit().await?;
    ///
    /// let zero = CallOptions { retention: Some(Duration::ZERO), ..CallOptions::default() };
    /// let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    /// let other = Key::derive("statement", "acct-1", "2026-12")?;
    /// let refused = idem.begin_with::<u64>(&mut tx, &zero, &other, None).await;
    /// assert!(matches!(refused, Err(Error::InvalidConfig(_))));
    /// # Ok(()) }
    /// ```
    pub async fn begin_with<T: DeserializeOwned>(
        &self,
        conn: &mut S::Connection,
        options: &CallOptions,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<TxStart<T>, Error> {
        let lease = options.lease.unwrap_or(self.policy.lease);
        let retention = options.retention.unwrap_or(self.policy.retention);
        check_duration("lease", lease)?;
        check_duration("retention", retention)?;
        match self.store.start_in(conn, key, fingerprint, lease).await? {
            Start::Started(claim) => Ok(TxStart::Run(TxClaim { claim, retention })),
            Start::Completed(cached) => {
                replay(cached, |bytes| self.codec.decode(bytes), Error::StoredError)
                    .map(|outcome| TxStart::Replayed(outcome.into_inner()))
            }
            Start::Locked { retry_after } => Err(Error::Locked { retry_after }),
        }
    }

    /// Stores `value` as the claim's result, inside the caller's transaction, for the retention
    /// chosen at [`begin_with`](Self::begin_with) (the policy's by default). It becomes the
    /// replayed answer when the caller commits. A value larger than
    /// [`Policy::max_response_bytes`] (or one the codec refuses) is not kept: the key is recorded
    /// as completed without it, and a retry gets [`Error::ResultNotRetained`].
    pub async fn finish<T: Serialize>(
        &self,
        conn: &mut S::Connection,
        claim: TxClaim,
        value: &T,
    ) -> Result<(), Error> {
        let encoded = Encoded::from(self.codec.encode(value));
        let sealed = seal(encoded, self.policy.max_response_bytes, claim.claim.key());
        let done = Completion {
            response: Some(&sealed),
            is_error: false,
        };
        self.store
            .complete_in(conn, &claim.claim, done, claim.retention)
            .await
    }

    /// Deletes the claim inside the transaction after the work failed, so a commit leaves the key
    /// free. Errors are ignored: an aborted transaction must be rolled back anyway, which also
    /// removes the claim.
    pub async fn release(&self, conn: &mut S::Connection, claim: TxClaim) {
        if let Err(e) = self.store.abort_in(conn, &claim.claim).await {
            tracing::debug!(key = %claim.claim.key(), error = %e, "releasing a transactional claim failed; rolling back removes it");
        }
    }

    /// Claims `key`, runs `work` on the same connection and stores its `Ok` value, all inside the
    /// caller's transaction; a completed key replays instead. `key: None` runs the work without
    /// deduplication. An `Err` releases the claim and is returned as is: roll back.
    pub async fn run<T, E, F>(
        &self,
        conn: &mut S::Connection,
        key: Option<Key>,
        fingerprint: Option<Fingerprint>,
        work: F,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: for<'c> FnOnce(&'c mut S::Connection) -> TxFuture<'c, Result<T, E>>,
    {
        let Some(key) = key else {
            return work(conn).await.map(Outcome::Fresh);
        };
        let claim = match self.begin(conn, &key, fingerprint.as_ref()).await? {
            TxStart::Replayed(value) => return Ok(Outcome::Replayed(value)),
            TxStart::Run(claim) => claim,
        };
        match work(conn).await {
            Ok(value) => {
                self.finish(conn, claim, &value).await?;
                Ok(Outcome::Fresh(value))
            }
            Err(e) => {
                self.release(conn, claim).await;
                Err(e)
            }
        }
    }
}
