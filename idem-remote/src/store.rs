//! [`RemoteStore`]: a [`Store`] that is an idem-server, reached over HTTP through the server's
//! fenced extension of Diom's protocol (docs/server.md, "RemoteStore").

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_wire::{
    hex, msgpack, route, AbortIn, CompleteIn, Completed, Empty, ErrorBody, ErrorType, EvictOut,
    FindUncertainIn, FindUncertainOut, GetOut, GetStatus, KeyIn, PruneIn, PruneOut, RenewIn,
    StartIn, StartOut, StartStatus, StepWriteIn, StepsBeginIn, StepsOut, TakeUncertainIn,
    TakeUncertainOut,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use idem_core::store::support;
use idem_core::{
    AbandonedQuery, Claim, ClaimOutcome, ClaimRequest, Completion, Error, Fingerprint, Key,
    ListQuery, OnLapse, Record, RecordState, StepLog, StepRecord, StepState, StepWrite, Store,
    StoreAdmin, StoreError, StoreErrorKind, StoreStats, StoredResult, Token, UncertainOperation,
};

/// A [`Store`] kept by an idem-server: every operation is one request to the server's fenced
/// routes (MessagePack over HTTP/1.1, pooled keep-alive connections), and the server runs it
/// on its own store through its engine. A Rust service then uses `#[idempotent]`, the HTTP
/// and gRPC layers and the consumers with the server as its store, beside services in other
/// languages that use Diom's clients.
///
/// | `Store` method | route | the server's engine call |
/// |---|---|---|
/// | `start` | `start` (fenced, `fingerprint_sha256`, `on_lapse`) | `Call::claim` with `Call::on_lapse`; a `locked` answer reads the record once more for the lease left |
/// | `complete` | `complete` (fenced, with `is_error`, `absent`, `observed`, `key_retention_ms`) | `Idempotency::finish` with `Finish::observed(true)` and `Finish::key_retention` |
/// | `abort` | `abort` (fenced) | `Idempotency::release` |
/// | `renew` | `renew` | `Idempotency::renew` |
/// | `get` | `get` | `Idempotency::record` |
/// | `evict` | `evict` | `Idempotency::evict` |
/// | `prune_expired` | `prune` (admin token) | `Idempotency::prune_expired` |
/// | `begin_steps`, `write_step` | `steps.begin`, `steps.write` (with `on_lapse`) | `Idempotency::begin_steps`, `write_step` |
/// | `take_uncertain` | `uncertain.take` | `Idempotency::take_uncertain` |
/// | `find_uncertain` | `uncertain.find` (pages of at most 1,000) | `Idempotency::uncertain`, with the names the server keeps of its keys |
///
/// A key is sent as its 64 hexadecimal digits, in the namespace the store is built with, in
/// the key space of its bearer token: two services with different tokens never share a key.
/// The server keeps the rules of its own store (fencing, fingerprints, lease and retention on
/// the store's clock); what a server failure loses is what its store loses.
///
/// Errors, from the server's answers: `409 stale_holder` is [`Error::LeaseLost`], `422
/// fingerprint_mismatch` [`Error::KeyReused`], `422 policy_changed` [`Error::PolicyChanged`],
/// `409 not_uncertain` [`Error::NotUncertain`], `409 abandoned` [`Error::Abandoned`] (a key the
/// server's admin resolved so), `422 invalid_data` and `400 invalid_encoding`
/// [`Error::InvalidConfig`] (at `name`, [`Error::InvalidStep`]), `501 steps_unsupported`
/// [`Error::StepsUnsupported`], `503` and a server that cannot be reached or does not answer
/// within the timeout a store error of kind [`Unavailable`](StoreErrorKind::Unavailable)
/// (whether the request took effect is unknown, as for any store), `500 corrupt`
/// [`Corrupt`](StoreErrorKind::Corrupt), `401` and `403` (a token the server does not know, a
/// caller token on `prune`) [`Unauthorized`](StoreErrorKind::Unauthorized), naming the
/// server, which the engine does not retry; any other refusal (an unknown namespace)
/// [`Query`](StoreErrorKind::Query) with the server's detail. Plain `http://` only: put TLS in front of the server on the
/// network path (a sidecar or a mesh) where it leaves the host.
///
/// ```no_run
/// use idem::{Idempotency, Key, RemoteStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let store = RemoteStore::builder("http://idem-server:8624", "billing-token-0123456789")
///     .namespace("payments")
///     .build()?;
/// let idem = Idempotency::new(store);
/// let key = Key::derive("charge", "", "order-1")?;
/// let receipt = idem.call(key).run(async { Ok::<_, idem::Error>(42) }).await?;
/// assert_eq!(receipt.into_inner(), 42);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RemoteStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client<HttpConnector, Full<Bytes>>,
    /// `http://host:port` and any path prefix, without a trailing slash.
    base: String,
    authorization: HeaderValue,
    namespace: Option<String>,
    timeout: Duration,
    max_response_bytes: usize,
}

