//! The routes: each maps a Diom request onto the engine (docs/architecture.md, "Ways in") and
//! the engine's answer back onto Diom's.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use idem_core::{Begun, Claim, Error, Fingerprint, Holder, Idempotency, Store};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::de::DeserializeOwned;

use crate::auth::{Caller, Tokens};
use crate::keys::{key_of, parse_token, period, token_text};
use crate::namespaces::{Namespace, Namespaces};
use crate::wire::{
    AbortIn, ApiError, CompleteIn, CompletedOut, ConfigureIn, Empty, Format, GetNamespaceIn,
    PingOut, RenewIn, StartIn, StartOut,
};

/// The OpenAPI document of the API, served at [`OPENAPI_PATH`].
pub const OPENAPI: &str = include_str!("../openapi.json");

/// Where the OpenAPI document is served.
pub const OPENAPI_PATH: &str = "/api/v1.openapi.json";

/// How the server treats requests.
///
/// ```
/// let config = idem_server::Config::default();
/// assert_eq!(config.max_body_bytes, 16 << 20);
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    /// The largest request body taken; a larger one gets `413`. Also the largest response
    /// kept. Default 16 MiB.
    pub max_body_bytes: usize,
    /// How long a request may take before it is answered `503 timeout`. Default 30 s.
    pub request_timeout: Duration,
    /// Every namespace requires the claim's token on complete and abort. Default off.
    pub require_token: bool,
    /// The lock period a token-less complete of an unclaimed key claims it with, for the one
    /// statement it takes to complete it. Default 30 s.
    pub tokenless_lease: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_body_bytes: 16 << 20,
            request_timeout: Duration::from_secs(30),
            require_token: false,
            tokenless_lease: Duration::from_secs(30),
        }
    }
}

/// The service: the engine over the store, the tokens, the namespaces. Cheap to clone.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Idempotency,
    tokens: Tokens,
    namespaces: Namespaces,
    config: Config,
    metrics: Option<PrometheusHandle>,
}

impl App {
    /// The service over `store`; `metrics` renders `/metrics` when given.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem_core::MemoryStore;
    /// use idem_server::{auth::Tokens, App, Config};
    /// let tokens = Tokens::new("admin-token-0123456789", &[])?;
    /// let app = App::new(Arc::new(MemoryStore::new()), tokens, Config::default(), None)?;
    /// let router = idem_server::router(app);
    /// # let _ = router; Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(
        store: Arc<dyn Store>,
        tokens: Tokens,
        config: Config,
        metrics: Option<PrometheusHandle>,
    ) -> Result<App, Error> {
        let engine = Idempotency::builder_from_arc(store)
            .max_response_bytes(config.max_body_bytes.max(1))
            .build()?;
        Ok(App::from_engine(engine, tokens, config, metrics))
    }

    /// The service over an engine built elsewhere (with an observer, say). Its
    /// `max_response_bytes` should be at least `config.max_body_bytes`, or large responses are
    /// kept as "completed, not retained".
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_server::{auth::Tokens, App, Config};
    /// let engine = Idempotency::builder(MemoryStore::new()).max_response_bytes(16 << 20).build()?;
    /// let app = App::from_engine(engine, Tokens::new("admin-token-0123456789", &[])?, Config::default(), None);
    /// # let _ = app; Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_engine(
        engine: Idempotency,
        tokens: Tokens,
        config: Config,
        metrics: Option<PrometheusHandle>,
    ) -> App {
        App {
            inner: Arc::new(Inner {
                namespaces: Namespaces::new(engine.clone(), config.require_token),
                engine,
                tokens,
                config,
                metrics,
            }),
        }
    }
}

impl App {
    /// The namespace a request names and the idem key of its caller's `key` there.
    async fn locate(
        &self,
        caller: &Caller,
        namespace: Option<&str>,
        key: &str,
    ) -> Result<(Namespace, idem_core::Key), ApiError> {
        let ns = self.inner.namespaces.resolve(namespace).await?;
        let key = key_of(&ns.scope, caller, key)?;
        Ok((ns, key))
    }
}

