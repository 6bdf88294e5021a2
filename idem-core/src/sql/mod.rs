//! The SQL plumbing the SQL stores and the concurrency kit both build on, below both: what
//! differs between SQLite and PostgreSQL, validated table names, the one duration conversion,
//! and the migrator.
//!
//! - [`dialect`]: what differs between SQLite and PostgreSQL (the clock, placeholders, types),
//!   and the sealed glue to sqlx.
//! - [`error`]: sqlx's errors as [`StoreError`](crate::StoreError)s, by SQLSTATE or SQLite code.
//! - [`name`]: [`TableName`](name::TableName), validated and quoted on render.
//! - [`migrate`]: versioned [`Migration`](migrate::Migration)s applied in one transaction with a
//!   `<table>_migrations` ledger, checked without changes, or written out as a `.sql` script.

use std::time::Duration;

use crate::error::Error;
use crate::store::check_duration;

pub(crate) mod dialect;
pub(crate) mod error;
pub(crate) mod migrate;
pub(crate) mod name;

/// The one conversion of a lease, retention or interval into what SQL adds to the database's
/// clock: whole milliseconds, **rounded up**, so a lease is never shorter than asked. The
/// duration is first checked by [`check_duration`] (1 ms to ten years, far inside an `i64` of
/// milliseconds).
pub(crate) fn millis(what: &str, d: Duration) -> Result<i64, Error> {
    check_duration(what, d)?;
    let ms = d.as_nanos().div_ceil(1_000_000);
    Ok(i64::try_from(ms).unwrap_or(i64::MAX))
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
