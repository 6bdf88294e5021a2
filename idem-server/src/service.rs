//! The routes: each maps a Diom request onto the engine (docs/architecture.md, "Ways in") and
//! the engine's answer back onto Diom's.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use idem_core::{
    AbandonedQuery, CallClaim, Claim, Error, Fingerprint, Holder, Idempotency, OnLapse,
    RecordState, Resolution, StepState, StepWrite, Store, StoreErrorKind,
};
use idem_wire::{
    hex, msgpack, route, AbortIn, CompleteIn, Completed, ConfigureNamespaceIn, Empty, EvictOut,
    FindUncertainIn, FindUncertainOut, GetNamespaceIn, GetOut, GetStatus, KeyIn, ListUncertainIn,
    ListUncertainOut, ListedUncertain, PingOut, PruneIn, PruneOut, RenewIn, ResolutionKind,
    ResolveIn, StartIn, StartOut, StartStatus, StepOut, StepWriteIn, StepsBeginIn, StepsOut,
    TakeUncertainIn, TakeUncertainOut, UncertainOut,
};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::de::DeserializeOwned;

use crate::auth::{Caller, Tokens};
use crate::issued::{Issued, MAX_ISSUED};
use crate::keys::{key_of, parse_fingerprint_sha256, parse_token, period, token_text};
use crate::namespaces::{Namespace, Namespaces};
use crate::uncertain::{self, Name};
use crate::wire::{ApiError, Format};

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
    /// The engine's [`key_retention`](idem_core::Policy::key_retention): how long the server
    /// keeps a key as a tombstone after the retention of a result it completes on its own
    /// account, an admin's resolution (`uncertain.resolve`). A `complete` keeps the tombstone
    /// its `key_retention_ms` asks for (none when absent, as in Diom). Default
    /// [`DEFAULT_KEY_RETENTION`](idem_core::DEFAULT_KEY_RETENTION), seven days; zero for none.
    pub key_retention: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_body_bytes: 16 << 20,
            request_timeout: Duration::from_secs(30),
            require_token: false,
            tokenless_lease: Duration::from_secs(30),
            key_retention: idem_core::DEFAULT_KEY_RETENTION,
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
    /// The tokens of this node's token-less claims, for their `complete` and `abort`.
    issued: Issued,
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
            .key_retention(config.key_retention)
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
                issued: Issued::new(MAX_ISSUED),
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

    /// The claim a fenced request names: the caller's `key` in `namespace` and the `token`
    /// `start` returned.
    async fn held(&self, caller: &Caller, input: &impl NamesClaim) -> Result<Claim, ApiError> {
        let (namespace, key, token) = input.claim();
        let (_, key) = self.locate(caller, namespace, key).await?;
        Ok(Claim::new(key, parse_token(token)?))
    }
}

/// A fenced request that names a claim: its namespace, key and token.
trait NamesClaim {
    fn claim(&self) -> (Option<&str>, &str, &str);
}

macro_rules! names_claim {
    ($($input:ty),*) => {$(
        impl NamesClaim for $input {
            fn claim(&self) -> (Option<&str>, &str, &str) {
                (self.namespace.as_deref(), &self.key, &self.token)
            }
        }
    )*};
}
names_claim!(RenewIn, StepsBeginIn, StepWriteIn);