/// Diom's routes, the fenced extension's `renew`, `/metrics` and the OpenAPI document.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/api/v1.idempotency.start", post(start))
        .route("/api/v1.idempotency.complete", post(complete))
        .route("/api/v1.idempotency.abort", post(abort))
        .route("/api/v1.idempotency.renew", post(renew))
        .route(
            "/api/v1.idempotency.namespace.configure",
            post(configure_namespace),
        )
        .route("/api/v1.idempotency.namespace.get", post(get_namespace))
        .route("/api/v1.health.ping", get(ping).post(ping))
        .route(OPENAPI_PATH, get(openapi))
        .route("/metrics", get(render_metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
}

/// An engine error as Diom's error body.
pub(crate) fn engine_error(e: Error) -> ApiError {
    match e {
        Error::LeaseLost => ApiError::operation(
            StatusCode::CONFLICT,
            "stale_holder",
            "this token no longer holds the key: its lock ran out and the key was claimed again, \
             or it was completed or aborted",
        ),
        Error::KeyReused => ApiError::operation(
            StatusCode::UNPROCESSABLE_ENTITY,
            "fingerprint_mismatch",
            "the key was started with another fingerprint: a different request reused the key",
        ),
        Error::InvalidConfig(detail) => ApiError::invalid("body", detail),
        Error::Store(e) if e.kind().is_transient() => ApiError::server(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("the store failed for a passing reason; retry: {e}"),
        ),
        other => ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", other),
    }
}

/// Authenticates, reads the body within the limit, decodes it, runs `handle`, and answers in
/// the encoding `Accept` asks for, within the request timeout.
async fn serve<T, F, Fut>(
    app: App,
    route: &'static str,
    headers: HeaderMap,
    body: Body,
    handle: F,
) -> Response
where
    T: DeserializeOwned,
    F: FnOnce(App, Caller, T, Format) -> Fut,
    Fut: Future<Output = Result<Response, ApiError>>,
{
    let out = Format::of_response(&headers);
    let timeout = app.inner.config.request_timeout;
    let answered = tokio::time::timeout(timeout, async {
        let caller = app.inner.tokens.caller(&headers)?;
        let bytes = read_body(&headers, body, app.inner.config.max_body_bytes).await?;
        let input = Format::of_request(&headers).decode::<T>(&bytes)?;
        handle(app.clone(), caller, input, out).await
    })
    .await;
    let response = match answered {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => e.respond(out),
        Err(_) => ApiError::server(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            format!("the request took longer than {timeout:?}"),
        )
        .respond(out),
    };
    metrics::counter!("idem_server_requests_total", "route" => route, "status" => response.status().as_str().to_owned())
        .increment(1);
    response
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        ..ApiError::invalid("body", format!("the body is larger than {limit} bytes"))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large())
}

/// Whether the caller wants the fenced answers.
fn fenced(input: &StartIn) -> bool {
    input.fenced || input.fingerprint.is_some()
}

async fn start(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    serve(
        app,
        "start",
        headers,
        body,
        move |app, caller, input: StartIn, out| async move {
            let (ns, key) = app
                .locate(&caller, input.namespace.as_deref(), &input.key)
                .await?;
            let lease = period(input.lock_period_ms, "body.lock_period_ms")?;
            let fingerprint = match &input.fingerprint {
                Some(f) if f.is_empty() || f.len() > 4096 => {
                    return Err(ApiError::invalid(
                        "body.fingerprint",
                        "a fingerprint is 1 to 4096 bytes",
                    ))
                }
                Some(f) => Some(Fingerprint::of_bytes(f.as_bytes())),
                None => None,
            };
            let begun = app
                .inner
                .engine
                .call(key)
                .scope_named(ns.scope.clone())
                .lease(lease)
                .fingerprint(fingerprint)
                .begin()
                .await;
            let fenced = fenced(&input);
            let answer = match begun {
                Ok(Begun::Claimed(claim)) => StartOut {
                    status: "started",
                    data: None,
                    token: fenced.then(|| token_text(claim.token())),
                    retry_after_ms: None,
                },
                Ok(Begun::Completed(bytes)) => StartOut {
                    status: "completed",
                    data: Some(stored(&bytes)?),
                    token: None,
                    retry_after_ms: None,
                },
                // Kept as "completed, not retained" (larger than the limit): never run again.
                Err(Error::ResultNotRetained { .. }) => StartOut {
                    status: "completed",
                    data: Some(CompletedOut {
                        response: Vec::new(),
                        context: None,
                    }),
                    token: None,
                    retry_after_ms: None,
                },
                Err(Error::Locked { retry_after }) => StartOut {
                    status: "locked",
                    data: None,
                    token: None,
                    retry_after_ms: fenced.then(|| retry_after.as_millis().max(1) as u64),
                },
                Err(e) => return Err(engine_error(e)),
            };
            Ok(out.respond(StatusCode::OK, &answer))
        },
    )
    .await
}

