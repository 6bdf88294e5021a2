//! [`IdempotencyLayer`] and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};

use super::fingerprint::BodyFingerprint;
use super::problem::ProblemConfig;
use crate::capture::reply::Guard;
use crate::capture::{check_builder, CallerFn};
use crate::layer::sealed::Sealed;
use crate::layer::{key_space, Protocol};
use idem_core::adapter::Overrides;
use idem_core::{Codec, Error, Idempotency, JsonCodec, OnLocked};

type StoreIfFn = dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync;

/// Whether the layer stores a response by default: every status but 5xx, `400 Bad Request`,
/// `408 Request Timeout`, `409 Conflict`, `422 Unprocessable Content` and `429 Too Many
/// Requests`. A response that is not stored frees the key, so a retry runs the handler again.
///
/// 5xx, 408, 409 and 429 say "try again" rather than give an answer. 400 and 422 say the request
/// was refused before it did anything (axum's `Json` extractor answers a body that is not JSON
/// with 400, one of the wrong shape with 422): like Stripe, the layer does not keep such a
/// refusal, so the client can correct the request and send it again under the same key. A
/// handler whose 400 or 422 follows a side effect should be stored with
/// [`store_if`](LayerBuilder::store_if).
///
/// ```
/// use idem::http::stores_by_default;
/// use http::StatusCode;
/// assert!(stores_by_default(StatusCode::CREATED));
/// assert!(stores_by_default(StatusCode::NOT_FOUND));
/// assert!(!stores_by_default(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!stores_by_default(StatusCode::BAD_REQUEST));
/// assert!(!stores_by_default(StatusCode::SERVICE_UNAVAILABLE));
/// assert!(!stores_by_default(StatusCode::TOO_MANY_REQUESTS));
/// ```
pub fn stores_by_default(status: StatusCode) -> bool {
    !(status.is_server_error()
        || status == StatusCode::BAD_REQUEST
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::CONFLICT
        || status == StatusCode::UNPROCESSABLE_ENTITY
        || status == StatusCode::TOO_MANY_REQUESTS)
}

/// The checked configuration every [`IdempotencyService`] of one layer shares.
pub struct Config<C> {
    /// The engine, the call options and the scope.
    pub(crate) guard: Guard<C>,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) accept_bare_keys: bool,
    /// The caller extractor. `None` is the one shared key space, which
    /// [`LayerBuilder::build`] allows only after [`LayerBuilder::shared_key_space`].
    pub(crate) caller: Option<Box<CallerFn>>,
    pub(crate) fingerprint: BodyFingerprint,
    pub(crate) store_if: Arc<StoreIfFn>,
    pub(crate) max_request: usize,
    pub(crate) problems: ProblemConfig,
}

/// A tower [`Layer`](tower::Layer) that makes `POST` and `PATCH` (by default) requests carrying an
/// `Idempotency-Key` header run once: a retry gets the stored response, marked
/// `Idempotent-Replayed: true`. See the [module documentation](super) for the exact behaviour.
///
/// Works with every store: it only needs an [`Idempotency`] engine, whose policy gives the
/// default lease, retention, wait behaviour and the largest stored response
/// ([`Policy::max_response_bytes`](idem_core::Policy::max_response_bytes)).
///
/// A layer is built with [`builder`](Self::builder), and [`build`](LayerBuilder::build) needs
/// one decision that has no safe default: whose keys are whose. Either keys are scoped by a
/// [`caller`](LayerBuilder::caller) identity, or the layer is told to use
/// [`shared_key_space`](LayerBuilder::shared_key_space). There is no `IdempotencyLayer::new`:
/// a constructor that cannot fail would have to pick one of the two for you, and the only one
/// it could pick without knowing your authentication lets a client replay another's responses.
///
/// axum's `Router::layer` wraps the routes the router has when it is called: **a route added
/// after `.layer(…)` is not guarded**, and nothing says so. Its requests run every time, and
/// an [`IdempotencyKey`](super::IdempotencyKey) extractor there answers `500`
/// ([`Problem::KeyUnguarded`](super::Problem::KeyUnguarded)) whose detail names this cause.
/// Add every route first, then the layer.
///
/// ```
/// use axum::{routing::post, Router};
/// use idem::http::IdempotencyLayer;
/// use idem::{Idempotency, MemoryStore};
///
/// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
///     .build()?;
/// let app: Router = Router::new()
///     .route("/payments", post(|| async { "created" }))
///     .route("/refunds", post(|| async { "refunded" }))
///     // Wraps the two routes above; a route added below this line would not be guarded.
///     .layer(layer);
/// # let _ = app;
/// # Ok::<(), idem::Error>(())
/// ```
///
/// This is the layer generic over the protocol, [`IdempotencyLayer<Http, C>`](crate::IdempotencyLayer),
/// for HTTP: its builder and setters are the HTTP layer's.
pub type IdempotencyLayer<C = JsonCodec> = crate::IdempotencyLayer<Http, C>;

