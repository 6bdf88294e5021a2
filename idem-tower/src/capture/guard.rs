//! The parts of the HTTP and gRPC layers that are the same but for their documentation: the
//! public layer and service types with their `Clone`, `Debug`, `Layer` and tower `Service`
//! impls, and the builder setters both have (whose keys are whose, the scope, the engine
//! overrides). Each is a macro, so each layer keeps its own public types, paths and rustdoc
//! (given as the macro's doc attributes) while the code stands once. A layer module using them
//! defines `Config<C>` (with `engine`, `options`, `require_key`, `scope` and `caller`),
//! `LayerBuilder<C>` (with `config` and `shared_key_space`), `IdempotencyService::new`'s caller,
//! `Layer::layer`, and `serve`, what the service does with one request.

use http::{Request, Response};
use tower::Service;

/// The public `IdempotencyLayer<C>` (an `Arc` of the layer module's `Config<C>`) and its
/// `Clone`, `Debug` (the config's) and tower `Layer` impls, which wrap an `IdempotencyService`.
macro_rules! guard_layer {
    ($(#[$doc:meta])*) => {
        $(#[$doc])*
        pub struct IdempotencyLayer<C = ::idem_core::JsonCodec> {
            config: ::std::sync::Arc<Config<C>>,
        }

        impl<C> Clone for IdempotencyLayer<C> {
            fn clone(&self) -> Self {
                IdempotencyLayer {
                    config: self.config.clone(),
                }
            }
        }

        impl<C> ::std::fmt::Debug for IdempotencyLayer<C> {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                self.config.fmt(f)
            }
        }

        impl<S, C> ::tower::Layer<S> for IdempotencyLayer<C> {
            type Service = IdempotencyService<S, C>;

            fn layer(&self, inner: S) -> Self::Service {
                IdempotencyService::new(inner, self.config.clone())
            }
        }
    };
}

/// The public `IdempotencyService<S, C>` (the inner service and the layer's shared config),
/// its constructor and its `Clone` and `Debug` impls; `$name` is the name `Debug` shows.
macro_rules! guard_service {
    ($(#[$doc:meta])* debug = $name:literal) => {
        $(#[$doc])*
        pub struct IdempotencyService<S, C> {
            inner: S,
            config: ::std::sync::Arc<Config<C>>,
        }

        impl<S, C> IdempotencyService<S, C> {
            pub(crate) fn new(inner: S, config: ::std::sync::Arc<Config<C>>) -> Self {
                IdempotencyService { inner, config }
            }
        }

        impl<S: Clone, C> IdempotencyService<S, C> {
            /// For one call: the inner service that was polled ready (a clone takes its place
            /// for the next call) and the layer's config.
            fn take_ready(&mut self) -> (S, ::std::sync::Arc<Config<C>>) {
                let clone = self.inner.clone();
                (::std::mem::replace(&mut self.inner, clone), self.config.clone())
            }
        }

        impl<S: Clone, C> Clone for IdempotencyService<S, C> {
            fn clone(&self) -> Self {
                IdempotencyService {
                    inner: self.inner.clone(),
                    config: self.config.clone(),
                }
            }
        }

        impl<S: ::std::fmt::Debug, C> ::std::fmt::Debug for IdempotencyService<S, C> {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct($name)
                    .field("inner", &self.inner)
                    .field("config", &self.config)
                    .finish()
            }
        }
    };
}

/// `impl tower::Service<http::Request<ReqBody>> for IdempotencyService<S, C>`, which both
/// layers write alike: the inner service takes requests of `$inner` (`ReqBody` names the
/// request's own body) and answers with any [`LayerBody`](super::body::LayerBody); the
/// request's body is a `LayerBody`, and also `$bound` when given; the response is
/// `http::Response<$body>`, the error the inner service's, the future boxed. `poll_ready`
/// polls the inner service; `call` hands a clone of it, the layer's config and the request to
/// the layer module's `serve`, an `async fn` of those three whose inner service is an
/// [`Inner`] (the impl writes `Inner`'s bounds out: they are what rustdoc shows, and
/// `Response = …` is what ties `ResBody` to `S`). The macro also makes the layer's `Config<C>`
/// [`Guarded`](super::reply::Guarded), from its `engine`, `options` and `scope`.
macro_rules! guard_service_impl {
    (inner = $inner:ty, body = $body:ty $(, request: $bound:path)?) => {
        impl<S, C, ReqBody, ResBody> ::tower::Service<::http::Request<ReqBody>>
            for IdempotencyService<S, C>
        where
            S: ::tower::Service<::http::Request<$inner>, Response = ::http::Response<ResBody>>
                + Clone
                + Send
                + 'static,
            S::Future: Send + 'static,
            S::Error: Send + 'static,
            C: ::idem_core::Codec,
            ReqBody: $crate::capture::body::LayerBody $(+ $bound)?,
            ResBody: $crate::capture::body::LayerBody,
        {
            type Response = ::http::Response<$body>;
            type Error = S::Error;
            type Future = ::std::pin::Pin<
                Box<dyn ::std::future::Future<Output = Result<Self::Response, S::Error>> + Send>,
            >;

            fn poll_ready(
                &mut self,
                cx: &mut ::std::task::Context<'_>,
            ) -> ::std::task::Poll<Result<(), S::Error>> {
                self.inner.poll_ready(cx)
            }

            fn call(&mut self, req: ::http::Request<ReqBody>) -> Self::Future {
                let (inner, config) = self.take_ready();
                Box::pin(serve(inner, config, req))
            }
        }

        impl<C: ::idem_core::Codec> $crate::capture::reply::Guarded for Config<C> {
            type Codec = C;

            fn engine(&self) -> &::idem_core::Idempotency<C> {
                &self.engine
            }

            fn options(&self) -> ::idem_core::adapter::Overrides {
                self.options
            }

            fn scope(&self) -> ::std::sync::Arc<str> {
                self.scope.clone()
            }
        }
    };
}

/// The service a layer wraps: a tower service of `http::Request<R>` answering
/// `http::Response<B>`, which the layer clones for each call and whose calls it runs
/// detached (so it, its future and its error are `Send + 'static`).
pub(crate) trait Inner<R, B>:
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

/// Builder setters both layers have, each named by its method name after its doc attributes
/// and a `;`: `require_key`, `scope`, `caller`, `shared_key_space`, `lease`, `retention`,
/// `on_locked`; `store_if(ARGS)`, whose predicate takes the layer's `ARGS` (what it decides
/// on); `max_request(NAME)`, the limit on what the layer reads to fingerprint a call, set by
/// the method `NAME` (into the config's `max_request`). Used inside `impl LayerBuilder<C>`, in
/// the order the layer documents them.
macro_rules! guard_setters {
    ($($(#[$doc:meta])* $setter:ident $(($($arg:tt)*))?;)*) => {
        $($crate::capture::guard::guard_setters!(@one $(#[$doc])* $setter $(($($arg)*))?);)*
    };
    (@one $(#[$doc:meta])* store_if($($arg:ty),*)) => {
        $(#[$doc])*
        pub fn store_if(
            mut self,
            predicate: impl Fn($($arg),*) -> bool + Send + Sync + 'static,
        ) -> Self {
            self.config.store_if = ::std::sync::Arc::new(predicate);
            self
        }
    };
    (@one $(#[$doc:meta])* max_request($name:ident)) => {
        $(#[$doc])*
        pub fn $name(mut self, limit: usize) -> Self {
            self.config.max_request = limit;
            self
        }
    };
    (@one $(#[$doc:meta])* require_key) => {
        $(#[$doc])*
        pub fn require_key(mut self, required: bool) -> Self {
            self.config.require_key = required;
            self
        }
    };
    (@one $(#[$doc:meta])* scope) => {
        $(#[$doc])*
        pub fn scope(mut self, scope: impl Into<String>) -> Self {
            self.config.scope = ::std::sync::Arc::from(scope.into());
            self
        }
    };
    (@one $(#[$doc:meta])* caller) => {
        $(#[$doc])*
        pub fn caller(
            mut self,
            extract: impl Fn(&::http::request::Parts) -> Option<String> + Send + Sync + 'static,
        ) -> Self {
            self.config.caller = Some(Box::new(extract));
            self
        }
    };
    (@one $(#[$doc:meta])* shared_key_space) => {
        $(#[$doc])*
        pub fn shared_key_space(mut self) -> Self {
            self.shared_key_space = true;
            self
        }
    };
    (@one $(#[$doc:meta])* lease) => {
        $(#[$doc])*
        pub fn lease(mut self, lease: ::std::time::Duration) -> Self {
            self.config.options = self.config.options.lease(lease);
            self
        }
    };
    (@one $(#[$doc:meta])* retention) => {
        $(#[$doc])*
        pub fn retention(mut self, retention: ::std::time::Duration) -> Self {
            self.config.options = self.config.options.retention(retention);
            self
        }
    };
    (@one $(#[$doc:meta])* on_locked) => {
        $(#[$doc])*
        pub fn on_locked(mut self, on_locked: ::idem_core::OnLocked) -> Self {
            self.config.options = self.config.options.on_locked(on_locked);
            self
        }
    };
}

pub(crate) use {guard_layer, guard_service, guard_service_impl, guard_setters};

/// How a layer's `Debug` describes whose keys are whose: `caller` when a caller extractor
/// scopes them.
pub(crate) fn key_space(caller: bool) -> &'static str {
    if caller {
        "scoped by the caller extractor"
    } else {
        "one shared key space"
    }
}