/// Diom's routes, the fenced extension's (`renew`, and `get`, `evict`, `prune`, `steps.begin`,
/// `steps.write`, `uncertain.take`, `uncertain.find`, which make the server a store:
/// `idem::RemoteStore`; the admin's `uncertain.list` and `uncertain.resolve`), `/metrics` and
/// the OpenAPI document.
pub fn router(app: App) -> Router {
    Router::new()
        .route(route::START, handled("start", start))
        .route(route::COMPLETE, handled("complete", complete))
        .route(route::ABORT, handled("abort", abort))
        .route(route::RENEW, handled("renew", renew))
        .route(route::GET, handled("get", get_record))
        .route(route::EVICT, handled("evict", evict))
        .route(route::PRUNE, handled("prune", prune))
        .route(route::STEPS_BEGIN, handled("steps.begin", begin_steps))
        .route(route::STEPS_WRITE, handled("steps.write", write_step))
        .route(
            route::UNCERTAIN_TAKE,
            handled("uncertain.take", take_uncertain),
        )
        .route(
            route::UNCERTAIN_FIND,
            handled("uncertain.find", find_uncertain),
        )
        .route(
            route::UNCERTAIN_LIST,
            handled("uncertain.list", list_uncertain),
        )
        .route(
            route::UNCERTAIN_RESOLVE,
            handled("uncertain.resolve", resolve_uncertain),
        )
        .route(
            route::NAMESPACE_CONFIGURE,
            handled("namespace.configure", configure_namespace),
        )
        .route(
            route::NAMESPACE_GET,
            handled("namespace.get", get_namespace),
        )
        .route(route::PING, get(ping).post(ping))
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
        Error::PolicyChanged { stored, current } => {
            let mut e = ApiError::operation(
                StatusCode::UNPROCESSABLE_ENTITY,
                "policy_changed",
                format!(
                    "the key was started with a fingerprint of policy version {stored}, and this \
                     request's is version {current}: what is fingerprinted changed since; nothing \
                     was run (send a new key for a new request)"
                ),
            );
            e.body.stored_policy = Some(stored);
            e.body.current_policy = Some(current);
            e
        }
        Error::Uncertain { since, .. } => {
            let mut e = ApiError::operation(
                StatusCode::CONFLICT,
                "uncertain",
                "the key's claim ran out with no completion, so whether its work took effect is \
                 unknown: it is not run, completed or released again until it is resolved \
                 (uncertain.resolve)",
            );
            e.body.since_ms = Some(unix_ms(since));
            e
        }
        Error::ResultExpired { since } => {
            let mut e = ApiError::operation(
                StatusCode::CONFLICT,
                "result_expired",
                "the key completed and its response expired; it is kept so that the work does \
                 not run again: look up its effect, or send a new key for a new request",
            );
            e.body.since_ms = Some(unix_ms(since));
            e
        }
        Error::Abandoned { reason } => {
            let mut e = ApiError::operation(
                StatusCode::CONFLICT,
                "abandoned",
                format!("the key was resolved as abandoned ({reason}); it is not run again"),
            );
            e.body.reason = Some(reason);
            e
        }
        Error::NotUncertain { .. } => ApiError::operation(
            StatusCode::CONFLICT,
            "not_uncertain",
            "the key is not uncertain under that token (its holder is back, another resolution \
             came first, or it is running, completed or free): nothing was changed",
        ),
        Error::InvalidConfig(detail) => ApiError::invalid(".", detail),
        Error::InvalidStep(detail) => ApiError::invalid("name", detail),
        Error::StepsUnsupported => ApiError::operation(
            StatusCode::NOT_IMPLEMENTED,
            "steps_unsupported",
            "this server's store keeps no steps (docs/steps.md lists the stores that do)",
        ),
        Error::Store(e) if e.kind().is_transient() => ApiError::server(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("the store failed for a passing reason; retry: {e}"),
        ),
        Error::Store(e) if e.kind() == StoreErrorKind::Corrupt => ApiError::server(
            StatusCode::INTERNAL_SERVER_ERROR,
            "corrupt",
            format!("a stored record does not parse: {e}"),
        ),
        other => ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", other),
    }
}

/// The route `name`, taking POST: [`serve`] with `handle`, for a handler written as a plain
/// function of the caller, the decoded body and the answer's encoding.
fn handled<T, F, Fut>(name: &'static str, handle: F) -> MethodRouter<App>
where
    T: DeserializeOwned + Send + 'static,
    F: FnOnce(App, Caller, T, Format) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response, ApiError>> + Send + 'static,
{
    post(
        move |State(app): State<App>, headers: HeaderMap, body: Body| {
            serve(app, name, headers, body, handle)
        },
    )
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
        // In Diom's order: the token, the content type, the body's size, then its fields.
        let caller = app.inner.tokens.caller(&headers)?;
        let format = Format::of_request(&headers)?;
        let bytes = read_body(&headers, body, app.inner.config.max_body_bytes).await?;
        let input = format.decode::<T>(&bytes)?;
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
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::payload_too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let over_limit = std::error::Error::source(&e)
            .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
        if over_limit {
            ApiError::payload_too_large()
        } else {
            // Diom's answer to a body that breaks off (the client went away, say).
            ApiError::server(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "Failed to read request body",
            )
        }
    })
}