impl fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteStore")
            .field("server", &self.inner.base)
            .field("namespace", &self.inner.namespace)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RemoteStore`]: [`RemoteStore::builder`].
///
/// ```
/// use std::time::Duration;
/// use idem::RemoteStore;
/// let store = RemoteStore::builder("http://127.0.0.1:8624", "a-caller-token-0123456789")
///     .namespace("payments")
///     .timeout(Duration::from_secs(5))
///     .build()?;
/// # let _ = store; Ok::<(), idem::Error>(())
/// ```
#[derive(Clone)]
pub struct RemoteStoreBuilder {
    server: String,
    token: String,
    namespace: Option<String>,
    timeout: Duration,
    max_response_bytes: usize,
}

impl fmt::Debug for RemoteStoreBuilder {
    /// Without the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteStoreBuilder")
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

impl RemoteStore {
    /// A builder for the store kept by the idem-server at `server` (`http://HOST:PORT`, and a
    /// path prefix if a proxy adds one), authenticated by `token` (a caller token, or the admin
    /// token, which alone may [`prune`](Store::prune_expired)).
    ///
    /// ```
    /// let builder = idem::RemoteStore::builder("http://127.0.0.1:8624", "a-caller-token-0123456789");
    /// # let _ = builder;
    /// ```
    pub fn builder(server: impl Into<String>, token: impl Into<String>) -> RemoteStoreBuilder {
        RemoteStoreBuilder {
            server: server.into(),
            token: token.into(),
            namespace: None,
            timeout: RemoteStoreBuilder::DEFAULT_TIMEOUT,
            max_response_bytes: RemoteStoreBuilder::DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// The server's address, as built.
    ///
    /// ```
    /// let store = idem::RemoteStore::builder("http://127.0.0.1:8624/", "a-caller-token-0123456789").build()?;
    /// assert_eq!(store.server(), "http://127.0.0.1:8624");
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn server(&self) -> &str {
        &self.inner.base
    }
}

impl RemoteStoreBuilder {
    /// How long a request may take before it is given up as
    /// [`Unavailable`](StoreErrorKind::Unavailable): 35 s, past the server's own request
    /// timeout (30 s by default), so that the server's answer arrives first.
    ///
    /// ```
    /// use idem::RemoteStoreBuilder;
    /// assert_eq!(RemoteStoreBuilder::DEFAULT_TIMEOUT, std::time::Duration::from_secs(35));
    /// ```
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(35);

    /// The shortest token idem-server takes (its `--admin-token` and `--caller-token`
    /// minimum): [`build`](Self::build) refuses a shorter one, which no server can know.
    ///
    /// ```
    /// assert_eq!(idem::RemoteStoreBuilder::MIN_TOKEN_LEN, 16);
    /// ```
    pub const MIN_TOKEN_LEN: usize = 16;

    /// The largest response the store hands the server unless set: idem-server's default
    /// `--max-body-bytes` (16 MiB) less 4 KiB for the rest of a `complete` request (its key,
    /// namespace and token).
    ///
    /// ```
    /// assert_eq!(idem::RemoteStoreBuilder::DEFAULT_MAX_RESPONSE_BYTES, (16 << 20) - 4096);
    /// ```
    pub const DEFAULT_MAX_RESPONSE_BYTES: usize = (16 << 20) - 4096;

    /// The namespace the keys live in; the server's `default` unless set.
    ///
    /// ```
    /// let b = idem::RemoteStore::builder("http://127.0.0.1:8624", "a-caller-token-0123456789").namespace("payments");
    /// # let _ = b;
    /// ```
    pub fn namespace(mut self, namespace: impl Into<String>) -> RemoteStoreBuilder {
        self.namespace = Some(namespace.into());
        self
    }

    /// How long a request may take ([`DEFAULT_TIMEOUT`](Self::DEFAULT_TIMEOUT) unless set).
    ///
    /// ```
    /// let b = idem::RemoteStore::builder("http://127.0.0.1:8624", "a-caller-token-0123456789")
    ///     .timeout(std::time::Duration::from_secs(5));
    /// # let _ = b;
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> RemoteStoreBuilder {
        self.timeout = timeout;
        self
    }

    /// The largest stored response the server takes in a `complete`: its `--max-body-bytes`
    /// less 4 KiB ([`DEFAULT_MAX_RESPONSE_BYTES`](Self::DEFAULT_MAX_RESPONSE_BYTES) unless
    /// set). It is the store's [`Store::max_response_bytes`]: an engine keeps a larger result
    /// as "completed, result not retained" (a retry gets
    /// [`Error::ResultNotRetained`], never a second run) instead of sending what the server
    /// would refuse with `413` after the work has run.
    ///
    /// ```
    /// use idem::Store;
    /// // A server started with --max-body-bytes 1048576.
    /// let store = idem::RemoteStore::builder("http://127.0.0.1:8624", "a-caller-token-0123456789")
    ///     .max_response_bytes((1 << 20) - 4096)
    ///     .build()?;
    /// assert_eq!(store.max_response_bytes(), Some((1 << 20) - 4096));
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn max_response_bytes(mut self, limit: usize) -> RemoteStoreBuilder {
        self.max_response_bytes = limit;
        self
    }

    /// The store. Nothing is sent yet: a server that cannot be reached shows at the first
    /// call. [`Error::InvalidConfig`] for an address that is not `http://HOST[:PORT][/PATH]`, a
    /// token shorter than [`MIN_TOKEN_LEN`](Self::MIN_TOKEN_LEN) or that cannot be a header
    /// value, a timeout outside 1 ms..10 years, or a `max_response_bytes` of 0.
    ///
    /// ```
    /// use idem::{Error, RemoteStore};
    /// assert!(RemoteStore::builder("http://127.0.0.1:8624", "a-caller-token-0123456789").build().is_ok());
    /// let refused = RemoteStore::builder("https://idem.example", "a-caller-token-0123456789").build();
    /// assert!(matches!(refused, Err(Error::InvalidConfig(_))));
    /// let short = RemoteStore::builder("http://127.0.0.1:8624", "abc").build();
    /// assert!(matches!(short, Err(Error::InvalidConfig(m)) if m.contains("at least 16")));
    /// ```
    pub fn build(self) -> Result<RemoteStore, Error> {
        support::check_duration("the request timeout", self.timeout)?;
        if self.max_response_bytes == 0 {
            return Err(Error::InvalidConfig(
                "the RemoteStore's max_response_bytes must be at least 1: the server's \
                 --max-body-bytes less 4 KiB"
                    .into(),
            ));
        }
        let length = self.token.len();
        if length < Self::MIN_TOKEN_LEN {
            return Err(Error::InvalidConfig(format!(
                "the RemoteStore's token is {length} characters; idem-server's tokens are at \
                 least {} (the minimum of its --admin-token and --caller-token): pass the token \
                 the server was started with",
                Self::MIN_TOKEN_LEN
            )));
        }
        let base = self.server.trim_end_matches('/').to_owned();
        let uri: Uri = base.parse().map_err(|e| {
            Error::InvalidConfig(format!(
                "the idem-server address {base:?} is not a URL: {e}"
            ))
        })?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() || uri.query().is_some() {
            return Err(Error::InvalidConfig(format!(
                "the idem-server address is http://HOST[:PORT][/PATH], not {base:?}"
            )));
        }
        let authorization = HeaderValue::from_str(&format!("Bearer {}", self.token))
            .map_err(|_| Error::InvalidConfig("the token is not a valid header value".into()))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(RemoteStore {
            inner: Arc::new(Inner {
                client,
                base,
                authorization,
                namespace: self.namespace,
                timeout: self.timeout,
                max_response_bytes: self.max_response_bytes,
            }),
        })
    }
}

/// `d` in whole milliseconds (the store checked it first: at least 1 ms, at most ten years).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn at_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// An answer that is not what the protocol says: a server of another version, or not a server.
fn malformed(what: impl fmt::Display) -> Error {
    Error::Store(StoreError::new(
        StoreErrorKind::Corrupt,
        format!("idem-server answered what the protocol does not allow: {what}"),
    ))
}

fn token_of(text: Option<&str>) -> Result<Token, Error> {
    text.and_then(hex::decode::<16>)
        .map(Token::from_bytes)
        .ok_or_else(|| malformed("a claim without its 32-digit token"))
}

/// The error a refusal of the server at `server` is (docs/server.md, "Errors"; the table on
/// [`RemoteStore`]), of a request about `key` when it names one.
fn refused(server: &str, status: StatusCode, body: &[u8], key: Option<&Key>) -> Error {
    // Not a body of the protocol (a proxy's page, say): its first words as the detail.
    let refusal: ErrorBody = msgpack::from_slice(body).unwrap_or_else(|_| {
        ErrorBody::new(
            ErrorType::ServerError,
            "",
            String::from_utf8_lossy(body)
                .chars()
                .take(200)
                .collect::<String>(),
        )
    });
    let store = |kind| {
        Error::Store(StoreError::new(
            kind,
            format!(
                "idem-server at {server} answered {status} {}: {}",
                refusal.code, refusal.detail
            ),
        ))
    };
    // The refusals that name the request's key (a server answers them only for one).
    if let (409, Some(&operation)) = (status.as_u16(), key) {
        match refusal.code.as_str() {
            "uncertain" => {
                return Error::Uncertain {
                    operation,
                    since: at_unix_ms(refusal.since_ms.unwrap_or(0)),
                }
            }
            "not_uncertain" => return Error::NotUncertain { operation },
            _ => {}
        }
    }
    match (status.as_u16(), refusal.code.as_str()) {
        (409, "stale_holder") => Error::LeaseLost,
        (422, "fingerprint_mismatch") => Error::KeyReused,
        (422, "policy_changed") => match (refusal.stored_policy, refusal.current_policy) {
            (Some(stored), Some(current)) => Error::PolicyChanged { stored, current },
            _ => malformed("policy_changed without the two policy versions"),
        },
        (409, "abandoned") => Error::Abandoned {
            reason: refusal.reason.unwrap_or(refusal.detail),
        },
        (409, "result_expired") => Error::ResultExpired {
            since: at_unix_ms(refusal.since_ms.unwrap_or(0)),
        },
        (409, "too_many_uncertain") => store(StoreErrorKind::Query),
        // A value the server refuses (`invalid_data` at its field; in MessagePack, Diom's
        // decoder reports most of them as `invalid_encoding`), or a body over its limit.
        (422 | 413, _) | (400, "invalid_encoding") => match refusal.location.as_deref() {
            Some("name") => Error::InvalidStep(refusal.detail),
            Some(at) => Error::InvalidConfig(format!("{} (at {at})", refusal.detail)),
            None => Error::InvalidConfig(refusal.detail),
        },
        (401 | 403, _) => Error::Store(StoreError::new(
            StoreErrorKind::Unauthorized,
            format!(
                "idem-server at {server} refused the token ({status} {}: {}): build the \
                 RemoteStore with a token the server was started with (a --caller-token, or \
                 the admin token, which alone may prune)",
                refusal.code, refusal.detail
            ),
        )),
        (501, "steps_unsupported") => Error::StepsUnsupported,
        (503, _) | (502 | 504, _) => store(StoreErrorKind::Unavailable),
        (409, _) => store(StoreErrorKind::Transient),
        (500, "corrupt") => store(StoreErrorKind::Corrupt),
        _ => store(StoreErrorKind::Query),
    }
}

impl Inner {
    /// Posts `body` to `route` (a path of [`idem_wire::route`]) and decodes the answer.
    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        route: &'static str,
        body: &B,
    ) -> Result<T, Error> {
        self.call_on(route, body, None).await
    }

    /// [`call`](Self::call) for a request about `key`, whose refusals may name it.
    async fn call_on<B: Serialize, T: DeserializeOwned>(
        &self,
        route: &'static str,
        body: &B,
        key: Option<&Key>,
    ) -> Result<T, Error> {
        let encoded = msgpack::to_vec(body)
            .map_err(|e| Error::InvalidConfig(format!("the request cannot be encoded: {e}")))?;
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("{}{route}", self.base))
            .header(header::CONTENT_TYPE, msgpack::CONTENT_TYPE)
            .header(header::ACCEPT, msgpack::CONTENT_TYPE)
            .header(header::AUTHORIZATION, self.authorization.clone())
            .body(Full::new(Bytes::from(encoded)))
            .map_err(|e| Error::InvalidConfig(format!("the request cannot be built: {e}")))?;
        let unavailable = |e: &dyn fmt::Display| {
            Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "idem-server at {} did not answer {}: {e}",
                    self.base,
                    name(route)
                ),
            ))
        };
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| unavailable(&e))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| unavailable(&e))?
                .to_bytes();
            Ok::<_, Error>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| unavailable(&format_args!("no answer within {:?}", self.timeout)))??;
        if status != StatusCode::OK {
            return Err(refused(&self.base, status, &body, key));
        }
        msgpack::from_slice(&body).map_err(|e| malformed(format_args!("{}: {e}", name(route))))
    }
}