/// The HTTP protocol of an [`IdempotencyLayer`]: its configuration and its service.
#[derive(Debug, Clone, Copy)]
pub enum Http {}

impl Sealed for Http {}

impl Protocol for Http {
    type Config<C> = Config<C>;
    const SERVICE: &'static str = "IdempotencyService";
}

impl<C> fmt::Debug for Config<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("scope", &self.guard.scope)
            .field("methods", &self.methods)
            .field("require_key", &self.require_key)
            .field("accept_bare_keys", &self.accept_bare_keys)
            .field("callers", &key_space(self.caller.is_some()))
            .field("fingerprint", &self.fingerprint)
            .field("options", &self.guard.options)
            .field("max_request_body", &self.max_request)
            .field("problems", &self.problems)
            .finish_non_exhaustive()
    }
}

impl<C: Codec> IdempotencyLayer<C> {
    /// A [`LayerBuilder`] with the defaults. Before [`build`](LayerBuilder::build) it needs
    /// [`caller`](LayerBuilder::caller) or [`shared_key_space`](LayerBuilder::shared_key_space).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::http::IdempotencyLayer;
    /// use idem::{Idempotency, MemoryStore};
    /// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
    ///     .require_key(true)
    ///     .retention(Duration::from_secs(24 * 3600))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn builder(engine: Idempotency<C>) -> LayerBuilder<C> {
        LayerBuilder::new(engine)
    }
}

/// Configures an [`IdempotencyLayer`]. Defaults:
///
/// | setting | default |
/// |---|---|
/// | [`methods`](Self::methods) | `POST`, `PATCH` |
/// | [`require_key`](Self::require_key) | `false`: a request without the header runs unguarded |
/// | [`accept_bare_keys`](Self::accept_bare_keys) | `true`: `abc` and `"abc"` are the same key; `false` is the draft's strict form |
/// | [`scope`](Self::scope) | `"http"` |
/// | [`caller`](Self::caller) or [`shared_key_space`](Self::shared_key_space) | none: [`build`](Self::build) refuses until one is chosen |
/// | [`caller_missing_status`](Self::caller_missing_status) | `401 Unauthorized`, without [`www_authenticate`](Self::www_authenticate) |
/// | [`fingerprint`](Self::fingerprint) | method, path and query, body bytes |
/// | [`lease`](Self::lease), [`retention`](Self::retention), [`on_locked`](Self::on_locked) | the engine's policy (30 s, 24 h, fail fast) |
/// | [`store_if`](Self::store_if) | [`stores_by_default`] |
/// | [`max_request_body`](Self::max_request_body) | 1 MiB |
/// | [`problem_base`](Self::problem_base) | none: problem `type`s link to docs.rs, no `Link` header |
///
/// ```
/// use std::time::Duration;
/// use http::Method;
/// use idem::http::{BodyFingerprint, IdempotencyLayer};
/// use idem::{Idempotency, MemoryStore, OnLocked};
///
/// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
///     .methods([Method::POST])
///     .require_key(true)
///     .scope("payments-api")
///     // Keys are per API key: two clients never see each other's responses.
///     .caller(|parts| {
///         let key = parts.headers.get("x-api-key")?.to_str().ok()?;
///         Some(key.to_owned())
///     })
///     .fingerprint(BodyFingerprint::Json)
///     .lease(Duration::from_secs(10))
///     .on_locked(OnLocked::Wait { timeout: Duration::from_secs(5) })
///     .store_if(|status, _headers| status.is_success())
///     .max_request_body(64 * 1024)
///     .problem_base("https://api.example.com/docs/idempotency")
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), idem::Error>(())
/// ```
pub struct LayerBuilder<C = JsonCodec> {
    config: Config<C>,
    /// Whether [`shared_key_space`](Self::shared_key_space) was called.
    shared_key_space: bool,
}

