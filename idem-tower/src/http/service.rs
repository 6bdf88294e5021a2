//! [`IdempotencyService`]: one request through claim → handler → store, or replay.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum_core::body::Body;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use tower::Service;

use super::extract::KeyChecked;
use super::key_header::client_key;
use super::layer::{Config, Http};
use super::problem::from_engine;
use super::Problem;
use super::IDEMPOTENCY_KEY;
use crate::capture::body::{read_request, read_response, Buffered, LayerBody, ReadError};
use crate::capture::reply::{Failure, Reply};
use crate::capture::stored::{self, Captured};
use crate::capture::{self, CallerRefused};
use crate::layer::{Inner, Serve};
use idem_core::{Codec, Key};

/// The service an [`IdempotencyLayer`](super::IdempotencyLayer) wraps around a handler or
/// router. Build it through the layer.
///
/// ```
/// use axum::{routing::post, Router};
/// use idem::http::IdempotencyLayer;
/// use idem::{Idempotency, MemoryStore};
/// use tower::Layer;
///
/// let router: Router = Router::new().route("/payments", post(|| async { "created" }));
/// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
///     .build()?;
/// let service = layer.layer(router);
/// # let _ = service;
/// # Ok::<(), idem::Error>(())
/// ```
///
/// This is the service generic over the protocol,
/// [`IdempotencyService<S, Http, C>`](crate::IdempotencyService), for HTTP.
pub type IdempotencyService<S, C> = crate::IdempotencyService<S, Http, C>;

impl<R, S, B> Serve<R, S> for Http
where
    R: LayerBody + From<Bytes>,
    S: Service<Request<R>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: LayerBody,
{
    type Body = Body;
    type Error = S::Error;

    fn poll_ready(inner: &mut S, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        inner.poll_ready(cx)
    }

    fn serve<C: Codec>(
        inner: S,
        config: Arc<Config<C>>,
        req: Request<R>,
    ) -> impl Future<Output = Result<Response<Body>, S::Error>> + Send + 'static {
        serve(inner, config, req)
    }
}

/// One request: a guarded method with a key is claimed, run and stored, or replayed; anything
/// else passes untouched.
#[allow(clippy::manual_async_fn)] // see the comment inside
fn serve<S: Inner<R, B>, C: Codec, R: LayerBody + From<Bytes>, B: LayerBody>(
    mut inner: S,
    config: Arc<Config<C>>,
    req: Request<R>,
) -> impl Future<Output = Result<Response<Body>, S::Error>> + Send {
    // A plain function returning its future, not an `async fn`: an async fn keeps its
    // arguments twice in its future (as arguments and as the locals they move into), and the
    // request alone is some 200 bytes that every call boxes and moves.
    async move {
        if !config.http.methods.contains(req.method()) {
            return pass(inner, req).await;
        }
        let client_key = match client_key(
            req.headers().get_all(IDEMPOTENCY_KEY),
            config.http.accept_bare_keys,
        ) {
            Ok(Some(k)) => k,
            Ok(None) if config.common.require_key => {
                return Ok(Problem::KeyMissing.response(
                    &config.http.problems,
                    format!(
                        "{} requests to this API need an Idempotency-Key header, e.g. \
                     Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
                        req.method()
                    ),
                ))
            }
            Ok(None) => return pass(inner, req).await,
            Err(e) => return Ok(Problem::KeyMalformed.response(&config.http.problems, e)),
        };
        let (parts, body) = req.into_parts();
        let key = match record_key(&config, &parts, &client_key) {
            Ok(key) => key,
            Err((problem, detail)) => return Ok(problem.response(&config.http.problems, detail)),
        };
        let body = match read_request(body, &parts.headers, config.common.max_request).await {
            Ok(body) => body,
            Err(ReadError::TooLarge) => {
                return Ok(Problem::BodyTooLarge.response(
                    &config.http.problems,
                    format!(
                        "requests with an Idempotency-Key may carry at most {} bytes of body",
                        config.common.max_request
                    ),
                ))
            }
            Err(ReadError::Failed(e)) => {
                return Ok(Problem::BodyUnreadable.response(
                    &config.http.problems,
                    format!("reading the body failed: {e}"),
                ))
            }
        };
        let fingerprint = config.http.fingerprint.of(&parts.method, &parts.uri, &body);
        let mut req = Request::from_parts(parts, R::from(body));

        let limit = config.common.guard.engine.policy().max_response_bytes();
        let store_if = config.http.store_if.clone();
        let headers = config.common.guard.headers.clone();
        // Detached from the connection: once claimed, the handler runs to its end and its response
        // is stored even if the client goes away, so the client's retry replays it instead of
        // running the handler a second time. Boxed here, where it is made: it holds the inner
        // service's future and the response read, and every future that carries it on its way
        // into the engine would otherwise copy all of it (about 1,400 instructions a request).
        let work = Box::pin(async move {
            // Marked only here, as its handler is about to run: a replay pays nothing for it.
            req.extensions_mut().insert(KeyChecked);
            let response = inner.call(req).await.map_err(Failure::Service)?;
            let (parts, body) = response.into_parts();
            let body = Body::new(body);
            if !store_if(parts.status, &parts.headers) {
                return Err(Failure::Pass(Response::from_parts(parts, body)));
            }
            let room = limit.saturating_sub(stored::head_len(&parts, &headers));
            Ok(match read_response(body, room).await {
                Buffered::Whole { body, trailers } => Reply::Stored(Captured {
                    parts,
                    body,
                    trailers,
                }),
                Buffered::Unstorable { body, why } => Reply::Unstorable {
                    response: Response::from_parts(parts, body),
                    why,
                },
            })
        });
        capture::reply::run_once(&config.common.guard, key, fingerprint, work, |e| {
            from_engine(&config.http.problems, e)
        })
        .await
    }
}