/// A stored response and context, as `finish` stored them.
fn stored(bytes: &[u8]) -> Result<CompletedOut, ApiError> {
    rmp_serde::from_slice(bytes).map_err(|e| {
        ApiError::server(
            StatusCode::INTERNAL_SERVER_ERROR,
            "corrupt",
            format!("the stored response does not parse: {e}"),
        )
    })
}

/// A token-less complete or abort in a namespace that requires tokens.
fn token_required() -> ApiError {
    ApiError::invalid(
        "body.token",
        "this namespace requires the token `start` returned (send `fenced: true` to start)",
    )
}

/// How many times a token-less complete or abort follows a key that changes hands under it.
const TOKENLESS_TRIES: usize = 4;

async fn complete(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    serve(
        app,
        "complete",
        headers,
        body,
        move |app, caller, input: CompleteIn, out| async move {
            let (ns, key) = app
                .locate(&caller, input.namespace.as_deref(), &input.key)
                .await?;
            let ttl = period(input.ttl_ms, "body.ttl_ms")?;
            let token = input.token.as_deref().map(parse_token).transpose()?;
            let record = CompletedOut {
                response: input.response,
                context: input.context,
            };
            let bytes = rmp_serde::to_vec_named(&record).map_err(|e| {
                ApiError::invalid("body", format!("the response cannot be kept: {e}"))
            })?;
            let engine = &app.inner.engine;
            match token {
                Some(token) => engine
                    .finish(&ns.scope, &Claim::new(key, token), bytes, Some(ttl))
                    .await
                    .map_err(engine_error)?,
                None => tokenless_complete(&app, &ns, key, bytes, ttl).await?,
            }
            Ok(out.respond(StatusCode::OK, &Empty {}))
        },
    )
    .await
}

/// Diom's complete, which carries no token: completes whichever claim holds the key; a key
/// nobody holds is claimed and completed (Diom stores a response for a key that was never
/// started); a completed key keeps its first response (Diom would overwrite it).
async fn tokenless_complete(
    app: &App,
    ns: &Namespace,
    key: idem_core::Key,
    bytes: Vec<u8>,
    ttl: Duration,
) -> Result<(), ApiError> {
    if ns.require_token {
        return Err(token_required());
    }
    let engine = &app.inner.engine;
    // Bounded: each pass meets the key in one state; a key that changes hands under every
    // pass gets `409 conflict`.
    for _ in 0..TOKENLESS_TRIES {
        let claim = match engine.holder(&key).await.map_err(engine_error)? {
            Holder::Completed(_) => return Ok(()),
            Holder::Claimed(claim) => claim,
            Holder::Absent => match engine
                .call(key)
                .scope_named(ns.scope.clone())
                .lease(app.inner.config.tokenless_lease)
                .begin()
                .await
            {
                Ok(Begun::Claimed(claim)) => claim,
                Ok(Begun::Completed(_)) | Err(Error::ResultNotRetained { .. }) => return Ok(()),
                Err(Error::Locked { .. }) => continue,
                Err(e) => return Err(engine_error(e)),
            },
        };
        match engine
            .finish(&ns.scope, &claim, bytes.clone(), Some(ttl))
            .await
        {
            Ok(()) => return Ok(()),
            Err(Error::LeaseLost) => continue,
            Err(e) => return Err(engine_error(e)),
        }
    }
    Err(changed_hands())
}

