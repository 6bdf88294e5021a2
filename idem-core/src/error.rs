//! The one error type of idem.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::canonical::FingerprintError;
use crate::key::KeyError;

/// A boxed error from a backend or codec.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in idem. Each variant says what the caller can do about it.
///
/// Functions behind `#[idempotent]` return `Result<T, E>` with `E: From<idem::Error>`, so these
/// errors reach the caller through the function's own error type.
///
/// ```
/// use idem::Error;
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

    /// The key was used before for a request fingerprinted under another policy version
    /// ([`Fingerprint::with_policy`](crate::Fingerprint::with_policy)): what is fingerprinted
    /// changed (a deploy) since the first request. Nothing was changed or run. The stored
    /// request may be this one; send a new key if the request is new, or wait for the old
    /// key's retention to end (docs/architecture.md, "Policy versions").
    #[error(
        "idempotency key used under policy version {stored}, and this call is version {current}: \
         what is fingerprinted changed since the first request; nothing was run (send a new key \
         for a new request)"
    )]
    PolicyChanged {
        /// The version the key's record was stored under.
        stored: u32,
        /// This call's version.
        current: u32,
    },

    /// The work for this key was claimed with [`OnLapse::Uncertain`](crate::OnLapse::Uncertain)
    /// and its claim lapsed with no completion: whether its effect happened is unknown. It will
    /// not run again until an operator or a reconciler resolves it (`idem uncertain`, `idem
    /// resolve`, [`Idempotency::resolve`](crate::Idempotency::resolve)). Do not retry, with
    /// this key or another: that could repeat the effect.
    #[error(
        "operation {operation} is uncertain since its claim lapsed at {since:?} with no \
         completion: its effect may or may not have happened, so it will not run again until it \
         is resolved (idem uncertain, idem resolve); do not retry with this or another key"
    )]
    Uncertain {
        /// The operation's key: what `idem resolve` takes.
        operation: crate::key::Key,
        /// When its claim's lease ended.
        since: SystemTime,
    },

    /// The work for this key completed, and its result's retention ended at `since`; the key is
    /// kept (a tombstone, for the policy's
    /// [`key_retention`](crate::Policy::key_retention)) so that it does not run again. Look up
    /// the effect another way; send a new key for a new request.
    #[error(
        "the work for this key completed and its result expired at {since:?}; it will not run \
         again: look up its effect instead of retrying, or send a new key for a new request"
    )]
    ResultExpired {
        /// When the result's retention ended.
        since: SystemTime,
    },

    /// An operator (or a reconciler) resolved this key's uncertain operation as abandoned: it
    /// does not run again until its retention ends. `reason` is what they recorded.
    #[error("the operation for this key was abandoned ({reason}); it will not run again")]
    Abandoned {
        /// Why, as recorded when it was resolved.
        reason: String,
    },

    /// A resolution was refused: the operation is not uncertain (it is running, completed,
    /// free or gone), or another resolution reached it first. Nothing was changed; list what
    /// is uncertain again (`idem uncertain`).
    #[error(
        "operation {operation} is not uncertain (running, completed, resolved by someone else, or \
         gone): nothing was changed; list the uncertain operations again"
    )]
    NotUncertain {
        /// The operation's key.
        operation: crate::key::Key,
    },

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
    /// such as an HTTP response whose body failed while it was read). The work does not run again for this key until its
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

    /// A SQL store told not to migrate on connect (`migrate_on_connect(false)` on
    /// `SqliteStoreBuilder` or `PostgresStoreBuilder`) found its
    /// table's schema missing or older than this version of idem needs. Nothing was changed.
    /// Bring the schema up to date out of band, as a role that may create tables: the builder's
    /// `migrate`, or the store's `.sql` file (`idem-sql/sql/`, or the builder's `schema_sql`
    /// for another table name). Then connect again.
    #[error(
        "the idem schema of table {table:?} is {}, and this version of idem needs version \
         {needed}: apply it first, as a role that may create tables (the store builder's \
         `migrate`, or the store's .sql file), then connect again",
        describe_schema(*.found)
    )]
    SchemaNotMigrated {
        /// The records table, as configured.
        table: String,
        /// The newest schema version the table's ledger (`<table>_migrations`) lists (0 when
        /// it lists none); `None` when the ledger or the table itself is missing.
        found: Option<i64>,
        /// The schema version this version of idem needs.
        needed: i64,
    },

    /// A `SqliteStore` could not open its database file (`SqliteStore::open`, a `sqlite:` URL):
    /// its directory does not exist, a missing file was not to be created (`mode=rw` or
    /// `mode=ro` in the URL), or SQLite may not read, write or create it. Nothing was opened.
    /// `reason` says which and what to do.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let err = idem::SqliteStore::open("/no/such/dir/idem.db").await.unwrap_err();
    /// let idem::Error::SqliteFile { path, reason } = &err else { panic!("{err}") };
    /// assert_eq!(path, std::path::Path::new("/no/such/dir/idem.db"));
    /// assert!(reason.starts_with("its directory \"/no/such/dir\" does not exist"), "{reason}");
    /// # }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    #[error("cannot open the SQLite database {path:?}: {reason}")]
    SqliteFile {
        /// The database file, as given.
        path: PathBuf,
        /// Why it could not be opened, and what to do.
        reason: String,
    },

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

    /// The store does not keep steps (docs/steps.md lists the stores that do). Nothing was
    /// stored; run the operation on a store that keeps them, or without steps.
    #[error("this store does not keep steps: run steps on a store that does (docs/steps.md)")]
    StepsUnsupported,

    /// The store cannot find operations left in progress past their lease
    /// ([`Store::find_abandoned`](crate::Store::find_abandoned)), so a
    /// [`Completer`](crate::Completer) cannot run on it. Nothing was read or changed; run the
    /// completer on a store that can (docs/steps.md, "Completer"), or leave abandoned
    /// operations to their clients' retries.
    #[error(
        "this store cannot find abandoned operations, so no completer can run on it: use a \
         store that can (docs/steps.md, \"Completer\"), or let clients retry"
    )]
    CompleterUnsupported,

    /// A retry of an operation reached a step whose name differs from the one an earlier
    /// attempt stored at the same position: the code of the operation changed while it was
    /// under way. Nothing was run or stored for the step. Finish the operation with the code
    /// that began it, or evict its key and run it again from its first step.
    #[error(
        "step {position} of this operation is {called:?} in this code, but an earlier attempt \
         ran {stored:?} there: the operation's code changed while it was under way; finish it \
         with the code that began it, or evict its key to start it over"
    )]
    StepMismatch {
        /// The step's position (0 for the first).
        position: u32,
        /// The name the earlier attempt stored.
        stored: String,
        /// The name this attempt called.
        called: String,
    },

    /// An at-most-once step (`Step::at_most_once`) began in an earlier attempt and has no
    /// stored result: that attempt stopped inside it, so whether its effect happened is
    /// unknown. It was not run again. Ask the system it acts on what happened, then settle
    /// the operation (see docs/steps.md).
    #[error(
        "step {step:?} began in an earlier attempt and never stored its result (this is attempt \
         {attempt}); it runs at most once, so it was not run again: find out from the system it \
         acts on whether it took effect"
    )]
    StepInterrupted {
        /// The step's name.
        step: String,
        /// This attempt's number (the interrupted one came before it).
        attempt: u32,
    },

    /// A step's name is empty, longer than 255 bytes, or used twice in one operation. Nothing
    /// was run or stored for the step.
    #[error("invalid step: {0}")]
    InvalidStep(String),
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

