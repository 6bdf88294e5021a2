//! [`IdempotencyLayer`] and its builder.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};

use super::fingerprint::BodyFingerprint;
use super::problem::ProblemConfig;
use super::replay_headers::ReplayHeaders;
use crate::layer::sealed::Sealed;
use crate::layer::{Common, Protocol};
use idem_core::{Codec, Error, Idempotency, JsonCodec};

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

/// The checked configuration every [`IdempotencyService`](super::IdempotencyService) of one
/// layer shares: what both protocols have, and HTTP's own settings.
pub struct Config<C> {
    pub(crate) common: Common<C>,
    pub(crate) http: Settings,
}

/// The HTTP layer's own settings, as its builder's setters leave them (checked by
/// [`LayerBuilder::build`]).
pub struct Settings {
    pub(crate) methods: Vec<Method>,
    pub(crate) accept_bare_keys: bool,
    pub(crate) fingerprint: BodyFingerprint,
    pub(crate) store_if: Arc<StoreIfFn>,
    pub(crate) problems: ProblemConfig,
    /// As set; [`LayerBuilder::build`] checks it into the guard's header rule.
    pub(crate) replay_headers: ReplayHeaders,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("methods", &self.methods)
            .field("accept_bare_keys", &self.accept_bare_keys)
            .field("fingerprint", &self.fingerprint)
            .field("problems", &self.problems)
            .field("replay_headers", &self.replay_headers)
            .finish_non_exhaustive()
    }
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
    type Settings = Settings;
    const SERVICE: &'static str = "IdempotencyService";
    const BUILDER: &'static str = "LayerBuilder";
    const WORDS: [&'static str; 3] = ["HTTP", "Idempotency-Keys", "body"];
}

impl<C> fmt::Debug for Config<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.common
            .fields(&mut f.debug_struct("IdempotencyLayer"))
            .field("methods", &self.http.methods)
            .field("accept_bare_keys", &self.http.accept_bare_keys)
            .field("fingerprint", &self.http.fingerprint)
            .field("max_request_body", &self.common.max_request)
            .field("problems", &self.http.problems)
            .field("replay_headers", &self.http.replay_headers)
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
        LayerBuilder::with(
            engine,
            "http",
            1 << 20,
            Settings {
                methods: vec![Method::POST, Method::PATCH],
                accept_bare_keys: true,
                fingerprint: BodyFingerprint::default(),
                store_if: Arc::new(|status, _: &HeaderMap| stores_by_default(status)),
                problems: ProblemConfig::default(),
                replay_headers: ReplayHeaders::default(),
            },
        )
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
/// | [`on_lapse`](Self::on_lapse) | the engine's policy (`OnLapse::Release`: a lapsed claim frees its key) |
/// | [`policy_version`](Self::policy_version) | derived from [`fingerprint`](Self::fingerprint) ([`BodyFingerprint::version`]) |
/// | [`store_if`](Self::store_if) | [`stores_by_default`] |
/// | [`max_request_body`](Self::max_request_body) | 1 MiB |
/// | [`replay_headers`](Self::replay_headers) | every end-to-end header but [`ReplayHeaders::DEFAULT_DENIED`] (`Set-Cookie`, `Date`, `Age`, rate-limit headers, `Retry-After`, request and trace ids, `Server-Timing`) |
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
///
/// This is the builder generic over the protocol,
/// [`LayerBuilder<Http, C>`](crate::LayerBuilder), for HTTP: the setters both protocols have
/// are written there, HTTP's own here.
pub type LayerBuilder<C = JsonCodec> = crate::LayerBuilder<Http, C>;

impl<C: Codec> LayerBuilder<C> {
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
        self.settings.methods = methods.into_iter().collect();
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
        self.settings.accept_bare_keys = accept;
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
        self.settings.problems.caller_missing_status = status;
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
        self.settings.problems.www_authenticate = Some(challenge);
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
        self.settings.problems.base = Some(base.into());
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
        self.settings.fingerprint = fingerprint;
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
        self.settings.store_if = Arc::new(predicate);
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
        self.common.max_request = limit;
        self
    }

    /// Which end-to-end response headers are stored with a response, and so replayed: a
    /// [`ReplayHeaders`] deny or allow list. Default [`ReplayHeaders::default()`], every header
    /// but those that describe the first exchange ([`ReplayHeaders::DEFAULT_DENIED`]:
    /// `Set-Cookie`, `Date`, `Age`, the rate-limit headers, `Retry-After`, request and trace
    /// ids, `Server-Timing`). The first client always gets every header; hop-by-hop headers are
    /// never stored; a replay always carries `idempotent-replayed: true`. The rule also applies
    /// when a stored response is replayed, so narrowing it holds for responses stored before.
    /// [`build`](Self::build) refuses a name that is not a header name, and a hop-by-hop one in
    /// an allow list.
    ///
    /// ```
    /// # use idem::{http::{IdempotencyLayer, ReplayHeaders}, Idempotency, MemoryStore};
    /// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
    ///     .replay_headers(ReplayHeaders::allow(["Content-Type", "Location", "ETag"]))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn replay_headers(mut self, rule: ReplayHeaders) -> Self {
        self.settings.replay_headers = rule;
        self
    }

    /// Checks the configuration and builds the layer. [`Error::InvalidConfig`] when: neither
    /// [`caller`](Self::caller) nor [`shared_key_space`](Self::shared_key_space) was chosen, or
    /// both; the scope is not a valid key part; the lease or retention is out of range; the
    /// [`caller_missing_status`](Self::caller_missing_status) is not 400 or 401, or is 400 with
    /// a [`www_authenticate`](Self::www_authenticate) challenge; the
    /// [`problem_base`](Self::problem_base) is not an absolute `http(s)` URI without a fragment;
    /// a name in [`replay_headers`](Self::replay_headers) is not a header name, or is a
    /// hop-by-hop one in an allow list.
    ///
    /// ```
    /// # use idem::{http::IdempotencyLayer, Idempotency, MemoryStore, Error};
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let undecided = IdempotencyLayer::builder(engine.clone()).build();
    /// assert!(matches!(undecided, Err(Error::InvalidConfig(m)) if m.contains("shared_key_space()")));
    /// let bad = IdempotencyLayer::builder(engine).shared_key_space().scope("").build();
    /// assert!(matches!(bad, Err(Error::InvalidConfig(_))));
    /// ```
    pub fn build(self) -> Result<IdempotencyLayer<C>, Error> {
        let (mut common, mut http) = self.checked()?;
        check_problems(&mut http.problems)?;
        common.guard.headers = Arc::new(http.replay_headers.check()?);
        let derived = http.fingerprint.version();
        common.guard.policy.get_or_insert(derived);
        Ok(IdempotencyLayer::from_config(Config { common, http }))
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
