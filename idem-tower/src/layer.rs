//! [`IdempotencyLayer`], its [`LayerBuilder`] and [`IdempotencyService`], written once for both
//! protocols, as tower-http's `TraceLayer<M>` is written once for HTTP and gRPC: what differs is
//! the protocol `P`, a small [`Protocol`] type that gives the layer's configuration and what its
//! service does with one request. `idem::http::IdempotencyLayer` and
//! `idem::grpc::IdempotencyLayer` are this layer for each protocol, by type aliases; the
//! builder's settings both protocols have are written here once, each protocol's own in its
//! module.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response};
use idem_core::adapter::{check_scope, Overrides};
use idem_core::{Codec, Error, Idempotency, JsonCodec, OnLapse, OnLocked};
use tower::{Layer, Service};

use crate::capture::reply::Guard;
use crate::capture::stored::HeaderRule;
use crate::capture::CallerFn;

/// The protocol an [`IdempotencyLayer`] speaks: `idem::http::Http` (feature `http`) or
/// `idem::grpc::Grpc` (feature `grpc`). It gives the layer its configuration, which the
/// protocol's builder checks, and serves one request. Sealed: the two protocols are this
/// crate's.
pub trait Protocol: sealed::Sealed + Send + Sync + 'static {
    /// The checked configuration every [`IdempotencyService`] of one layer shares.
    type Config<C>: fmt::Debug;
    /// What a [`LayerBuilder`] of this protocol holds besides the settings both protocols
    /// have: the values of the protocol's own setters, which its `build` checks.
    type Settings: fmt::Debug;
    /// The name the service's `Debug` shows.
    const SERVICE: &'static str;
    /// The name the builder's `Debug` shows.
    const BUILDER: &'static str;
    /// The protocol as errors name it (`HTTP`, `gRPC`), what its clients send
    /// (`Idempotency-Keys`), and what a client sends with a key (`body`, `message`).
    const WORDS: [&'static str; 3];
}

/// What a protocol's service does with one request whose body is `R`, around the inner service
/// `S`: the part of [`Protocol`] that depends on the request body and the inner service. Its
/// impls (one per protocol) state what the inner service must be.
pub trait Serve<R, S>: Protocol {
    /// The body of the responses the layer gives.
    type Body;
    /// The inner service's error, which the layer passes on.
    type Error;

    /// Whether the inner service is ready for a request.
    fn poll_ready(inner: &mut S, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>>;

    /// One request: guarded (claimed, run and stored, or replayed), or passed to `inner`
    /// untouched. The inner service is the one that was polled ready.
    fn serve<C: Codec>(
        inner: S,
        config: Arc<Self::Config<C>>,
        req: Request<R>,
    ) -> impl Future<Output = Result<Response<Self::Body>, Self::Error>> + Send + 'static;
}

pub(crate) mod sealed {
    /// Keeps [`Protocol`](super::Protocol) to this crate's protocols.
    pub trait Sealed {}
}

/// A tower [`Layer`] that makes the requests its protocol `P` guards run once per idempotency
/// key: a retry gets the stored response, marked `idempotent-replayed: true`. Built by the
/// protocol's builder: `idem::http::IdempotencyLayer::builder(engine)` or
/// `idem::grpc::IdempotencyLayer::builder(engine)`, whose documentation gives the behaviour.
pub struct IdempotencyLayer<P: Protocol, C = JsonCodec> {
    config: Arc<P::Config<C>>,
}

impl<P: Protocol, C> IdempotencyLayer<P, C> {
    /// The layer of a configuration its builder checked.
    pub(crate) fn from_config(config: P::Config<C>) -> Self {
        IdempotencyLayer {
            config: Arc::new(config),
        }
    }

    /// The layer's configuration.
    #[cfg(test)]
    pub(crate) fn config(&self) -> &P::Config<C> {
        &self.config
    }
}

impl<P: Protocol, C> Clone for IdempotencyLayer<P, C> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            config: self.config.clone(),
        }
    }
}

