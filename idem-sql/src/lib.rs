//! SQLite and PostgreSQL for [idem](https://docs.rs/idem): the stores ([`SqliteStore`],
//! [`PostgresStore`]), the transactional mode ([`Transactional`]: the claim, your writes and the
//! completion in one transaction of yours), `steps.tx` ([`SqlSteps`]), the SQL half of the
//! concurrency [`kit`], and the stores' migrations.
//!
//! **Depend on `idem` with the feature `sqlite` (the default) or `postgres`, not on this
//! crate**: `idem` re-exports all of this (`idem::SqliteStore`, `idem::Transactional`,
//! `idem::kit::VersionedTable`, …) and opens `sqlite:` and `postgres://` URLs
//! (`idem::store::url`).
//!
//! This crate is the seam that shows sqlx (0.8) in its API, so that a new version of sqlx changes
//! this crate only. sqlx's errors become idem's with [`sql_error`]
//! (`.map_err(idem::sql_error)?`): the orphan rule keeps `From<sqlx::Error>` off idem-core's
//! error types, which this crate does not own.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]
// With neither database (`--no-default-features`), the crate is its protocol, generic over a
// database that nothing instantiates: it builds, and has no store to offer.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(unused))]

// How it is laid out. What the SQL stores (`sqlite/`, `postgres/`) and the kit build on: what
// differs between SQLite and PostgreSQL, validated table names, the one duration conversion, the
// migrator, and the store protocol both stores share.
//
// - [`dialect`]: what differs between SQLite and PostgreSQL (the clock, placeholders, types),
//   and the sealed glue to sqlx.
// - [`error`]: sqlx's errors as [`StoreError`](idem_core::StoreError)s, by SQLSTATE or SQLite code.
// - [`name`]: [`TableName`](name::TableName), validated and quoted on render.
// - [`migrate`]: versioned [`Migration`](migrate::Migration)s applied in one transaction with a
//   `<table>_migrations` ledger, checked without changes, or written out as a `.sql` script.
// - [`protocol`]: the store's statements and its operations, written once against a
//   connection, generic over the database; the pool path and the caller's-transaction path
//   ([`TransactionalStore`](crate::TransactionalStore)) both call them.
// - [`row`]: a record row as read back, decoded once for both databases.
// - [`schema`]: the names both stores' migrations fill in, and migrating, checking or
//   scripting a records table with them.
// - [`steps`]: the steps of an operation (docs/steps.md), in a table beside the records.
// - [`admin`]: `StoreAdmin` for the SQL stores, one statement per call.
// - [`background`]: the pruner a store runs while it lives.
// - [`steps_tx`]: `steps.tx`, the atomic step in the caller's transaction
//   ([`SqlSteps`](steps_tx::SqlSteps)).
//
// - `store`: `SqlStore<DB>`, the one store type (`SqliteStore`, `PostgresStore` are its
//   aliases), its `Store`, `TransactionalStore` and accessors, and its builder's shared settings.
//
// Each database keeps only its connection settings and its schema (`sqlite/`, `postgres/`).

use std::time::Duration;

use idem_core::store::support::check_duration;
use idem_core::{Error, StoreError, StoreErrorKind};

pub(crate) mod admin;
pub(crate) mod background;
pub(crate) mod dialect;
pub(crate) mod error;
pub(crate) mod group;
pub(crate) mod migrate;
pub(crate) mod name;
pub(crate) mod protocol;
pub(crate) mod row;
pub(crate) mod schema;
pub(crate) mod steps;
pub(crate) mod steps_tx;

mod claim_order;
pub mod kit;
mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;
mod transactional;

#[doc(hidden)]
pub mod __private;

/// The sqlx (0.8) this crate is built with: its pools and connections appear in the SQL stores'
/// API (`SqliteStore::pool`, `TransactionalStore::Connection`) and the kit's. Use this path to
/// name the very version idem uses. A major version of sqlx changes this crate's major version,
/// and no other idem crate's.
pub use sqlx;

pub use claim_order::ClaimOrder;
pub use error::sql_error;
#[cfg(feature = "postgres")]
pub use outbox::PostgresOutbox;
#[cfg(feature = "sqlite")]
pub use outbox::SqliteOutbox;
pub use outbox::{SqlOutbox, MAX_OUTBOX_MESSAGES_PER_ADD};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PostgresStore, PostgresStoreBuilder};
pub use protocol::TransactionalStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::{SqliteStore, SqliteStoreBuilder, SqliteSync};
pub use steps_tx::SqlSteps;
pub use store::{SqlStore, SqlStoreBuilder};
pub use transactional::{Transactional, TxCall, TxClaim, TxClaimOutcome, TxFuture};

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

/// A completion's `key_retention` as the stores keep it: whole seconds, **rounded up** (as every
/// store keeps a tombstone's length, docs/architecture.md "Past the lease"), in the
/// milliseconds SQL adds to a time; zero for no tombstone. Checked first as
/// [`Completion::check`](idem_core::Completion::check) checks it (zero, or 1 ms to ten years).
pub(crate) fn key_retention_millis(d: Duration) -> Result<i64, Error> {
    if d.is_zero() {
        return Ok(0);
    }
    check_duration("key_retention", d)?;
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    Ok(i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX))
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
    fn key_retention_is_whole_seconds_rounded_up() {
        assert_eq!(key_retention_millis(Duration::ZERO).unwrap(), 0);
        assert_eq!(
            key_retention_millis(Duration::from_millis(1)).unwrap(),
            1000
        );
        assert_eq!(key_retention_millis(Duration::from_secs(2)).unwrap(), 2000);
        assert_eq!(
            key_retention_millis(Duration::from_millis(2001)).unwrap(),
            3000
        );
        assert!(key_retention_millis(Duration::from_nanos(1)).is_err());
        assert!(key_retention_millis(Duration::from_secs(u64::MAX)).is_err());
    }

    #[test]
    fn millis_round_up_and_check_range() {
        assert_eq!(millis("lease", Duration::from_micros(1500)).unwrap(), 2);
        assert_eq!(millis("lease", Duration::from_secs(3)).unwrap(), 3000);
        assert!(millis("lease", Duration::ZERO).is_err());
        assert!(millis("lease", Duration::from_secs(u64::MAX)).is_err());
    }
}
