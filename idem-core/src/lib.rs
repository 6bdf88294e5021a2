//! The runtime of [idem](https://docs.rs/idem): keys, records, the [`Store`] trait and its
//! backends, the [`Idempotency`] engine, the concurrency kit and the HTTP layer.
//!
//! Depend on the `idem` crate, which re-exports all of this together with the `#[idempotent]`
//! attribute.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod canonical;
mod clock;
mod codec;
#[cfg(feature = "conformance")]
pub mod conformance;
mod engine;
mod envelope;
mod error;
#[cfg(feature = "http")]
pub mod http;
mod key;
pub mod kit;
mod pruner;
mod record;
pub mod store;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod transactional;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use codec::{Codec, JsonCodec};
pub use engine::{Builder, CallOptions, Idempotency, OnLocked, Outcome, Policy};
pub use error::{BoxError, Error, StoreError, StoreErrorKind};
pub use key::{
    validate_client_key, Fingerprint, FingerprintError, Key, KeyError, Token,
    MAX_FINGERPRINT_DEPTH, MAX_KEY_LEN,
};
pub use pruner::{PruneReport, Pruner, PrunerConfig, PrunerHandle};
pub use record::{Cached, Claim, Completion, Record, RecordState, Start};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use store::claim_order::ClaimOrder;
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use store::postgres::{PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "sqlite")]
pub use store::sqlite::{SqliteStore, SqliteStoreBuilder};
pub use store::Store;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use transactional::{Transactional, TransactionalStore, TxClaim, TxFuture, TxStart};