/// Whether the caller wants the fenced answers.
fn fenced(input: &StartIn) -> bool {
    input.fenced || input.fingerprint.is_some() || input.fingerprint_sha256.is_some()
}

async fn start(
    app: App,
    caller: Caller,
    input: StartIn,
    out: Format,
) -> Result<Response, ApiError> {
    let (ns, key) = app
        .locate(&caller, input.namespace.as_deref(), &input.key)
        .await?;
    let lease = period(input.lock_period_ms.get(), "lock_period_ms")?;
    let fingerprint = match (&input.fingerprint, &input.fingerprint_sha256) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "fingerprint_sha256",
                "send a fingerprint or its SHA-256, not both",
            ))
        }
        (Some(f), None) if f.is_empty() || f.len() > 4096 => {
            return Err(ApiError::invalid(
                "fingerprint",
                "a fingerprint is 1 to 4096 bytes",
            ))
        }
        (Some(f), None) => Some(Fingerprint::of_bytes(f.as_bytes())),
        (None, Some(digest)) => Some(parse_fingerprint_sha256(digest)?),
        (None, None) => None,
    };
    let on_lapse = on_lapse_of(input.on_lapse);
    if on_lapse == OnLapse::Uncertain {
        let name = name_of(&ns, &caller, &input.key);
        uncertain::keep(&app.inner.engine, &key, &name).await?;
    }
    let begun = app
        .inner
        .engine
        .call(key)
        .scope_named(ns.scope.clone())
        .lease(lease)
        .fingerprint(fingerprint)
        .on_lapse(on_lapse)
        .claim()
        .await;
    let fenced = fenced(&input);
    let answer =
        match begun {
            Ok(CallClaim::Claimed(claim)) => {
                // Its token-less complete or abort then acts under the token at once (a claim
                // that may become uncertain is not kept: see `issued`).
                if !fenced && on_lapse == OnLapse::Release {
                    app.inner.issued.remember(&key, claim.token(), lease);
                }
                StartOut {
                    token: fenced.then(|| token_text(claim.token())),
                    ..StartOut::of(StartStatus::Started)
                }
            }
            Ok(CallClaim::Completed(bytes)) => {
                let data = stored(&bytes)?;
                StartOut {
                    data: Some(if fenced { data } else { data.diom() }),
                    ..StartOut::of(StartStatus::Completed)
                }
            }
            // Kept as "completed, not retained" (larger than the limit): never run again. A fenced
            // caller (RemoteStore) is told why, and tells its engine's caller.
            Err(Error::ResultNotRetained { reason }) => StartOut {
                data: Some(Completed::default()),
                not_retained: fenced.then_some(reason),
                ..StartOut::of(StartStatus::Completed)
            },
            Err(Error::Locked { retry_after }) if fenced => StartOut {
                retry_after_ms: Some(millis(retry_after).max(1)),
                lease_left_ms: lease_left(&app, &key).await?,
                ..StartOut::of(StartStatus::Locked)
            },
            Err(Error::Locked { .. }) => StartOut::of(StartStatus::Locked),
            // Past the lease, fenced: what the key is, and since when.
            Err(Error::Uncertain { since, .. }) if fenced => StartOut {
                since_ms: Some(unix_ms(since)),
                ..StartOut::of(StartStatus::Uncertain)
            },
            Err(Error::ResultExpired { since }) if fenced => StartOut {
                since_ms: Some(unix_ms(since)),
                ..StartOut::of(StartStatus::Expired)
            },
            // Diom's clients know three answers: a key that must not run again (uncertain, a
            // tombstone, resolved as abandoned) is `locked` to them, never `started`.
            Err(
                Error::Uncertain { .. } | Error::ResultExpired { .. } | Error::Abandoned { .. },
            ) if !fenced => StartOut::of(StartStatus::Locked),
            Err(e) => return Err(engine_error(e)),
        };
    Ok(out.respond(StatusCode::OK, &answer))
}