/// How [`Error::SchemaNotMigrated`] names the schema it found.
fn describe_schema(found: Option<i64>) -> String {
    match found {
        Some(version) => format!("at version {version}"),
        None => "missing (no table or no `<table>_migrations` ledger)".to_owned(),
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
    /// The store refused the credentials: a token or password it does not know, or one not
    /// allowed this operation (idem-server's `401` and `403`). Retrying does not help: the
    /// configuration must change.
    Unauthorized,
    /// A stored row or file does not have the expected shape (wrong byte length, unknown state,
    /// a checksum that does not match, a damaged database file).
    Corrupt,
    /// A stored value is encrypted under a key id the key provider does not have
    /// (`EncryptedStore`, feature `encryption`). Nothing ran; the
    /// value opens again once the provider has the key.
    KeyUnavailable,
    /// A stored value does not open: the key under its id is not the one that sealed it, it
    /// was copied from another record, it is damaged, or it is not encrypted where it should
    /// be (`EncryptedStore`, feature `encryption`). Nothing ran.
    Undecryptable,
}

impl StoreErrorKind {
    /// Whether an operation that failed this way may succeed if simply retried later:
    /// [`Unavailable`](Self::Unavailable), [`Transient`](Self::Transient),
    /// [`Full`](Self::Full) and [`ReadOnly`](Self::ReadOnly) describe the store's state, not
    /// the statement, and pass.
    ///
    /// ```
    /// use idem::StoreErrorKind;
    /// assert!(StoreErrorKind::Transient.is_transient());
    /// assert!(!StoreErrorKind::Corrupt.is_transient());
    /// assert!(!StoreErrorKind::Unauthorized.is_transient());
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
/// use idem::{StoreError, StoreErrorKind};
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
    StoreErrorKind::Unauthorized => "refused the credentials",
    StoreErrorKind::Corrupt => "holds corrupt data",
    StoreErrorKind::KeyUnavailable => "holds a value sealed under a key it was not given",
    StoreErrorKind::Undecryptable => "holds a value that does not decrypt",
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
