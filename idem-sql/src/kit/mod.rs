//! The concurrency kit: optimistic concurrency and request deduplication for the data that
//! retried work changes.
//!
//! The engine makes a retried *call* run once. The kit protects the *data* the call writes, with
//! four strategies that each fit a different store. All of them run on SQLite (feature `sqlite`)
//! and PostgreSQL (feature `postgres`) through sqlx, on a connection, a pool or a transaction of
//! yours, and keep time with the database's clock.
//!
//! | strategy | what it guarantees | round trips per change |
//! |---|---|---|
//! | [versioned updates](VersionedTable) | no lost update: a write based on a stale read fails with [`ConcurrencyError::Conflict`] | load 1 + save 1; a conflict costs 1 more read, then a whole retry |
//! | [event streams](EventStreams) | appends at an expected version; the same request appended twice adds its events once | 1 append (+1 read on a conflict or a duplicate; +2 for a savepoint inside your own PostgreSQL transaction) |
//! | [request history](RequestHistory) | exactly once, in your own transaction beside the business write | 1 insert inside the transaction you already run; pruning runs off the hot path ([`RequestHistory::pruner`]) |
//! | [recent ids](idem_core::kit::RecentIds) | duplicates among the last N requests are skipped, for stores without transactions | 0 extra: the ids travel inside the aggregate's own row, saved with a versioned update |
//!
//! - **Versioned updates** compare and bump a version column in one conditional
//!   `UPDATE … SET …, version = version + 1 WHERE id = ? AND version = ?`. Zero rows changed is
//!   either a conflict or a missing row; a follow-up read of the version tells which, never the
//!   text of an error. A request that carries the version its client saw is rejected when the
//!   aggregate moved on, which also stops a blind replay; it does not identify duplicates, so a
//!   client that retried after a lost reply sees a conflict it must reconcile.
//!   [`retry_on_conflict`](idem_core::kit::retry_on_conflict) reruns load-modify-save for writers that should simply win eventually.
//! - **Event streams** store events under a unique `(stream, version)`; an append states which
//!   version it expects ([`ExpectedVersion`]). Event ids are UUID v5 derived from the request id
//!   ([`event_ids`]) and unique in the table, so a repeated request is recognised exactly by its
//!   ids and reported as [`Appended::Duplicate`] with nothing added.
//! - **Request history** records `(scope, request_id)` in a table, inside the transaction that
//!   does the business write: [`Recorded::Duplicate`] means "already done". The insert uses
//!   `ON CONFLICT DO NOTHING`, so a duplicate never aborts the caller's PostgreSQL transaction. A
//!   [`RequestHistory::pruner`] deletes ids older than the retention window in
//!   bounded batches, one instance at a time.
//! - **Recent ids** keep a bounded set of the last N request ids inside the aggregate
//!   ([`RecentIds`](idem_core::kit::RecentIds)), serialised with it. Combined with a versioned save, concurrent duplicates
//!   conflict, reload, and then find their id. Only the last N are remembered: a duplicate older
//!   than that is applied again.
//!
//! Every operation takes `&mut` of a connection: `&mut conn` for one taken from a pool,
//! `&mut tx` (or `&mut *tx`) for a transaction, so it joins whatever transaction you run. (A
//! generic `impl Acquire` would also take `&pool`, but makes the futures of callers holding a
//! transaction fail the `Send` check that `tokio::spawn` and web frameworks require.)
//!
//! Table and column names are validated as plain SQL identifiers (`[A-Za-z_][A-Za-z0-9_]{0,62}`)
//! and quoted, as the stores quote theirs: a reserved word works as a name, and on PostgreSQL a
//! name is case-sensitive (`Accounts` is not `accounts`; the kit's default names are lower
//! case). Every value is a bound parameter. The tables the kit creates are versioned like the
//! stores': [`RequestHistory::ensure_schema`] and [`EventStreams::ensure_schema`] apply their
//! migrations once and record them in `<table>_migrations`.

use idem_core::kit::{Recorded, Version};
use idem_core::{KeyError, StoreError};

/// The databases the kit runs on: the SQL stores' own dialects (`dialect.rs`), so the kit keeps
/// time and quotes names exactly as the stores do.
mod backend {
    pub(crate) use crate::dialect::is_unique_violation;
    pub use crate::dialect::{Backend, SqlQuery};
}
mod history;
mod history_pruner;
mod stream;
mod versioned;

pub use backend::{Backend, SqlQuery};
pub use history::RequestHistory;
pub use stream::{
    event_ids, Appended, Event, EventIds, EventStreams, ExpectedVersion, NewEvent, EVENT_NAMESPACE,
    MAX_EVENTS_PER_APPEND,
};
pub use versioned::{Entity, Inserted, Versioned, VersionedTable, VersionedTableBuilder};

