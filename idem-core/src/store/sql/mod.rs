//! What the two SQL stores share: one store protocol, one row type, and the pruner a store runs
//! while it lives. (What the stores share with the kit, the dialect, table names, the duration
//! conversion and the migrator, is one layer down, in `crate::sql`.)
//!
//! - [`protocol`]: the store's statements and its operations, written once against a
//!   connection, generic over the database; the pool path and the caller's-transaction path
//!   ([`TransactionalStore`](crate::store::TransactionalStore)) both call them.
//! - [`row`]: a record row as read back, decoded once for both databases.
//! - [`schema`]: the names both stores' migrations fill in, and migrating, checking or
//!   scripting a records table with them.
//! - [`steps`]: the steps of an operation (docs/steps.md), in a table beside the records.
//! - [`background`]: the pruner a store runs while it lives.
//!
//! Each store (`store/sqlite/`, `store/postgres/`) keeps only its connection settings, its
//! schema and the [`SqlBackend`](protocol::SqlBackend) that ties them to the protocol.

use crate::error::{Error, StoreError, StoreErrorKind};

pub(crate) mod background;
pub(crate) mod protocol;
pub(crate) mod row;
pub(crate) mod schema;
pub(crate) mod steps;

/// The records table a store uses unless configured otherwise.
pub(crate) const DEFAULT_TABLE: &str = "idem_records";

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