/// A route's name, as errors say it: `start`, `steps.begin`.
fn name(route: &str) -> &str {
    route
        .rsplit_once("v1.idempotency.")
        .map_or(route, |(_, name)| name)
}

/// The result in `data` as the store's caller stored it; `expires_at_ms` the retention's end
/// as the server reports it (now when it reports none); `not_retained` why the server's engine
/// did not keep it, if it did not (the result is then typed, not an envelope of this store's
/// making: the caller's engine replays it as `ResultNotRetained`).
fn stored_result(
    data: Completed,
    expires_at_ms: Option<u64>,
    not_retained: Option<String>,
) -> StoredResult {
    StoredResult {
        response: (!data.absent && not_retained.is_none()).then_some(data.response),
        is_error: data.is_error,
        expires_at: expires_at_ms
            .or(data.expires_at_ms)
            .map_or_else(SystemTime::now, at_unix_ms),
        not_retained: not_retained.map(String::into_boxed_str),
    }
}

/// What the server reports `since_ms` (for an uncertain key, when its claim's lease ended; for a
/// tombstone, when its result expired) as a time; an answer without it is malformed.
fn since(since_ms: Option<u64>) -> Result<SystemTime, Error> {
    since_ms
        .map(at_unix_ms)
        .ok_or_else(|| malformed("an uncertain key or a tombstone without `since_ms`"))
}