/// The wire's `on_lapse` as the engine's.
fn on_lapse_of(on_lapse: idem_wire::OnLapse) -> OnLapse {
    match on_lapse {
        idem_wire::OnLapse::Release => OnLapse::Release,
        idem_wire::OnLapse::Uncertain => OnLapse::Uncertain,
    }
}

/// The name the server keeps of `caller`'s `key` in `ns` while it may be uncertain.
fn name_of(ns: &Namespace, caller: &Caller, key: &str) -> Name {
    Name {
        namespace: ns.scope.to_string(),
        caller: caller.key_space(),
        key: key.to_owned(),
    }
}

/// `d` in whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `t` in Unix milliseconds (0 before the epoch).
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, millis)
}

/// What is left of the lease of the claim holding `key`, as the store reads it: the store's
/// own `Locked` answer is behind the engine's `retry_after` estimate, so a fenced `locked`
/// answer reads the record once more (docs/server.md, "Round trips"). `None` when the key is
/// no longer held.
async fn lease_left(app: &App, key: &idem_core::Key) -> Result<Option<u64>, ApiError> {
    Ok(
        match app.inner.engine.record(key).await.map_err(engine_error)? {
            Some(idem_core::Record {
                state: RecordState::InProgress { lease_until, .. },
                ..
            }) => Some(
                lease_until
                    .duration_since(SystemTime::now())
                    .map_or(1, millis)
                    .max(1),
            ),
            _ => None,
        },
    )
}