impl<C> fmt::Debug for LayerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerBuilder")
            .field("config", &self.config)
            .field("shared_key_space", &self.shared_key_space)
            .finish()
    }
}

impl<C: Codec> LayerBuilder<C> {
    fn new(engine: Idempotency<C>) -> LayerBuilder<C> {
        LayerBuilder {
            config: Config {
                guard: Guard {
                    engine,
                    options: Overrides::default(),
                    scope: Arc::from("http"),
                },
                methods: vec![Method::POST, Method::PATCH],
                require_key: false,
                accept_bare_keys: true,
                caller: None,
                fingerprint: BodyFingerprint::default(),
                store_if: Arc::new(|status, _: &HeaderMap| stores_by_default(status)),
                max_request: 1 << 20,
                problems: ProblemConfig::default(),
            },
            shared_key_space: false,
        }
    }

    /// The methods the layer guards; requests with other methods pass through untouched (their
    /// `Idempotency-Key` is ignored). Default `POST` and `PATCH`.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// use http::Method;
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .methods([Method::POST, Method::PUT, Method::DELETE]);
    /// # let _ = b;
    /// ```
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a guarded request without an `Idempotency-Key` gets `400` ([`true`]) or runs
    /// without deduplication (`false`, the default).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new())).require_key(true);
    /// # let _ = b;
    /// ```
    pub fn require_key(mut self, required: bool) -> Self {
        self.config.require_key = required;
        self
    }

