//! What the SQL stores (`store/sqlite/`, `store/postgres/`) and the concurrency kit build on:
//! what differs between SQLite and PostgreSQL, validated table names, the one duration
//! conversion, the migrator, and the store protocol both stores share.
//!
//! - [`dialect`]: what differs between SQLite and PostgreSQL (the clock, placeholders, types),
//!   and the sealed glue to sqlx.
//! - [`error`]: sqlx's errors as [`StoreError`](crate::StoreError)s, by SQLSTATE or SQLite code.
//! - [`name`]: [`TableName`](name::TableName), validated and quoted on render.
//! - [`migrate`]: versioned [`Migration`](migrate::Migration)s applied in one transaction with a
//!   `<table>_migrations` ledger, checked without changes, or written out as a `.sql` script.
//! - [`protocol`]: the store's statements and its operations, written once against a
//!   connection, generic over the database; the pool path and the caller's-transaction path
//!   ([`TransactionalStore`](crate::store::TransactionalStore)) both call them.
//! - [`row`]: a record row as read back, decoded once for both databases.
//! - [`schema`]: the names both stores' migrations fill in, and migrating, checking or
//!   scripting a records table with them.
//! - [`steps`]: the steps of an operation (docs/steps.md), in a table beside the records.
//! - [`admin`]: `StoreAdmin` for the SQL stores, one statement per call.
//! - [`background`]: the pruner a store runs while it lives.
//! - [`steps_tx`]: `steps.tx`, the atomic step in the caller's transaction
//!   ([`SqlSteps`](steps_tx::SqlSteps)).
//!
//! Each store keeps only its connection settings, its schema and the
//! [`SqlBackend`](protocol::SqlBackend) that ties them to the protocol.

use std::time::Duration;

use crate::error::{Error, StoreError, StoreErrorKind};
use crate::store::support::check_duration;

pub(crate) mod admin;
pub(crate) mod background;
pub(crate) mod dialect;
pub(crate) mod error;
pub(crate) mod migrate;
pub(crate) mod name;
pub(crate) mod protocol;
pub(crate) mod row;
pub(crate) mod schema;
pub(crate) mod steps;
pub(crate) mod steps_tx;

/// The records table a store uses unless configured otherwise.
pub(crate) const DEFAULT_TABLE: &str = "idem_records";

/// The one conversion of a lease, retention or interval into what SQL adds to the database's
/// clock: whole milliseconds, **rounded up**, so a lease is never shorter than asked. The
/// duration is first checked by [`check_duration`] (1 ms to ten years, far inside an `i64` of
/// milliseconds).
pub(crate) fn millis(what: &str, d: Duration) -> Result<i64, Error> {
    check_duration(what, d)?;
    let ms = d.as_nanos().div_ceil(1_000_000);
    Ok(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// A fenced statement (complete, renew, abort) changed no row: the record no longer carries the
/// claim's token (or, for renew and abort, has completed).
pub(crate) fn fenced(rows_affected: u64) -> Result<(), Error> {
    if rows_affected == 0 {
        Err(Error::LeaseLost)
    } else {
        Ok(())
    }
}

/// A stored row that does not have the shape the store writes.
pub(crate) fn corrupt(what: String) -> Error {
    Error::Store(StoreError::new(StoreErrorKind::Corrupt, what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up_and_check_range() {
        assert_eq!(millis("lease", Duration::from_micros(1500)).unwrap(), 2);
        assert_eq!(millis("lease", Duration::from_secs(3)).unwrap(), 3000);
        assert!(millis("lease", Duration::ZERO).is_err());
        assert!(millis("lease", Duration::from_secs(u64::MAX)).is_err());
    }
}