/// A stored response and context, as `finish` stored them.
fn stored(bytes: &[u8]) -> Result<Completed, ApiError> {
    msgpack::from_slice(bytes).map_err(|e| {
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
        "token",
        "this namespace requires the token `start` returned (send `fenced: true` to start)",
    )
}

/// How many times a token-less complete or abort follows a key that changes hands under it.
const TOKENLESS_TRIES: usize = 4;

async fn complete(
    app: App,
    caller: Caller,
    input: CompleteIn,
    out: Format,
) -> Result<Response, ApiError> {
    let (ns, key) = app
        .locate(&caller, input.namespace.as_deref(), &input.key)
        .await?;
    let ttl = period(input.ttl_ms.get(), "ttl_ms")?;
    let key_retention = match input.key_retention_ms {
        0 => Duration::ZERO,
        ms => period(ms, "key_retention_ms")?,
    };
    let token = input.token.as_deref().map(parse_token).transpose()?;
    if input.absent && !input.response.is_empty() {
        return Err(ApiError::invalid(
            "response",
            "a response marked absent must be empty",
        ));
    }
    let record = Completed {
        response: input.response,
        context: input.context,
        is_error: input.is_error,
        absent: input.absent,
        expires_at_ms: Some(unix_ms(SystemTime::now() + ttl)),
    };
    let bytes = msgpack::to_vec(&record)
        .map_err(|e| ApiError::invalid("body", format!("the response cannot be kept: {e}")))?;
    let engine = &app.inner.engine;
    match token {
        Some(token) => engine
            .finish(&ns.scope, &Claim::new(key, token), bytes)
            .retention(ttl)
            .key_retention(key_retention)
            .observed(input.observed)
            .await
            .map_err(engine_error)?,
        None => tokenless_complete(&app, &ns, key, bytes, ttl, key_retention).await?,
    }
    Ok(out.respond(StatusCode::OK, &Empty {}))
}

/// Diom's complete, which carries no token: completes whichever claim holds the key; a key
/// nobody holds is claimed and completed (Diom stores a response for a key that was never
/// started); a completed key keeps its first response (Diom would overwrite it), and so does a
/// tombstone or a key resolved as abandoned. An uncertain key is refused (`409 uncertain`):
/// only a resolution, or its holder's token, may end it.
async fn tokenless_complete(
    app: &App,
    ns: &Namespace,
    key: idem_core::Key,
    bytes: Vec<u8>,
    ttl: Duration,
    key_retention: Duration,
) -> Result<(), ApiError> {
    if ns.require_token {
        return Err(token_required());
    }
    let engine = &app.inner.engine;
    // The claim this node made for the key's token-less start: completed under its token in one
    // store operation, unless it changed hands since.
    if let Some(token) = app.inner.issued.take(&key) {
        match engine
            .finish(&ns.scope, &Claim::new(key, token), bytes.clone())
            .retention(ttl)
            .key_retention(key_retention)
            .await
        {
            Ok(()) => return Ok(()),
            Err(Error::LeaseLost) => {}
            Err(e) => return Err(engine_error(e)),
        }
    }
    // Bounded: each pass meets the key in one state; a key that changes hands under every
    // pass gets `409 conflict`.
    for _ in 0..TOKENLESS_TRIES {
        let claim = match ended(engine.holder(&key).await)? {
            Holder::Completed(_) | Holder::Expired { .. } => return Ok(()),
            Holder::Claimed(claim) => claim,
            Holder::Uncertain { since } => {
                return Err(engine_error(Error::Uncertain {
                    operation: key,
                    since,
                }))
            }
            Holder::Absent => match engine
                .call(key)
                .scope_named(ns.scope.clone())
                .lease(app.inner.config.tokenless_lease)
                .on_lapse(OnLapse::Release)
                .claim()
                .await
            {
                Ok(CallClaim::Claimed(claim)) => claim,
                Ok(CallClaim::Completed(_))
                | Err(
                    Error::ResultNotRetained { .. }
                    | Error::ResultExpired { .. }
                    | Error::Abandoned { .. },
                ) => return Ok(()),
                Err(Error::Locked { .. }) => continue,
                Err(e) => return Err(engine_error(e)),
            },
        };
        match engine
            .finish(&ns.scope, &claim, bytes.clone())
            .retention(ttl)
            .key_retention(key_retention)
            .await
        {
            Ok(()) => return Ok(()),
            Err(Error::LeaseLost) => continue,
            Err(e) => return Err(engine_error(e)),
        }
    }
    Err(changed_hands())
}

/// Who holds a key, for a token-less complete or abort: a completed key whose result cannot be
/// replayed (not retained, resolved as abandoned) is completed all the same.
fn ended(holder: Result<Holder, Error>) -> Result<Holder, ApiError> {
    match holder {
        Ok(holder) => Ok(holder),
        Err(Error::ResultNotRetained { .. } | Error::Abandoned { .. }) => {
            Ok(Holder::Completed(Vec::new()))
        }
        Err(e) => Err(engine_error(e)),
    }
}

fn changed_hands() -> ApiError {
    ApiError::operation(
        StatusCode::CONFLICT,
        "conflict",
        "the key changed hands while this request acted on it; try again",
    )
}

async fn abort(
    app: App,
    caller: Caller,
    input: AbortIn,
    out: Format,
) -> Result<Response, ApiError> {
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
        // response (Diom would delete it), a tombstone stays, and a key nobody holds is left
        // as it is; an uncertain key is refused (`409 uncertain`).
        None => {
            // The claim this node made for the key's token-less start, released under its
            // token, unless it changed hands since.
            let mut released = match app.inner.issued.take(&key) {
                Some(token) => match engine.release(&ns.scope, &Claim::new(key, token)).await {
                    Ok(()) => true,
                    Err(Error::LeaseLost) => false,
                    Err(e) => return Err(engine_error(e)),
                },
                None => false,
            };
            for _ in 0..TOKENLESS_TRIES {
                if released {
                    break;
                }
                match ended(engine.holder(&key).await)? {
                    Holder::Absent | Holder::Completed(_) | Holder::Expired { .. } => {
                        released = true;
                        break;
                    }
                    // Not released: its work may have taken effect. Only a resolution, or its
                    // holder's token, ends it.
                    Holder::Uncertain { since } => {
                        return Err(engine_error(Error::Uncertain {
                            operation: key,
                            since,
                        }))
                    }
                    Holder::Claimed(claim) => match engine.release(&ns.scope, &claim).await {
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
}

async fn renew(
    app: App,
    caller: Caller,
    input: RenewIn,
    out: Format,
) -> Result<Response, ApiError> {
    let claim = app.held(&caller, &input).await?;
    let lease = period(input.lock_period_ms.get(), "lock_period_ms")?;
    app.inner
        .engine
        .renew(&claim, lease)
        .await
        .map_err(engine_error)?;
    Ok(out.respond(StatusCode::OK, &Empty {}))
}

/// The fenced extension's `get`: the caller's key's live record, as a store's `get` answers
/// it, read through the engine.
async fn get_record(
    app: App,
    caller: Caller,
    input: KeyIn,
    out: Format,
) -> Result<Response, ApiError> {
    let (_, key) = app
        .locate(&caller, input.namespace.as_deref(), &input.key)
        .await?;
    let Some(record) = app.inner.engine.record(&key).await.map_err(engine_error)? else {
        return Ok(out.respond(StatusCode::OK, &GetOut::of(GetStatus::Absent)));
    };
    let fingerprint_sha256 = record.fingerprint.map(|f| hex::encode(f.as_bytes()));
    let answer = match record.state {
        RecordState::Uncertain { token, since } => GetOut {
            token: Some(token_text(token)),
            since_ms: Some(unix_ms(since)),
            fingerprint_sha256,
            ..GetOut::of(GetStatus::Uncertain)
        },
        RecordState::Expired { since } => GetOut {
            since_ms: Some(unix_ms(since)),
            fingerprint_sha256,
            ..GetOut::of(GetStatus::Expired)
        },
        RecordState::InProgress { token, lease_until } => GetOut {
            token: Some(token_text(token)),
            lease_until_ms: Some(unix_ms(lease_until)),
            fingerprint_sha256,
            ..GetOut::of(GetStatus::InProgress)
        },
        RecordState::Completed(kept) => {
            let (mut data, mut not_retained, mut abandoned) = (Completed::default(), None, None);
            match kept.result() {
                Ok(bytes) => data = stored(bytes)?,
                Err(Error::ResultNotRetained { reason }) => not_retained = Some(reason),
                Err(Error::Abandoned { reason }) => abandoned = Some(reason),
                Err(e) => return Err(engine_error(e)),
            }
            GetOut {
                fingerprint_sha256,
                expires_at_ms: Some(unix_ms(kept.expires_at)),
                data: Some(data),
                not_retained,
                abandoned,
                ..GetOut::of(GetStatus::Completed)
            }
        }
    };
    Ok(out.respond(StatusCode::OK, &answer))
}

/// The fenced extension's `evict`: deletes the caller's key's record whatever its state (a
/// running claim then gets `stale_holder`), through the engine. A caller reaches only its own
/// key space.
async fn evict(app: App, caller: Caller, input: KeyIn, out: Format) -> Result<Response, ApiError> {
    let (_, key) = app
        .locate(&caller, input.namespace.as_deref(), &input.key)
        .await?;
    let evicted = app.inner.engine.evict(&key).await.map_err(engine_error)?;
    Ok(out.respond(StatusCode::OK, &EvictOut { evicted }))
}

/// The fenced extension's `prune` (admin): deletes up to `limit` ended records of the whole
/// store, every caller's, through the engine. Ended records read as absent to everyone, so
/// pruning changes nothing a caller can see; it is the admin's because it spans key spaces.
async fn prune(
    app: App,
    caller: Caller,
    input: PruneIn,
    out: Format,
) -> Result<Response, ApiError> {
    admin_only(&caller, "prune", "idempotency::*")?;
    let pruned = app
        .inner
        .engine
        .prune_expired(input.limit)
        .await
        .map_err(engine_error)?;
    Ok(out.respond(StatusCode::OK, &PruneOut { pruned }))
}

/// The fenced extension's `steps.begin`: begins (or resumes) the steps of the operation the
/// token holds, through the engine.
async fn begin_steps(
    app: App,
    caller: Caller,
    input: StepsBeginIn,
    out: Format,
) -> Result<Response, ApiError> {
    let claim = app.held(&caller, &input).await?;
    let ttl = period(input.ttl_ms.get(), "ttl_ms")?;
    let log = app
        .inner
        .engine
        .begin_steps(&claim, ttl)
        .await
        .map_err(engine_error)?;
    let steps = log
        .steps
        .into_iter()
        .map(|step| StepOut {
            name: step.name,
            position: step.position,
            result: match step.state {
                StepState::Begun => None,
                StepState::Finished(bytes) => Some(bytes),
            },
        })
        .collect();
    let answer = StepsOut {
        attempt: log.attempt,
        steps,
    };
    Ok(out.respond(StatusCode::OK, &answer))
}

/// The fenced extension's `steps.write`: stores that a step begins, or its result, fenced by
/// the operation's token, through the engine.
async fn write_step(
    app: App,
    caller: Caller,
    input: StepWriteIn,
    out: Format,
) -> Result<Response, ApiError> {
    let claim = app.held(&caller, &input).await?;
    let on_lapse = input.on_lapse.map(on_lapse_of);
    let step = StepWrite {
        name: &input.name,
        position: input.position,
        result: input.result.as_deref(),
        retention: period(input.ttl_ms.get(), "ttl_ms")?,
        on_lapse,
    };
    step.check().map_err(engine_error)?;
    // The key's name is kept before the write makes it uncertain on lapse, so no uncertain
    // key goes unnamed; a step name the engine refuses then changes nothing.
    if on_lapse == Some(OnLapse::Uncertain)
        && !input.name.is_empty()
        && input.name.len() <= idem_core::MAX_STEP_NAME_LEN
    {
        let ns = app
            .inner
            .namespaces
            .resolve(input.namespace.as_deref())
            .await?;
        let name = name_of(&ns, &caller, &input.key);
        uncertain::keep(&app.inner.engine, claim.key(), &name).await?;
    }
    app.inner
        .engine
        .write_step(&claim, step)
        .await
        .map_err(engine_error)?;
    Ok(out.respond(StatusCode::OK, &Empty {}))
}

/// The fenced extension's `uncertain.take`: takes over the caller's uncertain key, fenced by
/// the lapsed claim's token, through the engine; the new claim's token resolves it
/// (`complete`, `abort`) or lapses uncertain again.
async fn take_uncertain(
    app: App,
    caller: Caller,
    input: TakeUncertainIn,
    out: Format,
) -> Result<Response, ApiError> {
    let (_, key) = app
        .locate(&caller, input.namespace.as_deref(), &input.key)
        .await?;
    let token = parse_token(&input.token)?;
    let lease = period(input.lock_period_ms.get(), "lock_period_ms")?;
    let claim = app
        .inner
        .engine
        .take_uncertain(&key, token, lease)
        .await
        .map_err(engine_error)?;
    let answer = TakeUncertainOut {
        token: token_text(claim.token()),
    };
    Ok(out.respond(StatusCode::OK, &answer))
}

/// The fenced extension's `uncertain.find`: up to `limit` of the caller's uncertain keys in
/// the namespace, by key, after `after`, read through the engine's listing and the names the
/// server keeps ([`uncertain`]).
async fn find_uncertain(
    app: App,
    caller: Caller,
    input: FindUncertainIn,
    out: Format,
) -> Result<Response, ApiError> {
    let limit = uncertain::page(input.limit)?;
    let ns = app
        .inner
        .namespaces
        .resolve(input.namespace.as_deref())
        .await?;
    let found = uncertain::find(
        &app.inner.engine,
        &ns.scope,
        &caller.key_space(),
        input.after.as_deref(),
        limit as usize,
    )
    .await?;
    let operations = found
        .into_iter()
        .map(|(key, op)| UncertainOut {
            key,
            token: token_text(op.token),
            since_ms: unix_ms(op.since),
        })
        .collect();
    Ok(out.respond(StatusCode::OK, &FindUncertainOut { operations }))
}

/// The admin's `uncertain.list`: up to `limit` uncertain operations of every caller and
/// namespace, by store key, after `after`, through the engine, each with its name when the
/// server keeps it.
async fn list_uncertain(
    app: App,
    caller: Caller,
    input: ListUncertainIn,
    out: Format,
) -> Result<Response, ApiError> {
    admin_only(&caller, "list", "idempotency::uncertain")?;
    let limit = uncertain::page(input.limit)?;
    let after = input
        .after
        .as_deref()
        .map(|text| uncertain::store_key(text, "after"))
        .transpose()?;
    let engine = &app.inner.engine;
    let query = AbandonedQuery {
        after: after.as_ref(),
        limit,
    };
    let page = engine.uncertain(query).await.map_err(engine_error)?;
    let mut operations = Vec::with_capacity(page.len());
    for op in page {
        let name = uncertain::name_of(engine, &op.key).await?;
        operations.push(ListedUncertain {
            key: hex::encode(op.key.as_bytes()),
            token: token_text(op.token),
            since_ms: unix_ms(op.since),
            namespace: name.as_ref().map(|n| n.namespace.clone()),
            caller: name.as_ref().map(|n| n.caller.clone()),
            client_key: name.map(|n| n.key),
        });
    }
    Ok(out.respond(StatusCode::OK, &ListUncertainOut { operations }))
}

/// The admin's `uncertain.resolve`: resolves an uncertain operation through
/// `Idempotency::resolve` (the key's lapsed token read, the fenced takeover, then the
/// completion or release), for the engine policy's retention and tombstone. A key that is not
/// uncertain (any more) is `409 not_uncertain`, and nothing changes.
async fn resolve_uncertain(
    app: App,
    caller: Caller,
    input: ResolveIn,
    out: Format,
) -> Result<Response, ApiError> {
    admin_only(&caller, "resolve", "idempotency::uncertain")?;
    let key = uncertain::store_key(&input.key, "key")?;
    let engine = &app.inner.engine;
    let refuse = |field: &str, why: &str| Err(ApiError::invalid(field, why));
    let resolution = match input.resolution {
        ResolutionKind::Completed => {
            if input.reason.is_some() {
                return refuse("reason", "a reason is for an abandoned resolution");
            }
            let Some(response) = input.response else {
                return refuse("response", "a completed resolution names its response");
            };
            let retention = engine.policy().retention();
            let record = Completed {
                response,
                context: input.context,
                is_error: false,
                absent: false,
                expires_at_ms: Some(unix_ms(SystemTime::now() + retention)),
            };
            let bytes = msgpack::to_vec(&record).map_err(|e| {
                ApiError::invalid("body", format!("the response cannot be kept: {e}"))
            })?;
            Resolution::Completed(bytes)
        }
        ResolutionKind::Failed | ResolutionKind::Abandoned
            if input.response.is_some() || input.context.is_some() =>
        {
            let field = if input.response.is_some() {
                "response"
            } else {
                "context"
            };
            return refuse(field, "a response is for a completed resolution");
        }
        ResolutionKind::Failed if input.reason.is_some() => {
            return refuse("reason", "a reason is for an abandoned resolution");
        }
        ResolutionKind::Failed => Resolution::Failed,
        ResolutionKind::Abandoned => match input.reason {
            Some(reason) if !reason.is_empty() && reason.len() <= idem_wire::MAX_REASON_LEN => {
                Resolution::Abandoned(reason)
            }
            _ => {
                return refuse(
                    "reason",
                    &format!(
                        "an abandoned resolution says why, in 1 to {} bytes",
                        idem_wire::MAX_REASON_LEN
                    ),
                )
            }
        },
    };
    engine
        .resolve(&key, resolution)
        .await
        .map_err(engine_error)?;
    Ok(out.respond(StatusCode::OK, &Empty {}))
}

/// Refuses a caller token `action` on `resource`, as Diom refuses an operation its role's
/// rules do not allow (`admin/namespace::NAME` for a namespace).
fn admin_only(caller: &Caller, action: &str, resource: &str) -> Result<(), ApiError> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(ApiError::forbidden(action, resource))
    }
}

async fn configure_namespace(
    app: App,
    caller: Caller,
    input: ConfigureNamespaceIn,
    out: Format,
) -> Result<Response, ApiError> {
    admin_only(
        &caller,
        "configure",
        &format!("admin/namespace::{}", input.name),
    )?;
    let ns = app
        .inner
        .namespaces
        .configure(&input.name, input.require_token)
        .await?;
    Ok(out.respond(StatusCode::OK, &ns))
}

async fn get_namespace(
    app: App,
    caller: Caller,
    input: GetNamespaceIn,
    out: Format,
) -> Result<Response, ApiError> {
    admin_only(&caller, "get", &format!("admin/namespace::{}", input.name))?;
    match app.inner.namespaces.get(&input.name).await? {
        Some(ns) => Ok(out.respond(StatusCode::OK, &ns)),
        None => Err(ApiError::not_found()),
    }
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
        None => ApiError::operation(
            StatusCode::NOT_FOUND,
            "not_found",
            "metrics are not enabled on this server",
        )
        .respond(Format::Json),
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
