//! Support for the code `#[idempotent(transaction = …)]` expands to (the facade re-exports it
//! beside idem-core's `__private`). Not a public API: it may change in any release.

use idem_core::__private::{EngineArg, Prepared};
use idem_core::{Codec, Error};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{Transactional, TransactionalStore, TxClaim, TxClaimOutcome};

impl<S: TransactionalStore, C: Codec> EngineArg<Transactional<S, C>> for Transactional<S, C> {
    fn engine(&self) -> &Transactional<S, C> {
        self
    }
}

/// The caller's connection, as the engine's store needs it: `&mut *tx` coerces to it from a
/// `&mut` connection, a `&mut Transaction` or a `&mut PoolConnection`. (One function for both
/// uses, so a wrong type is reported once.)
pub fn tx_connection<'c, S: TransactionalStore, C: Codec>(
    _engine: &Transactional<S, C>,
    conn: &'c mut S::Connection,
) -> &'c mut S::Connection {
    conn
}

/// Claims the call's key on the caller's connection (when the call has a key), or fetches its
/// stored value. An invalid key or fingerprint is returned before the database is touched.
pub async fn tx_begin<S, C, T>(
    engine: &Transactional<S, C>,
    conn: &mut S::Connection,
    prepared: Prepared,
) -> Result<TxClaimOutcome<T>, Error>
where
    S: TransactionalStore,
    C: Codec,
    T: DeserializeOwned,
{
    let (key, fingerprint, options) = prepared.parts()?;
    let call = engine.call(key).fingerprint(fingerprint);
    call.overrides(options).claim(conn).await
}

/// After the body: stores an `Ok` value under the claim, or releases the claim on `Err`, on the
/// caller's connection.
pub async fn tx_end<S, C, T, E>(
    engine: &Transactional<S, C>,
    conn: &mut S::Connection,
    claim: TxClaim,
    result: Result<T, E>,
) -> Result<T, E>
where
    S: TransactionalStore,
    C: Codec,
    T: Serialize,
    E: From<Error>,
{
    match result {
        Ok(value) => {
            engine.finish(conn, claim, &value).await?;
            Ok(value)
        }
        Err(e) => {
            engine.release(conn, claim).await;
            Err(e)
        }
    }
}

/// Whether every connection `store` holds is idle: none in use, none on its way back to its
/// pool (sqlx hands a connection back by a task of its own after its last statement). For tests
/// that stop tokio's clock: an acquire that waits for a connection on its way back under a
/// stopped clock times out at once, as the clock jumps to its deadline.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = idem::SqliteStore::connect("sqlite::memory:").await.unwrap();
/// // The connection that migrated the table may still be on its way back.
/// let idle = || async { idem::__private::sqlite_connections_idle(&store) };
/// assert!(idem_test_support::eventually(idle).await);
/// # }
/// # #[cfg(not(feature = "sqlite"))] fn main() {}
/// ```
#[cfg(feature = "sqlite")]
pub fn sqlite_connections_idle(store: &crate::SqliteStore) -> bool {
    let idle = |pool: &sqlx::SqlitePool| pool.num_idle() == pool.size() as usize;
    let group = store.protocol.group().map(|g| g.pools());
    idle(&store.pool)
        && idle(&store.renew_pool)
        && group.is_none_or(|pools| pools.into_iter().all(idle))
}
