//! [`IdempotencyLayer`] and [`IdempotencyService`], written once for both protocols, as
//! tower-http's `TraceLayer<M>` is written once for HTTP and gRPC: what differs is the protocol
//! `P`, a small [`Protocol`] type that gives the layer's configuration and what its service does
//! with one request. `idem::http::IdempotencyLayer` and `idem::grpc::IdempotencyLayer` are this
//! layer for each protocol, by type aliases with their own builders.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use idem_core::{Codec, JsonCodec};
use tower::{Layer, Service};

/// The protocol an [`IdempotencyLayer`] speaks: `idem::http::Http` (feature `http`) or
/// `idem::grpc::Grpc` (feature `grpc`). It gives the layer its configuration, which the
/// protocol's builder checks, and serves one request. Sealed: the two protocols are this
/// crate's.
pub trait Protocol: sealed::Sealed + Send + Sync + 'static {
    /// The checked configuration every [`IdempotencyService`] of one layer shares.
    type Config<C>: fmt::Debug;
    /// The name the service's `Debug` shows.
    const SERVICE: &'static str;
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