    /// Whether to accept an unquoted key such as `Idempotency-Key: 8e03978e-40d5-…`, as Stripe
    /// and most existing clients send it. Default `true`: an unquoted key must be 1 to 255
    /// visible ASCII characters, and `abc` and `"abc"` name the same key (the same record). A
    /// key that holds a space is sent quoted (`"order 42"`): HTTP strips the spaces around a
    /// field value, so an unquoted key cannot carry one, and gets `400`.
    ///
    /// `false` is the strict mode: the draft standard makes the value a structured-field string
    /// (`Idempotency-Key: "8e03978e-40d5-…"`), and an unquoted key gets `400`
    /// ([`Problem::KeyMalformed`](super::Problem::KeyMalformed)). Either way a quoted key is read
    /// the same, so switching modes keeps every stored response.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// // Strict: only `Idempotency-Key: "…"`.
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new())).accept_bare_keys(false);
    /// # let _ = b;
    /// ```
    pub fn accept_bare_keys(mut self, accept: bool) -> Self {
        self.config.accept_bare_keys = accept;
        self
    }

    /// The name under which this layer's keys are stored (1 to 255 printable ASCII characters),
    /// so several APIs can share one store. Default `"http"`. Renaming it forgets every stored
    /// response.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new())).scope("billing-v2");
    /// # let _ = b;
    /// ```
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.config.guard.scope = Arc::from(scope.into());
        self
    }

    /// Who is asking, from the request head: an API key id, a user id, or an extension an
    /// authentication layer put there. Keys are scoped by it, so two callers sending the same
    /// key and body get independent results, each from its own run of the handler.
    ///
    /// The extractor runs for each guarded request that carries an `Idempotency-Key`. When it
    /// returns `None` the request gets [`Problem::CallerMissing`](super::Problem::CallerMissing)
    /// (`401`, or `400` by [`caller_missing_status`](Self::caller_missing_status)) and nothing
    /// runs; there is no anonymous key space to fall back to. The identity must be 1 to 255
    /// bytes of printable ASCII (hash longer ones yourself); any other gets
    /// [`Problem::CallerInvalid`](super::Problem::CallerInvalid) (`400`). Add this layer inside
    /// (after) the authentication layer, so the identity is set and checked when the extractor
    /// runs. Not together with [`shared_key_space`](Self::shared_key_space).
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
        self.config.caller = Some(Box::new(extract));
        self
    }

    /// Opts in to one key space shared by every client, instead of a [`caller`](Self::caller)
    /// extractor.
    ///
    /// **What it risks:** the record of a request is found by its `Idempotency-Key` alone, so
    /// any client that learns another client's key and sends the same method, path and body
    /// (the [fingerprint](Self::fingerprint)) gets that client's stored response: status,
    /// headers (`Set-Cookie` and `Location` included) and body, for as long as the response is
    /// [retained](Self::retention); and while the first request runs, it gets `409` for it. A
    /// key that a client sends with a different body gets `422` even if the key is another
    /// client's. Use it only where every client is equally trusted with every response: one
    /// client (a single backend calling a service), or responses that hold nothing private.
    ///
    /// Not together with [`caller`](Self::caller): [`build`](Self::build) refuses both.
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

    /// The status of [`Problem::CallerMissing`](super::Problem::CallerMissing), the answer to a
    /// request whose [`caller`](Self::caller) identity is missing: `401 Unauthorized` (the
    /// default) or `400 Bad Request`; [`build`](Self::build) refuses any other. RFC 9110 wants a
    /// `401` to carry a `WWW-Authenticate` challenge: give yours with
    /// [`www_authenticate`](Self::www_authenticate), or choose `400` if your API has none.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// use http::StatusCode;
    /// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .caller(|parts| Some(parts.headers.get("x-tenant")?.to_str().ok()?.to_owned()))
    ///     .caller_missing_status(StatusCode::BAD_REQUEST)
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn caller_missing_status(mut self, status: StatusCode) -> Self {
        self.config.problems.caller_missing_status = status;
        self
    }

    /// The `WWW-Authenticate` challenge sent with the `401` for a missing caller identity, such
    /// as `Bearer realm="payments"`. Only with the `401` status of
    /// [`caller_missing_status`](Self::caller_missing_status).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// use http::HeaderValue;
    /// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
    ///     .www_authenticate(HeaderValue::from_static(r#"ApiKey realm="payments""#))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn www_authenticate(mut self, challenge: HeaderValue) -> Self {
        self.config.problems.www_authenticate = Some(challenge);
        self
    }

    /// Where the API documents its idempotency behaviour (the IETF draft asks for such a page):
    /// an absolute `http` or `https` URI without a fragment. The layer's problem responses then
    /// carry `type: "{base}#{slug}"` (the [`Problem::slug`](super::Problem::slug), such as
    /// `https://api.example.com/docs/idempotency#key-in-flight`) and
    /// `Link: <{base}>; rel="describedby"`. One page with one anchor per problem is all the
    /// documentation site needs. Without it, `type` links to the [`Problem`](super::Problem)
    /// variant on docs.rs and no `Link` is sent.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
    ///     .problem_base("https://api.example.com/docs/idempotency")
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn problem_base(mut self, base: impl Into<String>) -> Self {
        self.config.problems.base = Some(base.into());
        self
    }

    /// Which view of the body the request fingerprint covers (always with the method, path and
    /// query). Default [`BodyFingerprint::Bytes`].
    ///
    /// ```
    /// # use idem::{http::{BodyFingerprint, IdempotencyLayer}, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .fingerprint(BodyFingerprint::JsonFields(vec!["/amount".into()]));
    /// # let _ = b;
    /// ```
    pub fn fingerprint(mut self, fingerprint: BodyFingerprint) -> Self {
        self.config.fingerprint = fingerprint;
        self
    }

    /// How long a request's claim blocks its key without a heartbeat; the engine renews it while
    /// the handler runs. Overrides [`Policy::lease`](idem_core::Policy::lease).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .lease(std::time::Duration::from_secs(5));
    /// # let _ = b;
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.guard.options = self.config.guard.options.lease(lease);
        self
    }

    /// How long a stored response is replayed, counted from when it was stored. Overrides
    /// [`Policy::retention`](idem_core::Policy::retention). This is the key expiry policy the IETF
    /// draft asks an API to publish: after it, the record may be pruned at any time and the key
    /// counts as new, so a request with it runs the handler again.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .retention(std::time::Duration::from_secs(7 * 24 * 3600));
    /// # let _ = b;
    /// ```
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.guard.options = self.config.guard.options.retention(retention);
        self
    }

    /// What a request does while another with the same key runs: answer `409` with
    /// `Retry-After` at once ([`OnLocked::FailFast`](idem_core::OnLocked::FailFast)), or wait for it and replay its response
    /// ([`OnLocked::Wait`](idem_core::OnLocked::Wait), `409` if the wait times out). Overrides
    /// [`Policy::on_locked`](idem_core::Policy::on_locked).
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore, OnLocked};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .on_locked(OnLocked::Wait { timeout: std::time::Duration::from_secs(10) });
    /// # let _ = b;
    /// ```
    pub fn on_locked(mut self, on_locked: OnLocked) -> Self {
        self.config.guard.options = self.config.guard.options.on_locked(on_locked);
        self
    }

    /// Which handler responses are stored and replayed, by status and headers. A response that
    /// is not stored goes to the client as it is and frees the key, so a retry runs the handler
    /// again. Default [`stores_by_default`]. Exclude streaming responses here (for instance
    /// `text/event-stream`): a stored response is read whole before it is sent.
    ///
    /// ```
    /// # use idem::{http::{stores_by_default, IdempotencyLayer}, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .store_if(|status, headers| {
    ///         stores_by_default(status)
    ///             && headers.get("content-type").map_or(true, |v| v != "text/event-stream")
    ///     });
    /// # let _ = b;
    /// ```
    pub fn store_if(
        mut self,
        predicate: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.config.store_if = Arc::new(predicate);
        self
    }

    /// The largest request body the layer reads to fingerprint it, in bytes; a guarded request
    /// with a key and a larger body gets `413` and nothing runs or is stored. Default 1 MiB.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .max_request_body(256 * 1024);
    /// # let _ = b;
    /// ```
    pub fn max_request_body(mut self, limit: usize) -> Self {
        self.config.max_request = limit;
        self
    }

    /// Checks the configuration and builds the layer. [`Error::InvalidConfig`] when: neither
    /// [`caller`](Self::caller) nor [`shared_key_space`](Self::shared_key_space) was chosen, or
    /// both; the scope is not a valid key part; the lease or retention is out of range; the
    /// [`caller_missing_status`](Self::caller_missing_status) is not 400 or 401, or is 400 with
    /// a [`www_authenticate`](Self::www_authenticate) challenge; the
    /// [`problem_base`](Self::problem_base) is not an absolute `http(s)` URI without a fragment.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore, Error};
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let undecided = IdempotencyLayer::builder(engine.clone()).build();
    /// assert!(matches!(undecided, Err(Error::InvalidConfig(m)) if m.contains("shared_key_space()")));
    /// let bad = IdempotencyLayer::builder(engine).shared_key_space().scope("").build();
    /// assert!(matches!(bad, Err(Error::InvalidConfig(_))));
    /// ```
    pub fn build(mut self) -> Result<IdempotencyLayer<C>, Error> {
        check_builder(
            "HTTP",
            "Idempotency-Keys",
            "body",
            self.config.caller.is_some(),
            self.shared_key_space,
            &self.config.guard.scope,
            &self.config.guard.options,
        )?;
        check_problems(&mut self.config.problems)?;
        Ok(IdempotencyLayer::from_config(self.config))
    }
}

