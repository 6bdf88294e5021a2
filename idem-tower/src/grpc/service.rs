//! [`IdempotencyService`]: one unary call through claim → handler → store, or replay.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use tonic::body::Body;
use tonic::Code;
use tower::Service;

use super::layer::{Config, Grpc, KeySource};
use super::problem::from_engine;
use super::wire::{self, Message};
use super::Problem;
use crate::capture::body::{read_request, read_response, Buffered, LayerBody, ReadError};
use crate::capture::reply::{Failure, Reply};
use crate::capture::stored::{self, Captured};
use crate::capture::{self, CallerRefused};
use crate::layer::{Inner, Serve};
use idem_core::{validate_client_key, Codec, Key};

/// The service a gRPC [`IdempotencyLayer`](super::IdempotencyLayer) wraps around a tonic
/// service or router. Build it through the layer.
///
/// ```
/// use idem::grpc::IdempotencyLayer;
/// use idem::{Idempotency, MemoryStore};
/// use tower::Layer;
///
/// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
///     .unary("/bank.v1.Payments/Create")
///     .shared_key_space()
///     .build()?;
/// // Any tower service of `http::Request<tonic::body::Body>`, such as a generated server.
/// let service = layer.layer(tower::service_fn(|_req: http::Request<tonic::body::Body>| async {
///     Ok::<_, std::convert::Infallible>(tonic::Status::unimplemented("").into_http::<tonic::body::Body>())
/// }));
/// # let _ = service;
/// # Ok::<(), idem::Error>(())
/// ```
///
/// This is the service generic over the protocol,
/// [`IdempotencyService<S, Grpc, C>`](crate::IdempotencyService), for gRPC.
pub type IdempotencyService<S, C> = crate::IdempotencyService<S, Grpc, C>;

impl<R, S, B> Serve<R, S> for Grpc
where
    R: LayerBody,
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
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

/// One call: a unary method named at build with a key is claimed, run and stored, or replayed;
/// anything else passes untouched.
#[allow(clippy::manual_async_fn)] // see the comment inside
fn serve<S: Inner<Body, B>, C: Codec, R: LayerBody, B: LayerBody>(
    mut inner: S,
    config: Arc<Config<C>>,
    req: Request<R>,
) -> impl Future<Output = Result<Response<Body>, S::Error>> + Send {
    // A plain function returning its future, not an `async fn`: an async fn keeps its
    // arguments twice in its future (as arguments and as the locals they move into), and the
    // request alone is some 200 bytes that every call boxes and moves.
    async move {
        // Only the unary methods named at build: streaming calls and every other path pass
        // untouched, their frames as they come.
        let Some(method) = config.methods.get(req.uri().path()) else {
            return pass(inner, req.map(Body::new)).await;
        };
        let from_metadata = match method.key() {
            KeySource::Metadata => match metadata_key(req.headers(), &config) {
                Ok(Some(key)) => Some(key),
                Ok(None) if config.common.require_key => return Ok(key_missing(&config)),
                Ok(None) => return pass(inner, req.map(Body::new)).await,
                Err(detail) => return Ok(Problem::KeyMalformed.grpc_response(detail)),
            },
            KeySource::Field(_) | KeySource::Custom(_) => None,
        };
        let (parts, body) = req.into_parts();
        // The message is read whole before anything is claimed: a call whose message never
        // fully arrived claims nothing.
        let limit = config.common.max_request.saturating_add(5);
        let body = match read_request(body, &parts.headers, limit).await {
            Ok(body) => body,
            Err(ReadError::TooLarge) => {
                return Ok(Problem::BodyTooLarge.grpc_response(format!(
                    "calls to this method with an idempotency key may carry a message of at \
                     most {} bytes",
                    config.common.max_request
                )))
            }
            Err(ReadError::Failed(e)) => {
                return Ok(Problem::BodyUnreadable
                    .grpc_response(format!("reading the request failed: {e}")))
            }
        };
        let message = match wire::unary_message(&body) {
            Ok(message) => message,
            Err(detail) => return Ok(Problem::BodyUnreadable.grpc_response(detail)),
        };
        let client_key = match from_metadata {
            Some(key) => key,
            None => match message_key(method.key(), message) {
                Ok(Some(key)) => key,
                Ok(None) if config.common.require_key => return Ok(key_missing(&config)),
                Ok(None) => {
                    let req = Request::from_parts(parts, Body::new(Full::new(body)));
                    return pass(inner, req).await;
                }
                Err(detail) => return Ok(Problem::KeyMalformed.grpc_response(detail)),
            },
        };
        let key = match record_key(&config, &parts, &client_key) {
            Ok(key) => key,
            Err((problem, detail)) => return Ok(problem.grpc_response(detail)),
        };
        let fingerprint = wire::fingerprint(parts.uri.path(), message);
        let req = Request::from_parts(parts, Body::new(Full::new(body)));

        let limit = config.common.guard.engine.policy().max_response_bytes();
        let store_if = config.store_if.clone();
        let headers = config.common.guard.headers.clone();
        // Detached from the connection: once claimed, the handler runs to its end and its
        // response is stored even if the client goes away or its deadline passes, so the
        // client's retry replays it instead of running the handler a second time. Boxed
        // here, where it is made: tonic's futures make it large, and every future that
        // holds it on its way into the engine would otherwise copy all of it.
        let work = Box::pin(async move {
            let response = inner.call(req).await.map_err(Failure::Service)?;
            let (parts, body) = response.into_parts();
            let room = limit.saturating_sub(stored::head_len(&parts, &headers));
            // Read whole, trailers included: a gRPC call's status is known only at its end.
            match read_response(axum_core::body::Body::new(body), room).await {
                Buffered::Whole { body, trailers } => {
                    let captured = Captured {
                        parts,
                        body,
                        trailers,
                    };
                    if store_if(grpc_code(&captured)) {
                        Ok(Reply::Stored(captured))
                    } else {
                        Err(Failure::Pass(captured.into_response()))
                    }
                }
                Buffered::Unstorable { body, why } => Ok(Reply::Unstorable {
                    response: Response::from_parts(parts, body),
                    why,
                }),
            }
        });
        capture::reply::run_once(&config.common.guard, key, fingerprint, work, from_engine)
            .await
            .map(|response| response.map(Body::new))
    }
}