impl<P: Protocol, C> fmt::Debug for IdempotencyLayer<P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<S, P: Protocol, C> Layer<S> for IdempotencyLayer<P, C> {
    type Service = IdempotencyService<S, P, C>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// What both protocols' layers are configured with alike, as their services read it: the
/// engine, the call options and the scope; whether a guarded request needs a key; whose keys
/// are whose; the largest request read.
pub(crate) struct Common<C> {
    /// The engine, the call options and the scope.
    pub(crate) guard: Guard<C>,
    pub(crate) require_key: bool,
    /// The caller extractor. `None` is the one shared key space, which [`LayerBuilder::build`]
    /// allows only after [`LayerBuilder::shared_key_space`].
    pub(crate) caller: Option<Box<CallerFn>>,
    /// The largest request body (HTTP) or message (gRPC) the layer reads, in bytes.
    pub(crate) max_request: usize,
}

impl<C> Common<C> {
    /// The fields of a layer's `Debug` that every protocol has, in `f`.
    pub(crate) fn fields<'a, 'f, 'g>(
        &self,
        f: &'a mut fmt::DebugStruct<'f, 'g>,
    ) -> &'a mut fmt::DebugStruct<'f, 'g> {
        f.field("scope", &self.guard.scope)
            .field("require_key", &self.require_key)
            .field("callers", &key_space(self.caller.is_some()))
            .field("options", &self.guard.options)
    }
}

/// Configures an [`IdempotencyLayer`] of the protocol `P`: built by
/// `idem::http::IdempotencyLayer::builder(engine)` or `idem::grpc::IdempotencyLayer::builder(engine)`,
/// whose type aliases (`idem::http::LayerBuilder`, `idem::grpc::LayerBuilder`) list the
/// defaults. The setters here are the ones both protocols have; each protocol's own (HTTP's
/// `methods` and `fingerprint`, gRPC's `unary` and `key_metadata`, …) and `build` are in its
/// module.
///
/// ```
/// use std::time::Duration;
/// use idem::http::IdempotencyLayer;
/// use idem::{Idempotency, MemoryStore, OnLocked};
/// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
///     .scope("payments-api")
///     .require_key(true)
///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
///     .lease(Duration::from_secs(10))
///     .retention(Duration::from_secs(24 * 3600))
///     .on_locked(OnLocked::Wait { timeout: Duration::from_secs(5) })
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), idem::Error>(())
/// ```
pub struct LayerBuilder<P: Protocol, C = JsonCodec> {
    pub(crate) common: Common<C>,
    /// Whether [`shared_key_space`](Self::shared_key_space) was called.
    shared_key_space: bool,
    pub(crate) settings: P::Settings,
}

impl<P: Protocol, C> fmt::Debug for LayerBuilder<P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.common
            .fields(&mut f.debug_struct(P::BUILDER))
            .field("max_request", &self.common.max_request)
            .field("shared_key_space", &self.shared_key_space)
            .field("settings", &self.settings)
            .finish()
    }
}

impl<P: Protocol, C: Codec> LayerBuilder<P, C> {
    /// A builder over `engine` with the default `scope`, request limit and protocol settings,
    /// and the engine's policy for the call options.
    pub(crate) fn with(
        engine: Idempotency<C>,
        scope: &str,
        max_request: usize,
        settings: P::Settings,
    ) -> Self {
        LayerBuilder {
            common: Common {
                guard: Guard {
                    engine,
                    options: Overrides::default(),
                    scope: Arc::from(scope),
                    policy: None,
                    headers: Arc::new(HeaderRule::All),
                },
                require_key: false,
                caller: None,
                max_request,
            },
            shared_key_space: false,
            settings,
        }
    }

    /// Whether a guarded request without a key is refused (`true`: HTTP `400`, gRPC
    /// `INVALID_ARGUMENT`) or runs without deduplication (`false`, the default; AIP-155 makes
    /// gRPC request ids optional too).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new())).require_key(true);
    /// # let _ = b;
    /// ```
    pub fn require_key(mut self, required: bool) -> Self {
        self.common.require_key = required;
        self
    }

