//! The concurrency kit's parts that need no database: [`Version`], [`Recorded`], [`RecentIds`]
//! and [`retry_on_conflict`].
//!
//! The kit's SQL strategies (versioned updates, event streams, request history) and its error
//! type, `ConcurrencyError`, are idem-sql's; `idem::kit` shows both halves as one module, whose
//! documentation compares the four strategies.

use std::fmt;

use serde::{Deserialize, Serialize};

mod recent;
mod retry;

pub use recent::RecentIds;
pub use retry::{retry_on_conflict, IsConflict, RetryPolicy};

/// The version of a row or a stream: how many changes it has seen.
///
/// A row inserted through `VersionedTable::insert` starts at [`Version::INITIAL`] and every
/// save adds one. A stream's version is the version of its last event; an empty stream is at
/// [`Version::NONE`].
///
/// ```
/// use idem::kit::Version;
/// let v = Version::INITIAL;
/// assert_eq!(v.get(), 1);
/// assert_eq!(v.next(), Version::new(2));
/// assert!(Version::NONE < v);
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Version(u64);

impl Version {
    /// No change yet: an empty stream, or a row that does not exist.
    pub const NONE: Version = Version(0);
    /// The version of a freshly inserted row and of a stream's first event.
    pub const INITIAL: Version = Version(1);

    /// Wraps a raw version number, for instance one a client sent back.
    ///
    /// ```
    /// assert_eq!(idem::kit::Version::new(7).get(), 7);
    /// ```
    pub const fn new(version: u64) -> Version {
        Version(version)
    }

    /// The raw version number.
    ///
    /// ```
    /// assert_eq!(idem::kit::Version::NONE.get(), 0);
    /// ```
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The version after one more change.
    ///
    /// ```
    /// use idem::kit::Version;
    /// assert_eq!(Version::NONE.next(), Version::INITIAL);
    /// ```
    pub const fn next(self) -> Version {
        Version(self.0.saturating_add(1))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The outcome of recording a request id: in the SQL kit's `RequestHistory` table or in a [`RecentIds`]
/// set.
///
/// ```
/// use idem::kit::{RecentIds, Recorded};
/// let mut seen = RecentIds::new(std::num::NonZeroUsize::new(8).unwrap());
/// assert_eq!(seen.insert("req-1"), Recorded::New);
/// assert_eq!(seen.insert("req-1"), Recorded::Duplicate);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a duplicate means the work was already done: skip it"]
pub enum Recorded {
    /// First time seen: do the work.
    New,
    /// Already recorded: the work was done before. Skip it.
    Duplicate,
}