/// The engine's [`OnLapse`] as the protocol sends it.
fn wire_on_lapse(on_lapse: OnLapse) -> idem_wire::OnLapse {
    match on_lapse {
        OnLapse::Release => idem_wire::OnLapse::Release,
        OnLapse::Uncertain => idem_wire::OnLapse::Uncertain,
    }
}

/// `d` in whole milliseconds, as a period the protocol takes (the store checked `d` first: at
/// least 1 ms).
fn period_ms(d: Duration) -> Result<NonZeroU64, Error> {
    NonZeroU64::new(millis(d))
        .ok_or_else(|| Error::InvalidConfig(format!("a period of {d:?} is under 1 ms")))
}

impl RemoteStore {
    /// The namespace requests name (the server's default when none).
    fn namespace(&self) -> Option<String> {
        self.inner.namespace.clone()
    }
}

/// `key` as the protocol sends it: its 64 hexadecimal digits.
fn key_text(key: &Key) -> String {
    hex::encode(key.as_bytes())
}

/// `claim`'s token as the protocol sends it: 32 hexadecimal digits.
fn token_text(claim: &Claim) -> String {
    hex::encode(&claim.token().to_bytes())
}

#[async_trait]
impl Store for RemoteStore {
    /// The builder's [`max_response_bytes`](RemoteStoreBuilder::max_response_bytes).
    fn max_response_bytes(&self) -> Option<usize> {
        Some(self.inner.max_response_bytes)
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        request.check()?;
        let out: StartOut = self
            .inner
            .call_on(
                route::START,
                &StartIn {
                    namespace: self.namespace(),
                    key: key_text(request.key),
                    lock_period_ms: period_ms(request.lease)?,
                    fenced: true,
                    fingerprint_sha256: request.fingerprint.map(|f| hex::encode(f.as_bytes())),
                    fingerprint: None,
                    on_lapse: wire_on_lapse(request.on_lapse),
                },
                Some(request.key),
            )
            .await?;
        match out.status {
            StartStatus::Started => Ok(ClaimOutcome::Claimed(Claim::new(
                *request.key,
                token_of(out.token.as_deref())?,
            ))),
            StartStatus::Locked => Ok(ClaimOutcome::Locked {
                retry_after: Duration::from_millis(
                    out.lease_left_ms.or(out.retry_after_ms).unwrap_or(0),
                ),
            }),
            StartStatus::Completed => Ok(ClaimOutcome::Completed(stored_result(
                out.data.unwrap_or_default(),
                None,
                out.not_retained,
            ))),
            StartStatus::Uncertain => Ok(ClaimOutcome::Uncertain {
                since: since(out.since_ms)?,
            }),
            StartStatus::Expired => Ok(ClaimOutcome::Expired {
                since: since(out.since_ms)?,
            }),
        }
    }