/// What can go wrong in the concurrency kit. Each variant says what the caller can do.
///
/// ```
/// use idem::kit::{ConcurrencyError, IsConflict, Version};
/// let e = ConcurrencyError::Conflict { expected: Version::new(3), actual: Version::new(4) };
/// assert!(e.is_conflict());
/// assert_eq!(e.to_string(), "version conflict: expected version 3 but found 4; reload and apply the change again");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConcurrencyError {
    /// Someone else changed the row or stream since it was read. Nothing was written. Reload and
    /// apply the change again ([`retry_on_conflict`](idem_core::kit::retry_on_conflict) does that), or report the conflict.
    #[error(
        "version conflict: expected version {expected} but found {actual}; reload and apply the change again"
    )]
    Conflict {
        /// The version the write was based on ([`Version::NONE`] for "no stream yet").
        expected: Version,
        /// The version found in the database.
        actual: Version,
    },

    /// No row has this id. Insert it first.
    #[error("no row with this id: insert it first")]
    NotFound,

    /// A table or column name, a duration or a limit is out of range. Nothing was touched.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// An argument is out of range (an empty batch of events, a stream name too long). Nothing
    /// was written.
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// A scope or request id is not 1 to 255 bytes of printable ASCII. Nothing was written.
    #[error("invalid request id: {0}")]
    InvalidKey(#[from] KeyError),

    /// The database could not be reached or refused the statement.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for ConcurrencyError {
    fn from(e: sqlx::Error) -> ConcurrencyError {
        ConcurrencyError::Store(crate::error::sql_error(e))
    }
}

impl idem_core::kit::IsConflict for ConcurrencyError {
    /// Only [`ConcurrencyError::Conflict`]: a missing row or a store failure will not go away by
    /// trying again.
    fn is_conflict(&self) -> bool {
        matches!(self, ConcurrencyError::Conflict { .. })
    }
}

/// The kit's name for [`TableName`](crate::name::TableName) (the pruner's).
pub(crate) type Ident = crate::name::TableName;

/// A table or column name, validated (see [`Ident`]); `what` names it in the error.
pub(crate) fn name(what: &str, name: &str) -> Result<Ident, ConcurrencyError> {
    Ident::new(what, name).map_err(invalid_config)
}

/// A duration checked and converted by the stores' one conversion
/// ([`millis`](crate::millis): whole milliseconds, rounded up).
pub(crate) fn millis(what: &str, d: std::time::Duration) -> Result<i64, ConcurrencyError> {
    crate::millis(what, d).map_err(invalid_config)
}

/// A store error as the kit's. A configuration error keeps its message, not its Display, which
/// already says "invalid configuration: ".
pub(crate) fn invalid_config(e: idem_core::Error) -> ConcurrencyError {
    match e {
        idem_core::Error::InvalidConfig(message) => ConcurrencyError::InvalidConfig(message),
        idem_core::Error::Store(e) => ConcurrencyError::Store(e),
        other => ConcurrencyError::InvalidConfig(other.to_string()),
    }
}

/// A version as stored: a non-negative BIGINT. (A function, not a method of [`Version`], as
/// the SQL kit is to live in a crate of its own.)
pub(crate) fn version_to_sql(version: Version) -> Result<i64, ConcurrencyError> {
    i64::try_from(version.get()).map_err(|_| {
        ConcurrencyError::InvalidInput(format!(
            "version {version} is beyond the largest storable version {}",
            i64::MAX
        ))
    })
}

/// Reads a stored version; a negative one means the row was written by something else.
pub(crate) fn version_from_sql(raw: i64) -> Result<Version, ConcurrencyError> {
    u64::try_from(raw).map(Version::new).map_err(|_| {
        ConcurrencyError::Store(StoreError::new(
            idem_core::StoreErrorKind::Corrupt,
            format!("stored version {raw} is negative"),
        ))
    })
}

/// Brings a kit table up to date with the stores' migrator (see
/// [`Schema::migrate`](crate::migrate::Schema::migrate)).
pub(crate) async fn migrate<DB: Backend>(
    conn: &mut DB::Connection,
    schema: &crate::migrate::Schema<'_>,
) -> Result<(), ConcurrencyError> {
    use crate::migrate::{unknown_version, Migrated};
    match schema.migrate::<DB>(conn).await.map_err(invalid_config)? {
        Migrated::UpToDate => Ok(()),
        Migrated::UnknownVersion(v) => Err(invalid_config(unknown_version(schema.table, v))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_plain() {
        assert!(name("table", "idem_events").is_ok());
        assert!(name("table", "_t1").is_ok());
        assert!(name("table", &"a".repeat(63)).is_ok());
        for bad in ["", "1t", "t-1", "t;drop", "\"t\"", "tä", &"a".repeat(64)] {
            assert!(
                matches!(name("table", bad), Err(ConcurrencyError::InvalidConfig(_))),
                "{bad:?} was accepted"
            );
        }
        // The names derived from the longest still fit.
        let long = name("table", &"a".repeat(63)).unwrap();
        assert!(long.suffixed("_pruner").name().len() <= 63);
    }

    #[test]
    fn a_zero_duration_names_the_error_once() {
        let e = millis("retention", std::time::Duration::ZERO).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid configuration: retention must be between 1 ms and 10 years, got 0ns"
        );
    }

    #[test]
    fn versions_round_trip_through_sql() {
        assert_eq!(version_to_sql(Version::new(5)).unwrap(), 5);
        assert!(version_to_sql(Version::new(u64::MAX)).is_err());
        assert_eq!(version_from_sql(9).unwrap(), Version::new(9));
        assert!(matches!(
            version_from_sql(-1),
            Err(ConcurrencyError::Store(_))
        ));
    }
}
