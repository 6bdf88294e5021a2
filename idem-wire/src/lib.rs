//! The protocol of idem-server, once: the request, answer and error bodies of its routes as
//! serde types. idem-server decodes requests into them and answers with them; `RemoteStore`
//! (crate `idem-remote`) sends and reads the same types; `idem-server/openapi.json` describes
//! them and a test checks that it does (`idem-server/tests/openapi.rs`).
//!
//! Every route is `POST` to its path ([`route`]), with a body in JSON or MessagePack (named
//! maps, [`msgpack`]), and answers `200` with its answer body or an error status with an
//! [`ErrorBody`]. Diom's idempotency routes (`start`, `complete`, `abort`, the namespace
//! routes) take Diom's bodies; the fenced extension adds fields to them (the claim's token, a
//! fingerprint, what a key becomes past its lease) and the routes that make the server a store
//! (`renew`, `get`, `evict`, `prune`, `steps.begin`, `steps.write`, `uncertain.take`,
//! `uncertain.find`), with the admin's `uncertain.list` and `uncertain.resolve`.
//!
//! | route | request | answer |
//! |---|---|---|
//! | [`route::START`] | [`StartIn`] | [`StartOut`] |
//! | [`route::COMPLETE`] | [`CompleteIn`] | [`Empty`] |
//! | [`route::ABORT`] | [`AbortIn`] | [`Empty`] |
//! | [`route::RENEW`] | [`RenewIn`] | [`Empty`] |
//! | [`route::GET`] | [`KeyIn`] | [`GetOut`] |
//! | [`route::EVICT`] | [`KeyIn`] | [`EvictOut`] |
//! | [`route::PRUNE`] | [`PruneIn`] | [`PruneOut`] |
//! | [`route::STEPS_BEGIN`] | [`StepsBeginIn`] | [`StepsOut`] |
//! | [`route::STEPS_WRITE`] | [`StepWriteIn`] | [`Empty`] |
//! | [`route::UNCERTAIN_TAKE`] | [`TakeUncertainIn`] | [`TakeUncertainOut`] |
//! | [`route::UNCERTAIN_FIND`] | [`FindUncertainIn`] | [`FindUncertainOut`] |
//! | [`route::UNCERTAIN_LIST`] | [`ListUncertainIn`] | [`ListUncertainOut`] |
//! | [`route::UNCERTAIN_RESOLVE`] | [`ResolveIn`] | [`Empty`] |
//! | [`route::NAMESPACE_CONFIGURE`] | [`ConfigureNamespaceIn`] | [`NamespaceOut`] |
//! | [`route::NAMESPACE_GET`] | [`GetNamespaceIn`] | [`NamespaceOut`] |
//! | [`route::PING`] (also `GET`) | none | [`PingOut`] |
//!
//! Keys, claim tokens and fingerprints travel as hexadecimal digits ([`hex`]). A request type
//! decodes as the server takes it: Diom's names ([`names`]) and non-zero
//! periods are checked while decoding, so a refused value fails at its field. Types are named
//! as the schemas of the OpenAPI document (`ErrorBody` is its `Error`).
//!
//! ```
//! use idem_wire::{msgpack, StartIn, StartOut, StartStatus};
//! let start = StartIn::new("order-1", std::num::NonZeroU64::new(30_000).unwrap());
//! let sent = msgpack::to_vec(&start)?;
//! let taken: StartIn = msgpack::from_slice(&sent)?;
//! assert_eq!(taken.key, "order-1");
//! let answer = StartOut::of(StartStatus::Locked);
//! let read: StartOut = msgpack::from_slice(&msgpack::to_vec(&answer)?)?;
//! assert_eq!(read.status, StartStatus::Locked);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
pub mod hex;
mod idempotency;
mod lapse;
pub mod msgpack;
pub mod names;
mod namespace;
pub mod route;

pub use error::{ErrorBody, ErrorType};
pub use idempotency::{
    AbortIn, CompleteIn, Completed, Empty, EvictOut, GetOut, GetStatus, KeyIn, PruneIn, PruneOut,
    RenewIn, StartIn, StartOut, StartStatus, StepOut, StepWriteIn, StepsBeginIn, StepsOut,
};
pub use lapse::{
    FindUncertainIn, FindUncertainOut, ListUncertainIn, ListUncertainOut, ListedUncertain, OnLapse,
    ResolutionKind, ResolveIn, TakeUncertainIn, TakeUncertainOut, UncertainOut, MAX_PAGE,
    MAX_REASON_LEN,
};
pub use namespace::{ConfigureNamespaceIn, GetNamespaceIn, NamespaceOut, PingOut};
