//! The one error type of idem.

use std::time::Duration;

use crate::key::{FingerprintError, KeyError};

/// A boxed error from a backend or codec.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in idem. Each variant says what the caller can do about it.
///
/// Functions behind `#[idempotent]` return `Result<T, E>` with `E: From<idem::Error>`, so these
/// errors reach the caller through the function's own error type.
///
/// ```
/// use idem_core::Error;
/// let e = Error::Locked { retry_after: std::time::Duration::from_secs(2) };
/// assert!(e.is_retryable());
/// assert!(!Error::KeyReused.is_retryable());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The scope, caller or client key is malformed. Nothing was stored.
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[from] KeyError),

    /// The request given as the call's fingerprint could not be fingerprinted: it nests too deep
    /// or its `Serialize` implementation failed. Nothing was stored; fingerprint a flatter view
    /// of the request, such as the fields that identify it.
    #[error("cannot fingerprint the request: {0}")]
    Fingerprint(#[from] FingerprintError),

    /// The key was used before for a request with another fingerprint. Use a new key for a new
    /// request. Nothing was changed.
    #[error("idempotency key reused for a different request: send a new key for a new request")]
    KeyReused,

    /// Another call holds a live claim on this key. Retry after `retry_after`, or configure
    /// [`OnLocked::Wait`](crate::OnLocked::Wait) to wait for it.
    #[error("another call is running this key; retry after {retry_after:?}")]
    Locked {
        /// How long until the other claim's lease ends at the latest.
        retry_after: Duration,
    },

    /// The claim's lease ended and the key was taken over (or evicted) before this call could
    /// finish. The work may have run twice: reconcile before retrying.
    #[error(
        "lease lost: the claim expired and the key was taken over; the work may have run twice"
    )]
    LeaseLost,

    /// The work for this key completed earlier, but its result was not kept (it was larger than
    /// [`Policy::max_response_bytes`](crate::Policy::max_response_bytes), or could not be captured,
    /// such as an HTTP response with trailers). The work does not run again for this key until its
    /// retention ends: look up the effect another way (read the resource it created) instead of
    /// retrying.
    #[error("the work for this key already ran, but its result was not kept ({reason}); it will not run again: look up its effect instead of retrying")]
    ResultNotRetained {
        /// Why the result was not kept, as recorded when the work completed.
        reason: String,
    },

    /// A lease, retention or limit is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// A stored response could not be encoded or decoded (for instance the type changed since
    /// it was stored). Evict the key or bump the scope.
    #[error("codec failed: {0}")]
    Codec(#[source] BoxError),

    /// The replayed call had failed and its error was stored (see
    /// [`Policy::store_errors`](crate::Policy)). The payload is the stored error, encoded.
    #[error("the original call failed and its error was stored")]
    StoredError(Vec<u8>),

    /// The store could not be reached or refused the statement.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// Whether the same call may succeed if simply retried later (a live claim elsewhere, or a
    /// store failure that passes: see [`StoreErrorKind::is_transient`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Locked { .. } => true,
            Error::Store(e) => e.kind().is_transient(),
            _ => false,
        }
    }
}

/// What kind of store failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached (connection refused or lost, pool timed out, server
    /// shutting down, SQLite's lock held past the busy timeout). Retrying later may succeed.
    /// Whether a statement that failed this way took effect is unknown.
    Unavailable,
    /// The statement failed for a reason that passes: a statement or lock timeout, a
    /// serialization failure, a deadlock. Retrying may succeed.
    Transient,
    /// The store is out of space (disk or quota full). Nothing was written; retrying succeeds
    /// once space is freed.
    Full,
    /// The store refuses writes (a read-only file or file system, a standby server). Nothing was
    /// written.
    ReadOnly,
    /// The store rejected a statement.
    Query,
    /// A stored row or file does not have the expected shape (wrong byte length, unknown state,
    /// a checksum that does not match, a damaged database file).
    Corrupt,
}

impl StoreErrorKind {
    /// Whether an operation that failed this way may succeed if simply retried later:
    /// [`Unavailable`](Self::Unavailable), [`Transient`](Self::Transient),
    /// [`Full`](Self::Full) and [`ReadOnly`](Self::ReadOnly) describe the store's state, not
    /// the statement, and pass.
    ///
    /// ```
    /// use idem_core::StoreErrorKind;
    /// assert!(StoreErrorKind::Transient.is_transient());
    /// assert!(!StoreErrorKind::Corrupt.is_transient());
    /// ```
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            StoreErrorKind::Unavailable
                | StoreErrorKind::Transient
                | StoreErrorKind::Full
                | StoreErrorKind::ReadOnly
        )
    }
}

/// A failure of the store's backend, with its kind and the backend's own error as source.
///
/// ```
/// use idem_core::{StoreError, StoreErrorKind};
/// let e = StoreError::new(StoreErrorKind::Corrupt, "token is 3 bytes");
/// assert_eq!(e.kind(), StoreErrorKind::Corrupt);
/// ```
#[derive(Debug, thiserror::Error)]
#[error("store {}: {source}", match .kind {
    StoreErrorKind::Unavailable => "unavailable",
    StoreErrorKind::Transient => "failed for a passing reason",
    StoreErrorKind::Full => "is full",
    StoreErrorKind::ReadOnly => "is read-only",
    StoreErrorKind::Query => "query failed",
    StoreErrorKind::Corrupt => "holds a corrupt record",
})]
pub struct StoreError {
    kind: StoreErrorKind,
    #[source]
    source: BoxError,
}

impl StoreError {
    /// Wraps a backend error.
    pub fn new(kind: StoreErrorKind, source: impl Into<BoxError>) -> StoreError {
        StoreError {
            kind,
            source: source.into(),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> StoreError {
        let kind = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => StoreErrorKind::Unavailable,
            // SQLSTATE class 08 is connection exceptions; 57P01..57P03 are admin shutdown,
            // crash shutdown and "cannot connect now" (the server is starting or stopping).
            sqlx::Error::Database(db) => match db.code().as_deref() {
                Some(code) if code.starts_with("08") || code.starts_with("57P") => {
                    StoreErrorKind::Unavailable
                }
                Some(code) if sqlite_busy(&**db, code) => StoreErrorKind::Unavailable,
                _ => StoreErrorKind::Query,
            },
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
            _ => StoreErrorKind::Query,
        };
        StoreError::new(kind, e)
    }
}

/// SQLite's SQLITE_BUSY (5) or SQLITE_LOCKED (6), possibly extended (the primary code is the low
/// byte): another connection held the lock past the busy timeout, so a retry may succeed.
#[cfg(feature = "sqlite")]
fn sqlite_busy(db: &dyn sqlx::error::DatabaseError, code: &str) -> bool {
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
        && code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
}

#[cfg(all(feature = "postgres", not(feature = "sqlite")))]
fn sqlite_busy(_: &dyn sqlx::error::DatabaseError, _: &str) -> bool {
    false
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Error {
        Error::Store(e.into())
    }
}
