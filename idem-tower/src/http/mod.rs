//! A tower/axum layer speaking the `Idempotency-Key` header (IETF httpapi draft "The
//! Idempotency-Key HTTP Header Field"), on any [`Store`](idem_core::Store). Feature `http`.
//!
//! A client sends `POST /payments` with `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`
//! (or the same key unquoted, as most clients send it).
//! The first request runs the handler and stores its response; a retry with the same key gets
//! that response again, marked `Idempotent-Replayed: true`, and the handler does not run again.
//!
//! ```
//! use axum::{http::StatusCode, routing::post, Router};
//! use idem::http::IdempotencyLayer;
//! use idem::{Idempotency, MemoryStore};
//!
//! # fn main() -> Result<(), idem::Error> {
//! let engine = Idempotency::new(MemoryStore::new());
//! let app: Router = Router::new()
//!     .route("/payments", post(|body: String| async move { (StatusCode::CREATED, body) }))
//!     .layer(
//!         IdempotencyLayer::builder(engine)
//!             .require_key(true)
//!             .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
//!             .build()?,
//!     );
//! # let _ = app; Ok(()) }
//! ```
//!
//! `.layer(…)` wraps the routes added before it: a route added to the `Router` after it is not
//! guarded (its requests run every time), and an [`IdempotencyKey`] extractor there answers
//! `500` ([`Problem::KeyUnguarded`]) naming this cause. Add the routes first, then the layer.
//!
//! # Whose keys are whose
//!
//! A layer scopes keys in one of two ways, and [`build`](LayerBuilder::build) refuses to guess
//! (an [`Error::InvalidConfig`](idem_core::Error::InvalidConfig) naming both):
//!
//! - [`caller`](LayerBuilder::caller): an extractor reads who is asking from the request head
//!   (an API key id, a user id, an extension set by your authentication layer). Two callers
//!   sending the same key and body each get their own run of the handler and their own response.
//!   A request without an identity is refused (`401`), never put in a shared space.
//! - [`shared_key_space`](LayerBuilder::shared_key_space): one key space for every client. Any
//!   client that sends another's key and body gets that client's stored response, with every
//!   header [`replay_headers`](LayerBuilder::replay_headers) keeps (not `Set-Cookie`, by
//!   default); only for APIs whose clients are all trusted with each other's responses.
//!
//! There is no `IdempotencyLayer::new(engine)`: a constructor without this choice would have to
//! make it for you, and the only choice it could make is the unsafe one.
//!
//! # What a request gets
//!
//! Only the configured methods are guarded (`POST` and `PATCH` by default); others pass through.
//!
//! | request | response |
//! |---|---|
//! | new key | the handler's response; stored unless [`store_if`](LayerBuilder::store_if) says no (default: 5xx, 400, 408, 409, 422 and 429 are not stored, and free the key for a retry) |
//! | same key, same request, after it completed | the stored status, headers ([`replay_headers`](LayerBuilder::replay_headers)) and body, plus `Idempotent-Replayed: true` |
//! | same key while the first request still runs | `409 Conflict` with `Retry-After`; or, with [`OnLocked::Wait`](idem_core::OnLocked::Wait), the first request's response once it is done |
//! | same key, different method, path, query or body | `422 Unprocessable Content` |
//! | no key, key required | `400 Bad Request` |
//! | no key, key optional | the handler's response, nothing stored |
//! | malformed key: empty, over 255 characters, header sent twice, outside printable ASCII, a bare key with a space (send it quoted); or, in [strict mode](LayerBuilder::accept_bare_keys), not one RFC 8941 string | `400 Bad Request` |
//! | key, but the [caller extractor](LayerBuilder::caller) finds no identity | `401 Unauthorized` (or `400`, by [`caller_missing_status`](LayerBuilder::caller_missing_status)); nothing runs or is stored |
//! | key, but the identity is empty, over 255 bytes or holds a byte outside printable ASCII | `400 Bad Request`; nothing runs or is stored |
//! | body over [`max_request_body`](LayerBuilder::max_request_body) | `413 Content Too Large`, nothing runs or is stored |
//! | same key, after a first request whose response was not kept (larger than [`max_response_bytes`](idem_core::Policy::max_response_bytes), a body that failed) | `422 Unprocessable Content` ([`Problem::ResponseNotRetained`]); the handler does not run again |
//! | store unreachable when the request arrives | `503 Service Unavailable` with `Retry-After`, nothing runs |
//! | store unreachable when the response is to be stored | the handler's response; storing it is retried in the background until it lands, and the key stays held meanwhile (`409`, or wait) |
//! | claim lost while the handler ran (it may have run twice) | `500 Internal Server Error` |
//!
//! The layer's own errors are `application/problem+json` (RFC 9457) with `type`, `title`,
//! `status` and `detail`. `type` links to the [`Problem`] variant on docs.rs, or, with a
//! [`problem_base`](LayerBuilder::problem_base) such as
//! `https://api.example.com/docs/idempotency`, to `{base}#{slug}`
//! (`…/docs/idempotency#key-in-flight`, see [`Problem::slug`]), and the response then also
//! carries `Link: <https://api.example.com/docs/idempotency>; rel="describedby"` (IETF draft,
//! section "Error Scenarios").
//!
//! `Retry-After` is whole seconds (RFC 9110 `delay-seconds`): the engine's estimate of when the
//! running request ends ([`Error::Locked`](idem_core::Error::Locked)), rounded up so a client that
//! waits as told never comes back early, and at least 1. A `503` says 1.
//!
//! # The key in the handler
//!
//! A handler behind the layer reads the key the layer checked with the [`IdempotencyKey`]
//! extractor (without its quotes): `IdempotencyKey` refuses a request without one (`400`),
//! `Option<IdempotencyKey>` reads `None`. Only the key of a request the layer guarded is given
//! out: a request that carries the header on a route outside the layer (one added after
//! `.layer(…)`), or with a method the layer does not guard, is refused with `500`
//! ([`Problem::KeyUnguarded`]).
//!
//! ```
//! use axum::{routing::post, Router};
//! use idem::http::{IdempotencyKey, IdempotencyLayer};
//! use idem::{Idempotency, MemoryStore};
//!
//! async fn create(key: IdempotencyKey) -> String {
//!     format!("payment made under {key}")
//! }
//!
//! # fn main() -> Result<(), idem::Error> {
//! let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
//!     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
//!     .build()?;
//! let app: Router = Router::new().route("/payments", post(create)).layer(layer);
//! # let _ = app; Ok(()) }
//! ```
//!
//! # Key expiry
//!
//! The draft asks an API to publish how long it keeps keys; with this layer that is:
//!
//! - A stored response is replayed for the layer's [`retention`](LayerBuilder::retention)
//!   (the engine's [`Policy::retention`](idem_core::Policy::retention) unless set; 24 hours by
//!   default), counted from when the response was stored. After that the record may be pruned
//!   at any time, and a request with the key counts as new: the handler runs again.
//! - A response that [`store_if`](LayerBuilder::store_if) rejects (a 5xx, say) frees its key
//!   at once. A response that cannot be kept (too large) keeps its key for the
//!   retention as "completed, not retained": retries get `422`.
//! - A request that is still running holds its key for one [`lease`](LayerBuilder::lease),
//!   renewed while the handler runs; if the process dies, the key frees when the lease ends.
//!
//! # What a replay carries
//!
//! The stored status, the exact body bytes and the headers [`ReplayHeaders`] keeps (set with
//! [`replay_headers`](LayerBuilder::replay_headers)): by default every end-to-end header but
//! those that describe the first exchange rather than its result,
//! [`ReplayHeaders::DEFAULT_DENIED`] (`Set-Cookie`, `Date`, `Age`, the rate-limit headers,
//! `Retry-After`, request and trace ids, `Server-Timing`), each kept header with every value,
//! in order, byte for byte. The rule decides what is stored (a dropped header is not in the
//! record) and applies again at the replay. The first client gets every header. Headers that
//! describe one connection are never stored: `Connection`, any header `Connection` names,
//! `Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`, `Proxy-Authorization`, `TE`,
//! `Transfer-Encoding` and `Upgrade`. `Date` is written by the HTTP server for each
//! message, so a replay carries the time of the replay. Response extensions are not stored. A
//! response's trailers are stored and replayed after its body (HTTP/1.1 sends them to a client
//! that sent `TE: trailers`, those the stored `Trailer` header names). A response whose stored
//! form (trailers included) would exceed the engine's
//! [`max_response_bytes`](idem_core::Policy::max_response_bytes), or whose body fails while it is
//! read, is sent to its client as it is and not kept (logged as a warning); its key is recorded
//! as completed without a response, so a retry gets `422` ([`Problem::ResponseNotRetained`])
//! instead of running the handler a second time. Raise `max_response_bytes` for large
//! responses you want replayed.
//!
//! # Keys and fingerprints
//!
//! The record's key is [`Key::derive`](idem_core::Key::derive)`(scope, caller, client key)`, so two
//! [callers](LayerBuilder::caller) using the same client key never share a record (with
//! [`shared_key_space`](LayerBuilder::shared_key_space) the caller is empty). The request
//! [fingerprint](BodyFingerprint) covers the method, path and query, and the body (its bytes by
//! default, or canonical JSON, or selected JSON fields).
//!
//! # Round trips to the store
//!
//! | request | statements |
//! |---|---|
//! | new key, response stored | 1 claim + 1 complete (+ 1 lease renewal per third of the lease the handler runs) |
//! | new key, response not stored (5xx, …), handler failed or panicked | 1 claim + 1 release |
//! | new key, response not kept (too large, a body that failed) | 1 claim + 1 complete (of the "not retained" record) |
//! | replay | 1 |
//! | in flight, fail fast | 1 |
//! | in flight, wait | 1 per poll (one poller per key and process; waiters in the same process are woken when the first request finishes) |
//! | different request (422) | 1 |
//! | no key, unguarded method, bad key, caller missing or invalid, body too large | 0 |
//!
//! # Disconnects
//!
//! Once a request has claimed its key, the handler is detached from the connection: a client
//! that disconnects (or a proxy that times out) does not cancel it. It runs to its end, its
//! response is stored, and the client's retry replays it: fail fast, the retry gets `409` with
//! `Retry-After` while the handler still runs and the replay afterwards; waiting, it gets the
//! replay. The handler runs once. (Before its claim, a request whose client went away is simply
//! dropped: nothing ran, and a claim statement it left in flight is finished and released.) If
//! the process itself dies while the handler runs, the key frees when the lease ends.
//!
//! The whole call runs in the request's own task while the request is there: the claim, the
//! handler and the storing of its response (or the replay, `409` or refusal). Only a request
//! dropped after it won its claim hands the rest to a task of its own. A handler that panics
//! frees its key at once, and the panic goes on to the connection as without the layer.
//!
//! The handler, its future and its response body must therefore be `Send + 'static`, which axum
//! handlers are; the layer needs a tokio runtime to spawn on when a request is dropped (axum's).
//!
//! # Public dependencies
//!
//! The layer takes and returns the types of three crates, re-exported here so that an
//! application can name the very versions it was built with: [`types`] is `http` 1.x (requests,
//! responses, status codes, headers), [`Body`] is axum-core 0.5's response body (what axum 0.8
//! uses), and [`tower`] is tower 0.5 (the [`Layer`](tower::Layer) and
//! [`Service`](tower::Service) traits). A major version of any of them changes idem's major
//! version.

mod extract;
mod fingerprint;
mod key_header;
mod layer;
mod problem;
mod replay_headers;
mod service;

use http::HeaderName;

pub use crate::problem::Problem;
pub use ::http as types;
pub use ::tower;
pub use axum_core::body::Body;
pub use extract::{IdempotencyKey, IdempotencyKeyRejection};
pub use fingerprint::BodyFingerprint;
pub use layer::{stores_by_default, Http, IdempotencyLayer, LayerBuilder};
pub use replay_headers::ReplayHeaders;
pub use service::IdempotencyService;

/// The request header carrying the client's key: `idempotency-key`.
///
/// ```
/// assert_eq!(idem::http::IDEMPOTENCY_KEY, "idempotency-key");
/// ```
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The header a replayed response carries, with the value `true`: `idempotent-replayed`.
///
/// ```
/// assert_eq!(idem::http::IDEMPOTENT_REPLAYED, "idempotent-replayed");
/// ```
pub const IDEMPOTENT_REPLAYED: HeaderName = crate::capture::reply::IDEMPOTENT_REPLAYED;