/// Checks what [`LayerBuilder`] was told about problem responses, and prepares the `Link`.
fn check_problems(problems: &mut ProblemConfig) -> Result<(), Error> {
    let status = problems.caller_missing_status;
    if status != StatusCode::UNAUTHORIZED && status != StatusCode::BAD_REQUEST {
        return Err(Error::InvalidConfig(format!(
            "HTTP layer caller_missing_status is {status}; use 401 Unauthorized (the default) \
             or 400 Bad Request"
        )));
    }
    if status != StatusCode::UNAUTHORIZED && problems.www_authenticate.is_some() {
        return Err(Error::InvalidConfig(
            "HTTP layer www_authenticate is sent only with 401, but caller_missing_status is \
             400; remove one of them"
                .to_owned(),
        ));
    }
    if let Some(base) = &problems.base {
        let bad = |why: &str| {
            Error::InvalidConfig(format!(
                "HTTP layer problem_base {base:?} {why}; give the absolute address of your \
                 idempotency documentation, e.g. \"https://api.example.com/docs/idempotency\""
            ))
        };
        // `http::Uri` drops a fragment silently, and lets through characters (`"`, `<`, `>`)
        // that RFC 3986 refuses and that would break the `Link` header: check both first.
        if base.contains('#') {
            return Err(bad("has a fragment, and the layer adds one per problem"));
        }
        let uri_char = |c: char| c.is_ascii_alphanumeric() || "-._~:/?[]@!$&'()*+,;=%".contains(c);
        if let Some(c) = base.chars().find(|&c| !uri_char(c)) {
            return Err(bad(&format!(
                "holds {c:?}, which a URI holds only percent-encoded"
            )));
        }
        let uri: Uri = base.parse().map_err(|_| bad("is not a URI"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(bad("is not an absolute http or https URI"));
        }
        let link = HeaderValue::try_from(format!("<{base}>; rel=\"describedby\""))
            .map_err(|_| bad("cannot be sent in a Link header"))?;
        problems.link = Some(link);
    }
    Ok(())
}