    /// The name under which this layer's keys are stored (1 to 255 printable ASCII
    /// characters), so several APIs can share one store. Default `"http"` for HTTP, `"grpc"`
    /// for gRPC. Renaming it forgets every stored response.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new())).scope("billing-v2");
    /// # let _ = b;
    /// ```
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.common.guard.scope = Arc::from(scope.into());
        self
    }

    /// Who is asking, from the request head (gRPC metadata are its headers): an API key id, a
    /// user id, or an extension an authentication layer put there. Keys are scoped by it, so two
    /// callers sending the same key and request get independent results, each from its own run
    /// of the handler.
    ///
    /// The extractor runs for each guarded request that carries a key. When it returns `None`
    /// the request is refused as `Problem::CallerMissing` (HTTP `401`, or `400` by the HTTP
    /// builder's `caller_missing_status`; gRPC `UNAUTHENTICATED`) and nothing runs; there is no
    /// anonymous key space to fall back to. The identity must be 1 to 255 bytes of printable
    /// ASCII (hash longer ones yourself); any other is refused as `Problem::CallerInvalid`
    /// (HTTP `400`, gRPC `INVALID_ARGUMENT`). Add this layer inside (after) the authentication
    /// layer, so the identity is set and checked when the extractor runs. Not together with
    /// [`shared_key_space`](Self::shared_key_space).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// #[derive(Clone)]
    /// struct User(u64);
    /// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .caller(|parts| parts.extensions.get::<User>().map(|u| u.0.to_string()))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn caller(
        mut self,
        extract: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.common.caller = Some(Box::new(extract));
        self
    }

    /// Opts in to one key space shared by every client, instead of a [`caller`](Self::caller)
    /// extractor.
    ///
    /// **What it risks:** the record of a request is found by its key alone, so any client that
    /// learns another client's key and sends the same request (the same fingerprint: HTTP's
    /// method, path and body, gRPC's method and message) gets that client's stored response:
    /// status, headers (`Location` included; over HTTP, `Set-Cookie` too if the layer's
    /// `replay_headers` keeps it, which the default does not), body or message and trailers,
    /// for as long as the response is [retained](Self::retention); and while the first request
    /// runs, it is told the key is in use. A key that a client sends with a different request
    /// is refused as reused even if the key is another client's. Use it only where every client
    /// is equally trusted with every response: one client (a single backend calling a
    /// service), or responses that hold nothing private.
    ///
    /// Not together with [`caller`](Self::caller): `build` refuses both.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// // An internal service with one client: there is nobody to keep apart.
    /// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .shared_key_space()
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn shared_key_space(mut self) -> Self {
        self.shared_key_space = true;
        self
    }

    /// How long a request's claim blocks its key without a heartbeat; the engine renews it
    /// while the handler runs. Overrides [`Policy::lease`](idem_core::Policy::lease).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .lease(std::time::Duration::from_secs(5));
    /// # let _ = b;
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.common.guard.options = self.common.guard.options.lease(lease);
        self
    }

    /// How long a stored response is replayed, counted from when it was stored. Overrides
    /// [`Policy::retention`](idem_core::Policy::retention). This is the key expiry policy the
    /// IETF draft asks an HTTP API to publish: after it, the record may be pruned at any time
    /// and the key counts as new, so a request with it runs the handler again.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .retention(std::time::Duration::from_secs(7 * 24 * 3600));
    /// # let _ = b;
    /// ```
    pub fn retention(mut self, retention: Duration) -> Self {
        self.common.guard.options = self.common.guard.options.retention(retention);
        self
    }

    /// What a request does while another with the same key runs: be told at once
    /// ([`OnLocked::FailFast`]: HTTP `409` with `Retry-After`, gRPC `UNAVAILABLE` with
    /// `grpc-retry-pushback-ms`), or wait for it and replay its response ([`OnLocked::Wait`];
    /// told the same if the wait times out). Overrides
    /// [`Policy::on_locked`](idem_core::Policy::on_locked).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore, OnLocked};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .on_locked(OnLocked::Wait { timeout: std::time::Duration::from_secs(10) });
    /// # let _ = b;
    /// ```
    pub fn on_locked(mut self, on_locked: OnLocked) -> Self {
        self.common.guard.options = self.common.guard.options.on_locked(on_locked);
        self
    }

    /// What a request's key becomes if its handler's claim lapses with no response stored (the
    /// process died or stalled past the lease): free, so a retry runs the handler again
    /// ([`OnLapse::Release`], the engine's default), or, for handlers whose effect must not
    /// repeat (a charge through a provider), uncertain ([`OnLapse::Uncertain`]): every retry
    /// then gets `Problem::OperationUncertain` (HTTP `409` naming the operation, gRPC
    /// `ABORTED`) until an operator or a reconciler resolves it. Overrides
    /// [`Policy::on_lapse`](idem_core::Policy::on_lapse).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore, OnLapse};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .on_lapse(OnLapse::Uncertain);
    /// # let _ = b;
    /// ```
    pub fn on_lapse(mut self, on_lapse: OnLapse) -> Self {
        self.common.guard.options = self.common.guard.options.on_lapse(on_lapse);
        self
    }

    /// The version of what this layer fingerprints (`Fingerprint::with_policy`), kept with
    /// every record it stores. By default derived from the layer's fingerprint settings (HTTP:
    /// the body view, [`fingerprint`](crate::http::LayerBuilder::fingerprint); gRPC: the
    /// message as sent), so a deploy that changes them answers a retry across the change whose
    /// request now fingerprints differently with `Problem::PolicyChanged` (HTTP `409`), not
    /// `Problem::KeyReused`. Set it yourself when what the request means changes without the
    /// settings changing (a field's meaning, a new required header).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new())).policy_version(2);
    /// # let _ = b;
    /// ```
    pub fn policy_version(mut self, version: u32) -> Self {
        self.common.guard.policy = Some(version);
        self
    }

    /// Checks what both protocols decide alike: whose keys are whose (a caller extractor or the
    /// shared key space, exactly one), the scope, and the lease and retention overrides; then
    /// hands over the settings for the protocol's own checks.
    pub(crate) fn checked(self) -> Result<(Common<C>, P::Settings), Error> {
        let [layer, keys, request] = P::WORDS;
        match (self.common.caller.is_some(), self.shared_key_space) {
            (true, false) | (false, true) => {}
            (false, false) => {
                return Err(Error::InvalidConfig(format!(
                    "the {layer} layer does not know whose {keys} are whose: call \
                     .caller(|parts| …) to scope keys by the identity of who asks (an API key \
                     id, a user id), or .shared_key_space() to let every client share one key \
                     space, where any client that sends another's key and {request} gets that \
                     client's response"
                )))
            }
            (true, true) => {
                return Err(Error::InvalidConfig(format!(
                    "the {layer} layer has both .caller(…) and .shared_key_space(); keep \
                     .caller(…) to scope keys by caller, or remove it to share one key space"
                )))
            }
        }
        if let Err(e) = check_scope(&self.common.guard.scope) {
            return Err(Error::InvalidConfig(format!("{layer} layer scope: {e}")));
        }
        self.common.guard.options.check()?;
        Ok((self.common, self.settings))
    }
}

