//! A tower layer for tonic servers that makes retried unary gRPC calls run once. Feature
//! `grpc`.
//!
//! gRPC clients retry: a service config's retry policy, hedging, an application that calls
//! again after `DEADLINE_EXCEEDED`. With this layer, the first call with a key runs the method
//! and its whole response is stored: headers, the message and the trailers (`grpc-status`,
//! `grpc-message`, `grpc-status-details-bin` and any custom trailing metadata). A retry with
//! the same key gets that response again, byte for byte, with `idempotent-replayed: true`
//! added to its headers, and the method does not run again. Every metadata entry is replayed:
//! the HTTP layer's `replay_headers` rule, which drops the headers of the first exchange
//! (`Set-Cookie`, `Date`, rate-limit headers, request ids), has no gRPC counterpart
//! (docs/grpc.md, "Which metadata are replayed", says why).
//!
//! ```
//! use idem::grpc::{IdempotencyLayer, UnaryMethod};
//! use idem::{Idempotency, MemoryStore};
//!
//! let engine = Idempotency::new(MemoryStore::new());
//! let layer = IdempotencyLayer::builder(engine)
//!     // Keyed by the `idempotency-key` metadata entry.
//!     .unary("/bank.v1.Payments/Create")
//!     // Keyed by the message's `string request_id = 3;` (Google AIP-155).
//!     .unary(UnaryMethod::new("/bank.v1.Payments/Transfer").key_field(3))
//!     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
//!     .build()?;
//! // tonic::transport::Server::builder().layer(layer).add_service(PaymentsServer::new(…))
//! # let _ = layer;
//! # Ok::<(), idem::Error>(())
//! ```
//!
//! # Which calls are guarded
//!
//! Only the unary methods named with [`unary`](LayerBuilder::unary). The layer cannot tell a
//! unary call from a streaming one on the wire (a client-streaming call may send one message
//! too), so it is told. Every other path, streaming methods among them, passes through the layer
//! untouched: its messages flow as they come, nothing is read, claimed or stored. A guarded call
//! without a key runs unguarded, or gets `INVALID_ARGUMENT` with
//! [`require_key(true)`](LayerBuilder::require_key).
//!
//! # Keys, callers and fingerprints
//!
//! A method's key comes from the `idempotency-key` metadata entry (the name is
//! [configurable](LayerBuilder::key_metadata)), from a string field of the request message
//! ([`UnaryMethod::key_field`], AIP-155's `request_id`), or from a function of the message
//! bytes ([`UnaryMethod::key_from`]). It must be 1 to 255 printable ASCII characters.
//!
//! Keys are scoped by the [caller](LayerBuilder::caller), read from the request head, as in the
//! HTTP layer: a call with a key and without an identity gets `UNAUTHENTICATED`, never a shared
//! space; [`shared_key_space`](LayerBuilder::shared_key_space) is the explicit opt-in to one
//! space for all. The fingerprint covers the method path and the request message's bytes (and
//! whether they were compressed): the same key with another message gets `FAILED_PRECONDITION`.
//!
//! # What a call gets
//!
//! | call | answer |
//! |---|---|
//! | new key | the method's response; stored if [`store_if`](LayerBuilder::store_if) takes its status (default [`stores_by_default`]: `OK`, `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`) |
//! | new key, a status not stored (`UNAVAILABLE`, `ABORTED`, `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`, `INTERNAL`, …) | that response, as it is; the key is freed, a retry runs the method |
//! | same key, same message, after it completed | the stored headers, message and trailers, byte for byte, plus `idempotent-replayed: true` |
//! | same key while the first call still runs | `UNAVAILABLE` with `grpc-retry-pushback-ms` (the engine's estimate of when it ends, at least 1); or, with [`OnLocked::Wait`](idem_core::OnLocked::Wait), the first call's response once it is done |
//! | same key, another method or message | `FAILED_PRECONDITION` (not retryable: a new request needs a new key) |
//! | malformed key (empty, over 255 characters, not printable ASCII, the entry twice, an unreadable key field, a key field in a compressed message) | `INVALID_ARGUMENT` |
//! | no key, [`require_key(true)`](LayerBuilder::require_key) | `INVALID_ARGUMENT` |
//! | key, no caller identity | `UNAUTHENTICATED`; nothing runs |
//! | key, an identity that cannot be a key part | `INVALID_ARGUMENT`; nothing runs |
//! | message over [`max_request_message`](LayerBuilder::max_request_message) | `RESOURCE_EXHAUSTED`; nothing runs |
//! | not one length-prefixed message | `INVALID_ARGUMENT`; nothing runs |
//! | store unreachable when the call arrives | `UNAVAILABLE` with `grpc-retry-pushback-ms: 1000`; nothing runs |
//! | same key, after a first call whose response was not kept (over the engine's [`max_response_bytes`](idem_core::Policy::max_response_bytes), or a body that failed) | `FAILED_PRECONDITION`; the method does not run again |
//! | claim lost while the method ran (it may have run twice) | `INTERNAL` |
//!
//! The layer's own answers are trailers-only responses whose `grpc-status-details-bin` holds a
//! `google.rpc.Status` with a `google.rpc.ErrorInfo` of domain `idem` and the
//! [`Problem::reason`] (such as `IDEMPOTENCY_KEY_REUSED`), so a client can tell them from the
//! service's own statuses.
//!
//! A response over the size limit is sent to its client as it is and recorded as "completed,
//! not retained" whatever its status, because its status comes only after the message that did
//! not fit.
//!
//! # Deadlines and disconnects
//!
//! Once a call has claimed its key, the method runs detached from the call: a client that
//! disconnects, cancels, or whose deadline passes (tonic's server ends the call with
//! `DEADLINE_EXCEEDED` from outside this layer) does not stop it. It runs to its end, its
//! response is stored, and the client's retry gets it (or `UNAVAILABLE` with a pushback while it
//! still runs). The method runs once. If the process dies, the key frees when its lease ends.
//!
//! # Public dependencies
//!
//! The layer takes and gives `http` 1.x requests and responses with [`tonic::body::Body`], and
//! its [`Problem`]s name [`tonic::Code`]: tonic 0.14, re-exported as [`tonic`] so an
//! application can name the very version idem uses. A major version of tonic changes idem's.

mod layer;
mod problem;
mod service;
mod wire;

use http::HeaderName;

pub use crate::problem::Problem;
pub use ::tonic;
pub use layer::{stores_by_default, Grpc, IdempotencyLayer, LayerBuilder, UnaryMethod};
pub use service::IdempotencyService;

/// The metadata entry that carries the client's key by default: `idempotency-key`.
///
/// ```
/// assert_eq!(idem::grpc::IDEMPOTENCY_KEY, "idempotency-key");
/// ```
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The metadata entry a replayed response carries in its headers, with the value `true`:
/// `idempotent-replayed`.
///
/// ```
/// assert_eq!(idem::grpc::IDEMPOTENT_REPLAYED, "idempotent-replayed");
/// ```
pub const IDEMPOTENT_REPLAYED: HeaderName = crate::capture::reply::IDEMPOTENT_REPLAYED;

/// The trailing metadata entry that tells a gRPC client how long to wait before it retries
/// (gRPC's retry design, A6), in milliseconds: `grpc-retry-pushback-ms`.
///
/// ```
/// assert_eq!(idem::grpc::RETRY_PUSHBACK, "grpc-retry-pushback-ms");
/// ```
pub const RETRY_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