    async fn complete(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error> {
        completion.check()?;
        support::check_response_size("RemoteStore", self.inner.max_response_bytes, &completion)?;
        let _: Empty = self
            .inner
            .call(
                route::COMPLETE,
                &CompleteIn {
                    namespace: self.namespace(),
                    key: key_text(claim.key()),
                    token: Some(token_text(claim)),
                    response: completion.response.unwrap_or_default().to_vec(),
                    absent: completion.response.is_none(),
                    is_error: completion.is_error,
                    // Always: `{}` only once the result is in the server's store.
                    observed: true,
                    ttl_ms: period_ms(completion.retention)?,
                    context: None,
                    key_retention_ms: millis(completion.key_retention),
                },
            )
            .await?;
        Ok(())
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        let _: Empty = self
            .inner
            .call(
                route::ABORT,
                &AbortIn {
                    namespace: self.namespace(),
                    key: key_text(claim.key()),
                    token: Some(token_text(claim)),
                },
            )
            .await?;
        Ok(())
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        support::check_duration("lease", lease)?;
        let _: Empty = self
            .inner
            .call(
                route::RENEW,
                &RenewIn {
                    namespace: self.namespace(),
                    key: key_text(claim.key()),
                    token: token_text(claim),
                    lock_period_ms: period_ms(lease)?,
                },
            )
            .await?;
        Ok(())
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let out: GetOut = self
            .inner
            .call(
                route::GET,
                &KeyIn {
                    namespace: self.namespace(),
                    key: key_text(key),
                },
            )
            .await?;
        let fingerprint = match out.fingerprint_sha256.as_deref() {
            None => None,
            Some(text) => Some(Fingerprint::from_bytes(
                hex::decode::<32>(text)
                    .ok_or_else(|| malformed("a fingerprint of other than 64 digits"))?,
            )),
        };
        let state = match out.status {
            GetStatus::Absent => return Ok(None),
            GetStatus::InProgress => RecordState::InProgress {
                token: token_of(out.token.as_deref())?,
                lease_until: at_unix_ms(out.lease_until_ms.unwrap_or(0)),
            },
            GetStatus::Completed => {
                let mut kept = stored_result(
                    out.data.unwrap_or_default(),
                    out.expires_at_ms,
                    out.not_retained,
                );
                if let Some(reason) = out.abandoned {
                    // Resolved as abandoned by the server's own engine (its admin).
                    kept.response = Some(support::abandoned_result(&reason));
                }
                RecordState::Completed(kept)
            }
            GetStatus::Uncertain => RecordState::Uncertain {
                token: token_of(out.token.as_deref())?,
                since: since(out.since_ms)?,
            },
            GetStatus::Expired => RecordState::Expired {
                since: since(out.since_ms)?,
            },
        };
        Ok(Some(Record::new(*key, fingerprint, state)))
    }

    async fn take_uncertain(
        &self,
        key: &Key,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, Error> {
        support::check_duration("lease", lease)?;
        let out: TakeUncertainOut = self
            .inner
            .call_on(
                route::UNCERTAIN_TAKE,
                &TakeUncertainIn {
                    namespace: self.namespace(),
                    key: key_text(key),
                    token: hex::encode(&token.to_bytes()),
                    lock_period_ms: period_ms(lease)?,
                },
                Some(key),
            )
            .await?;
        Ok(Claim::new(*key, token_of(Some(&out.token))?))
    }

    /// Pages of at most [`idem_wire::MAX_PAGE`] from the server until `query.limit` are found
    /// or a page is its last. A key of the caller's that is not a `RemoteStore`'s (64
    /// hexadecimal digits: one a Diom client started in the same namespace with the same
    /// token) is left out.
    async fn find_uncertain(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<UncertainOperation>, Error> {
        let wanted = query.limit as usize;
        let mut found = Vec::new();
        let mut after = query.after.map(key_text);
        while found.len() < wanted {
            let limit = (wanted - found.len()).min(idem_wire::MAX_PAGE as usize) as u32;
            let out: FindUncertainOut = self
                .inner
                .call(
                    route::UNCERTAIN_FIND,
                    &FindUncertainIn {
                        namespace: self.namespace(),
                        after: after.clone(),
                        limit,
                    },
                )
                .await?;
            let last_page = out.operations.len() < limit as usize;
            for op in out.operations {
                after = Some(op.key.clone());
                let Some(bytes) = hex::decode::<32>(&op.key) else {
                    continue;
                };
                found.push(UncertainOperation {
                    key: Key::from_bytes(bytes),
                    token: token_of(Some(&op.token))?,
                    since: at_unix_ms(op.since_ms),
                });
            }
            if last_page {
                break;
            }
        }
        Ok(found)
    }

    async fn evict(&self, key: &Key) -> Result<bool, Error> {
        let out: EvictOut = self
            .inner
            .call(
                route::EVICT,
                &KeyIn {
                    namespace: self.namespace(),
                    key: key_text(key),
                },
            )
            .await?;
        Ok(out.evicted)
    }

    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        let out: PruneOut = self.inner.call(route::PRUNE, &PruneIn { limit }).await?;
        Ok(out.pruned)
    }

    async fn begin_steps(&self, claim: &Claim, retention: Duration) -> Result<StepLog, Error> {
        support::check_duration("retention", retention)?;
        let out: StepsOut = self
            .inner
            .call(
                route::STEPS_BEGIN,
                &StepsBeginIn {
                    namespace: self.namespace(),
                    key: key_text(claim.key()),
                    token: token_text(claim),
                    ttl_ms: period_ms(retention)?,
                },
            )
            .await?;
        Ok(StepLog {
            attempt: out.attempt,
            steps: out
                .steps
                .into_iter()
                .map(|step| StepRecord {
                    name: step.name,
                    position: step.position,
                    state: step.result.map_or(StepState::Begun, StepState::Finished),
                })
                .collect(),
        })
    }

    async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
        step.check()?;
        let _: Empty = self
            .inner
            .call(
                route::STEPS_WRITE,
                &StepWriteIn {
                    namespace: self.namespace(),
                    key: key_text(claim.key()),
                    token: token_text(claim),
                    name: step.name.to_owned(),
                    position: step.position,
                    result: step.result.map(<[u8]>::to_vec),
                    ttl_ms: period_ms(step.retention)?,
                    on_lapse: step.on_lapse.map(wire_on_lapse),
                },
            )
            .await?;
        Ok(())
    }
}

/// What an operator's listing asks of an idem-server: it serves keys to their owners only, so
/// listing and counting take the server's own store URL.
fn no_listing(what: &str) -> Error {
    Error::Store(StoreError::new(
        StoreErrorKind::Query,
        format!(
            "idem-server does not {what}: each caller sees only its own keys; run the command \
             on the server's store URL instead"
        ),
    ))
}

/// The operator's reads the server does not offer: `get`, `evict` and `prune` go through
/// [`Store`]; `list`, `stats` and `schema_version` are refused with a store error of kind
/// [`Query`](StoreErrorKind::Query) that says to use the server's own store URL.
///
/// ```
/// use idem::{RemoteStore, StoreAdmin};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let store = RemoteStore::builder("http://127.0.0.1:9", "a-caller-token-0123456789").build()?;
/// assert!(store.stats().await.is_err()); // refused here, nothing sent
/// # Ok(()) }
/// ```
#[async_trait]
impl StoreAdmin for RemoteStore {
    async fn list(&self, _query: ListQuery<'_>) -> Result<Vec<Record>, Error> {
        Err(no_listing("list records"))
    }