/// The key from the metadata entry: `Ok(None)` without one; an entry sent twice, or a value that
/// is not 1 to 255 printable ASCII characters, is malformed.
fn metadata_key<C>(headers: &HeaderMap, config: &Config<C>) -> Result<Option<String>, String> {
    let name = &config.key_metadata;
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("the {name} metadata entry is sent more than once"));
    }
    let key = value
        .to_str()
        .map_err(|_| format!("the {name} metadata entry is not printable ASCII"))?;
    validate_client_key(key).map_err(|e| format!("the {name} metadata entry: {e}"))?;
    Ok(Some(key.to_owned()))
}

/// The key from the request message, by the method's [`KeySource`].
fn message_key(source: &KeySource, message: Message<'_>) -> Result<Option<String>, String> {
    if message.compressed && !matches!(source, KeySource::Metadata) {
        return Err(
            "the idempotency key is read from the request message, which this call \
                    sent compressed; send it uncompressed"
                .to_owned(),
        );
    }
    let key = match source {
        KeySource::Metadata => return Ok(None),
        KeySource::Field(number) => wire::string_field(message.bytes, *number)
            .map_err(|e| format!("the request message's key field {number}: {e}"))?
            .map(str::to_owned),
        KeySource::Custom(extract) => extract(message.bytes)?,
    };
    if let Some(key) = &key {
        validate_client_key(key).map_err(|e| format!("the request's idempotency key: {e}"))?;
    }
    Ok(key)
}

fn key_missing<B: Default, C>(config: &Config<C>) -> Response<B> {
    Problem::KeyMissing.grpc_response(format!(
        "calls to this method need an idempotency key: the {} metadata entry, or the request's \
         id field, e.g. \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
        config.key_metadata
    ))
}

/// The record key of a call; or, when the caller identity is missing or cannot be a key part,
/// the problem to answer (never a shared space).
fn record_key<C>(
    config: &Config<C>,
    parts: &Parts,
    client_key: &str,
) -> Result<Key, (Problem, String)> {
    capture::record_key(
        &config.common.guard.scope,
        config.common.caller.as_deref(),
        parts,
        client_key,
    )
    .map_err(|e| match e {
        CallerRefused::Missing => (
            Problem::CallerMissing,
            "this service keeps each caller's idempotency keys apart, and this call does not \
                 say who sends it; authenticate and call again"
                .to_owned(),
        ),
        CallerRefused::Empty => (
            Problem::CallerInvalid,
            "the caller identity taken from this call is empty, so it cannot keep this \
                 caller's idempotency keys apart from others'"
                .to_owned(),
        ),
        CallerRefused::Invalid(e) => (
            Problem::CallerInvalid,
            format!("the caller identity taken from this call cannot scope a key: {e}"),
        ),
    })
}

/// The gRPC status a captured response ends with: `grpc-status` of its trailers, or of its
/// headers in a trailers-only response. A response without one, or whose HTTP status is not
/// `200`, is `UNKNOWN`.
fn grpc_code(captured: &Captured) -> Code {
    if captured.parts.status != StatusCode::OK {
        return Code::Unknown;
    }
    let status = match &captured.trailers {
        Some(trailers) if trailers.contains_key(GRPC_STATUS) => trailers.get(GRPC_STATUS),
        _ => captured.parts.headers.get(GRPC_STATUS),
    };
    status.map_or(Code::Unknown, |v| Code::from_bytes(v.as_bytes()))
}

const GRPC_STATUS: &str = "grpc-status";

/// Calls the inner service untouched: an unguarded path, or no key where none is required.
async fn pass<S, ResBody>(mut inner: S, req: Request<Body>) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    ResBody: LayerBody,
{
    Ok(inner.call(req).await?.map(Body::new))
}