/// The record key of a request; or, when the caller identity is missing or cannot be a key part,
/// the problem to answer (never a shared space, never a 500).
fn record_key<C>(
    config: &Config<C>,
    parts: &Parts,
    client_key: &str,
) -> Result<Key, (Problem, String)> {
    const MISSING: &str = "this API keeps each caller's Idempotency-Keys apart, and this \
                           request does not say who sends it; authenticate and send it again";
    const EMPTY: &str = "the caller identity taken from this request is empty, so it cannot \
                         keep this caller's Idempotency-Keys apart from others'";
    capture::record_key(
        &config.common.guard.scope,
        config.common.caller.as_deref(),
        parts,
        client_key,
    )
    .map_err(|e| {
        match e {
            CallerRefused::Missing => (Problem::CallerMissing, MISSING.to_owned()),
            CallerRefused::Empty => (Problem::CallerInvalid, EMPTY.to_owned()),
            // The scope was checked at build and the client key while parsing: the identity is
            // what failed.
            CallerRefused::Invalid(e) => (
                Problem::CallerInvalid,
                format!("the caller identity taken from this request cannot scope a key: {e}"),
            ),
        }
    })
}

/// Calls the inner service untouched: an unguarded method, or no key where none is required.
async fn pass<S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: LayerBody,
{
    Ok(inner.call(req).await?.map(Body::new))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use axum_core::body::Body;
    use http::{Request, Response};
    use tower::{Layer, Service};

    use crate::http::IdempotencyLayer;
    use idem_core::{Idempotency, MemoryStore};

    /// The layer's future is boxed and moved on every request, so its size is a cost of every
    /// request: 1,768 bytes over axum's `Body` with rustc 1.95, since the handler's work is boxed
    /// where it is made (2,920 before, when it was carried and copied by every future on its way
    /// into the engine; 3,112 when `serve` was an `async fn`, which kept its arguments, the
    /// request among them, twice). The bound leaves room for another compiler's layout, not for
    /// either copy to come back.
    #[test]
    fn the_layers_call_future_keeps_one_copy_of_its_arguments() {
        let inner = tower::service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::empty()))
        });
        let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
            .shared_key_space()
            .build()
            .unwrap();
        let mut service = layer.layer(inner);
        let call = service.call(Request::post("/").body(Body::empty()).unwrap());
        let size = std::mem::size_of_val(&*call);
        eprintln!("the HTTP layer's call future: {size} bytes");
        assert!(
            size <= 1_824,
            "the HTTP layer's call future is {size} bytes"
        );
    }
}