fn changed_hands() -> ApiError {
    ApiError::operation(
        StatusCode::CONFLICT,
        "conflict",
        "the key changed hands while this request acted on it; try again",
    )
}

async fn abort(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    serve(
        app,
        "abort",
        headers,
        body,
        move |app, caller, input: AbortIn, out| async move {
            let (ns, key) = app
                .locate(&caller, input.namespace.as_deref(), &input.key)
                .await?;
            let token = input.token.as_deref().map(parse_token).transpose()?;
            let engine = &app.inner.engine;
            match token {
                Some(token) => engine
                    .release(&ns.scope, &Claim::new(key, token))
                    .await
                    .map_err(engine_error)?,
                None if ns.require_token => return Err(token_required()),
                // Diom's abort: releases whichever claim holds the key. A completed key keeps its
                // response (Diom would delete it), and a key nobody holds is left as it is.
                None => {
                    let mut released = false;
                    for _ in 0..TOKENLESS_TRIES {
                        match engine.holder(&key).await.map_err(engine_error)? {
                            Holder::Absent | Holder::Completed(_) => {
                                released = true;
                                break;
                            }
                            Holder::Claimed(claim) => match engine.release(&ns.scope, &claim).await
                            {
                                Ok(()) => {
                                    released = true;
                                    break;
                                }
                                Err(Error::LeaseLost) => continue,
                                Err(e) => return Err(engine_error(e)),
                            },
                        }
                    }
                    if !released {
                        return Err(changed_hands());
                    }
                }
            }
            Ok(out.respond(StatusCode::OK, &Empty {}))
        },
    )
    .await
}

async fn renew(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    serve(
        app,
        "renew",
        headers,
        body,
        move |app, caller, input: RenewIn, out| async move {
            let (_, key) = app
                .locate(&caller, input.namespace.as_deref(), &input.key)
                .await?;
            let token = parse_token(&input.token)?;
            let lease = period(input.lock_period_ms, "body.lock_period_ms")?;
            app.inner
                .engine
                .renew(&Claim::new(key, token), lease)
                .await
                .map_err(engine_error)?;
            Ok(out.respond(StatusCode::OK, &Empty {}))
        },
    )
    .await
}

fn admin_only(caller: &Caller) -> Result<(), ApiError> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(ApiError::operation(
            StatusCode::FORBIDDEN,
            "forbidden",
            "namespaces are configured with the admin token",
        ))
    }
}

async fn configure_namespace(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    serve(
        app,
        "namespace.configure",
        headers,
        body,
        move |app, caller, input: ConfigureIn, out| async move {
            admin_only(&caller)?;
            let ns = app
                .inner
                .namespaces
                .configure(&input.name, input.require_token)
                .await?;
            Ok(out.respond(StatusCode::OK, &ns))
        },
    )
    .await
}

async fn get_namespace(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    serve(
        app,
        "namespace.get",
        headers,
        body,
        move |app, caller, input: GetNamespaceIn, out| async move {
            admin_only(&caller)?;
            match app.inner.namespaces.get(&input.name).await? {
                Some(ns) => Ok(out.respond(StatusCode::OK, &ns)),
                None => Err(ApiError::not_found(format!(
                    "no namespace `{}`",
                    input.name
                ))),
            }
        },
    )
    .await
}

async fn ping(headers: HeaderMap) -> Response {
    Format::of_response(&headers).respond(StatusCode::OK, &PingOut { ok: true })
}

async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        OPENAPI,
    )
        .into_response()
}

async fn render_metrics(State(app): State<App>) -> Response {
    match &app.inner.metrics {
        Some(handle) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            )],
            handle.render(),
        )
            .into_response(),
        None => ApiError::not_found("metrics are not enabled on this server").respond(Format::Json),
    }
}

async fn not_found(headers: HeaderMap) -> Response {
    ApiError::operation(StatusCode::NOT_FOUND, "not_found", "no such route")
        .respond(Format::of_response(&headers))
}

async fn method_not_allowed(headers: HeaderMap) -> Response {
    ApiError::operation(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "the API's routes take POST (the health ping, GET too)",
    )
    .respond(Format::of_response(&headers))
}
