//! The core of [idem](https://docs.rs/idem): keys and fingerprints, records, the [`Store`] trait
//! and [`MemoryStore`], the [`Idempotency`] engine (calls, steps, detached work, the replay
//! cache), the background jobs ([`Pruner`], [`Completer`]), observability and the concurrency
//! kit's store-independent parts.
//!
//! Depend on the `idem` crate, which re-exports all of this with the `#[idempotent]` attribute
//! and, by feature, the other stores and the ways in (HTTP, gRPC, queue consumers). This crate's
//! public API shows no pre-1.0 crate; [`store::support`] and
//! [`adapter`] are for the idem crates and out-of-tree stores and ways in, and are not covered by
//! semver.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod adapter;
mod buckets;
mod canonical;
mod clock;
mod codec;

mod background;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod engine;
mod envelope;
mod error;
mod key;
pub mod kit;
mod observe;
mod outbox;
mod record;
mod step;
pub mod store;

/// The uuid (1.x) whose `Uuid` can be part of a key.
pub use uuid;

#[doc(hidden)]
pub mod __private;

pub use background::{CompleteReport, Completer, CompleterConfig, CompleterHandle};
pub use background::{DispatchReport, Dispatcher, DispatcherConfig, DispatcherHandle};
pub use background::{PruneReport, Pruner, PrunerConfig, PrunerHandle};
pub use buckets::PROMETHEUS_BUCKETS;
pub use canonical::{FingerprintError, MAX_FINGERPRINT_DEPTH};
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use codec::{Codec, JsonCodec};
pub use engine::{
    Attempt, Call, CallClaim, EngineBuilder, Finish, Holder, Idempotency, OnLocked, Outcome,
    Policy, Reconciled, ReplayCache, Resolution, Step, Steps, DEFAULT_KEY_RETENTION,
};
pub use error::{BoxError, Error, StoreError, StoreErrorKind};
pub use key::KeyPart;
pub use key::{validate_client_key, Fingerprint, Key, KeyError, Token, MAX_KEY_LEN};
pub use observe::{CallEvent, Observer, Stage, DEFAULT_LATENCIES_ONE_IN};
pub use outbox::{
    ChannelPublisher, MemoryOutbox, MessageId, OutboxMessage, OutboxSource, PendingMessage,
    Publisher, MAX_OUTBOX_NAME_LEN, MAX_OUTBOX_PAYLOAD,
};
pub use record::{
    Claim, ClaimOutcome, ClaimRequest, Completion, OnLapse, Record, RecordState, StoredResult,
    UncertainOperation,
};
pub use step::{
    Abandoned, AbandonedQuery, StepLog, StepRecord, StepState, StepWrite, INPUT_STEP,
    MAX_STEP_NAME_LEN,
};
pub use store::admin::{ListQuery, ListState, StoreAdmin, StoreStats};
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub use store::encrypted::{
    EncryptedStore, Encryption, EncryptionKey, EncryptionKeys, KeyRing, ENCRYPTION_OVERHEAD,
};
pub use store::memory::MemoryStore;
pub use store::{Immediate, Store, LAPSED_CLAIMS_KEPT};