/// The service an [`IdempotencyLayer`] wraps around a handler, router or tonic service: the
/// inner service and the layer's configuration. Build it through the layer.
pub struct IdempotencyService<S, P: Protocol, C = JsonCodec> {
    inner: S,
    config: Arc<P::Config<C>>,
}

impl<S: Clone, P: Protocol, C> IdempotencyService<S, P, C> {
    /// For one call: the inner service that was polled ready (a clone takes its place for the
    /// next call) and the layer's config.
    fn take_ready(&mut self) -> (S, Arc<P::Config<C>>) {
        let clone = self.inner.clone();
        (
            std::mem::replace(&mut self.inner, clone),
            self.config.clone(),
        )
    }
}

impl<S: Clone, P: Protocol, C> Clone for IdempotencyService<S, P, C> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, P: Protocol, C> fmt::Debug for IdempotencyService<S, P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::SERVICE)
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

/// What the inner service must be, and the body of the request and of the response, are the
/// protocol's ([`Serve`]): over HTTP it takes the request as it comes (with a body that is
/// `From<Bytes>`), over gRPC with tonic's body. `poll_ready` polls the inner service; `call`
/// hands a clone of it, the layer's config and the request to the protocol's
/// [`Serve::serve`], its future boxed.
impl<S, P, C, ReqBody> Service<Request<ReqBody>> for IdempotencyService<S, P, C>
where
    P: Serve<ReqBody, S>,
    S: Clone,
    C: Codec,
{
    type Response = Response<P::Body>;
    type Error = P::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, P::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), P::Error>> {
        P::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (inner, config) = self.take_ready();
        Box::pin(P::serve(inner, config, req))
    }
}

/// The service a layer wraps: a tower service of `http::Request<R>` answering
/// `http::Response<B>`, which the layer clones for each call and whose calls it runs
/// detached (so it, its future and its error are `Send + 'static`).
pub trait Inner<R, B>:
    Service<Request<R>, Response = Response<B>, Future: Send + 'static, Error: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S, R, B> Inner<R, B> for S where
    S: Service<Request<R>, Response = Response<B>, Future: Send + 'static, Error: Send + 'static>
        + Clone
        + Send
        + 'static
{
}

/// How a layer's `Debug` describes whose keys are whose: `caller` when a caller extractor
/// scopes them.
pub(crate) fn key_space(caller: bool) -> &'static str {
    if caller {
        "scoped by the caller extractor"
    } else {
        "one shared key space"
    }
}