    async fn stats(&self) -> Result<StoreStats, Error> {
        Err(no_listing("count records"))
    }

    async fn schema_version(&self) -> Result<i64, Error> {
        Err(no_listing("report its store's schema"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_to_the_errors_the_stores_give() {
        let body = |code: &str, location: Option<&str>| {
            msgpack::to_vec(&ErrorBody {
                location: location.map(str::to_owned),
                ..ErrorBody::new(ErrorType::OperationError, code, "d")
            })
            .unwrap()
        };
        let at = |s: u16, code: &str, loc: Option<&str>| {
            refused(
                "http://h:1",
                StatusCode::from_u16(s).unwrap(),
                &body(code, loc),
                None,
            )
        };
        assert!(matches!(at(409, "stale_holder", None), Error::LeaseLost));
        assert!(matches!(
            at(422, "fingerprint_mismatch", None),
            Error::KeyReused
        ));
        assert!(
            matches!(at(422, "invalid_data", Some("ttl_ms")), Error::InvalidConfig(d) if d == "d (at ttl_ms)")
        );
        assert!(matches!(
            at(400, "invalid_encoding", None),
            Error::InvalidConfig(d) if d == "d"
        ));
        assert!(matches!(
            at(422, "invalid_data", Some("name")),
            Error::InvalidStep(_)
        ));
        assert!(matches!(
            at(501, "steps_unsupported", None),
            Error::StepsUnsupported
        ));
        let kind = |e: Error| match e {
            Error::Store(e) => e.kind(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            kind(at(503, "store_unavailable", None)),
            StoreErrorKind::Unavailable
        );
        assert_eq!(kind(at(500, "corrupt", None)), StoreErrorKind::Corrupt);
        for (status, code) in [
            (401, "invalid_token"),
            (401, "auth_required"),
            (403, "forbidden"),
        ] {
            let e = at(status, code, None);
            assert!(e.to_string().contains("http://h:1"), "{e}");
            assert_eq!(kind(e), StoreErrorKind::Unauthorized);
        }
        assert_eq!(kind(at(400, "not_found", None)), StoreErrorKind::Query);
        // Past the lease: the refusals carry what the typed errors need.
        let past = |s: u16, body: ErrorBody, key: Option<&Key>| {
            let bytes = msgpack::to_vec(&body).unwrap();
            refused("http://h:1", StatusCode::from_u16(s).unwrap(), &bytes, key)
        };
        let with = |code: &str| ErrorBody::new(ErrorType::OperationError, code, "d");
        let changed = ErrorBody {
            stored_policy: Some(1),
            current_policy: Some(2),
            ..with("policy_changed")
        };
        assert!(matches!(
            past(422, changed, None),
            Error::PolicyChanged {
                stored: 1,
                current: 2
            }
        ));
        assert_eq!(
            kind(past(422, with("policy_changed"), None)),
            StoreErrorKind::Corrupt
        );
        let abandoned = ErrorBody {
            reason: Some("refunded".into()),
            ..with("abandoned")
        };
        assert!(
            matches!(past(409, abandoned, None), Error::Abandoned { reason } if reason == "refunded")
        );
        let key = Key::derive("s", "", "k").unwrap();
        assert!(matches!(
            past(409, with("not_uncertain"), Some(&key)),
            Error::NotUncertain { operation } if operation == key
        ));
        let uncertain = ErrorBody {
            since_ms: Some(5),
            ..with("uncertain")
        };
        assert!(matches!(
            past(409, uncertain, Some(&key)),
            Error::Uncertain { operation, since } if operation == key && since == at_unix_ms(5)
        ));
        assert_eq!(
            kind(at(409, "too_many_uncertain", None)),
            StoreErrorKind::Query
        );
        assert_eq!(
            kind(refused(
                "http://h:1",
                StatusCode::BAD_GATEWAY,
                b"<html>",
                None
            )),
            StoreErrorKind::Unavailable
        );
    }

    #[test]
    fn keys_tokens_and_fingerprints_travel_as_hex() {
        let t = Token::random();
        assert_eq!(token_of(Some(&hex::encode(&t.to_bytes()))).unwrap(), t);
        assert!(token_of(Some("zz")).is_err());
        let f = Fingerprint::of_bytes(b"x");
        assert_eq!(
            hex::decode::<32>(&hex::encode(f.as_bytes())),
            Some(*f.as_bytes())
        );
    }

    #[test]
    fn only_plain_http_addresses_build() {
        for bad in ["https://h", "h:1", "http://h?x=1", "ftp://h"] {
            assert!(
                RemoteStore::builder(bad, "a-caller-token-0123456789")
                    .build()
                    .is_err(),
                "{bad} was taken"
            );
        }
        let store = RemoteStore::builder("http://h:1/prefix/", "a-caller-token-0123456789")
            .build()
            .unwrap();
        assert_eq!(store.server(), "http://h:1/prefix");
    }

    #[test]
    fn a_token_shorter_than_the_servers_minimum_is_refused() {
        for short in ["", "abc", "fifteen-chars-x"] {
            let refused = RemoteStore::builder("http://h:1", short).build();
            assert!(
                matches!(&refused, Err(Error::InvalidConfig(m)) if m.contains("at least 16")),
                "{short:?}: {refused:?}"
            );
        }
        assert!(RemoteStore::builder("http://h:1", "sixteen-chars-xx")
            .build()
            .is_ok());
    }

    /// A duration out of range is refused here, as every store refuses it, before anything is
    /// sent: the server at the address accepts connections but never answers, so a request
    /// would end in a timeout, and it is left with no connection to accept.
    #[tokio::test]
    async fn bad_durations_are_refused_before_anything_is_sent() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let server = format!("http://{}", listener.local_addr().unwrap());
        let store = RemoteStore::builder(server, "a-caller-token-0123456789")
            .timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        let key = Key::derive("s", "", "k").unwrap();
        let claim = Claim::new(key, Token::random());
        let completion = Completion {
            response: Some(b"r"),
            is_error: false,
            retention: Duration::ZERO,
            key_retention: Duration::ZERO,
        };
        let step = StepWrite {
            name: "charge",
            position: 0,
            result: None,
            retention: Duration::ZERO,
            on_lapse: None,
        };
        let refusals = [
            store
                .claim(ClaimRequest::new(&key, Duration::ZERO))
                .await
                .err(),
            store.complete(&claim, completion).await.err(),
            store.renew(&claim, Duration::ZERO).await.err(),
            store.begin_steps(&claim, Duration::ZERO).await.err(),
            store.write_step(&claim, step).await.err(),
        ];
        for refusal in refusals {
            assert!(
                matches!(&refusal, Some(Error::InvalidConfig(_))),
                "{refusal:?}"
            );
        }
        let nothing = listener.accept().map(|_| ()).unwrap_err();
        assert_eq!(nothing.kind(), std::io::ErrorKind::WouldBlock);
    }
}
