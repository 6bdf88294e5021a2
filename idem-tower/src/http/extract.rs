//! [`IdempotencyKey`]: the axum extractor for the key the layer checked.

use std::fmt;
use std::future::{ready, Future};

use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, Response};
use http::request::Parts;

use super::key_header::client_key;
use super::problem::ProblemConfig;
use super::Problem;
use super::IDEMPOTENCY_KEY;

/// Put on a request by the layer once it has checked the request's `Idempotency-Key` and is
/// about to run the handler under it. Zero-sized, so inserting it allocates no box.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyChecked;

/// The client's `Idempotency-Key`, as the [`IdempotencyLayer`](super::IdempotencyLayer) checked
/// it and stores the request under: the string without its quotes (`"abc"` and `abc` both read
/// `abc`), 1 to 255 printable ASCII characters. An axum extractor for handlers behind the layer.
///
/// As `IdempotencyKey`, a request without the header is refused with `400`
/// ([`Problem::KeyMissing`]); as `Option<IdempotencyKey>` it reads `None`. A request that
/// carries the header but that no layer guarded (the route is outside the layer, most often
/// because it was added to the `Router` after `.layer(…)`, or its method is not among the
/// layer's [`methods`](super::LayerBuilder::methods)) is refused with `500`
/// ([`Problem::KeyUnguarded`], whose detail names both causes and their fixes) in both forms:
/// its key deduplicates nothing, and a handler that trusted it would be wrong. The refusals are `application/problem+json` whose `type` links to
/// docs.rs (the extractor does not see the layer's
/// [`problem_base`](super::LayerBuilder::problem_base)); take `Result<IdempotencyKey,
/// IdempotencyKeyRejection>` to answer them your own way.
///
/// ```
/// use axum::{routing::post, Router};
/// use idem::http::{IdempotencyKey, IdempotencyLayer};
/// use idem::{Idempotency, MemoryStore};
///
/// /// Keeps the key with the payment, so support can look the request up.
/// async fn create(key: IdempotencyKey) -> String {
///     format!("payment made under {key}")
/// }
///
/// /// Works with and without a key.
/// async fn update(key: Option<IdempotencyKey>) -> &'static str {
///     if key.is_some() { "updated once" } else { "updated" }
/// }
///
/// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
///     .build()?;
/// let app: Router = Router::new()
///     .route("/payments", post(create).patch(update))
///     .layer(layer);
/// # let _ = app;
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key as the client sent it, without quotes.
    ///
    /// ```
    /// use axum::{body::{to_bytes, Body}, routing::post, Router};
    /// use http::Request;
    /// use idem::http::{IdempotencyKey, IdempotencyLayer};
    /// use idem::{Idempotency, MemoryStore};
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .shared_key_space()
    ///     .build()?;
    /// let app = Router::new()
    ///     .route("/", post(|key: IdempotencyKey| async move { key.as_str().to_owned() }))
    ///     .layer(layer);
    /// let request = Request::post("/").header("idempotency-key", "\"k-1\"").body(Body::empty())?;
    /// let response = app.oneshot(request).await?;
    /// assert_eq!(to_bytes(response.into_body(), 64).await?, "k-1");
    /// # Ok(()) }
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an owned string, without quotes.
    ///
    /// ```
    /// # use idem::http::IdempotencyKey;
    /// fn keep(key: IdempotencyKey) -> String {
    ///     key.into_string()
    /// }
    /// ```
    pub fn into_string(self) -> String {
        self.0
    }

    /// The request's checked key: `Ok(None)` when it has no `Idempotency-Key`.
    fn read(parts: &Parts) -> Result<Option<IdempotencyKey>, IdempotencyKeyRejection> {
        let headers = parts.headers.get_all(IDEMPOTENCY_KEY);
        if parts.extensions.get::<KeyChecked>().is_none() {
            return match headers.iter().next() {
                None => Ok(None),
                Some(_) => {
                    // A setup mistake: the operator reads it here, the client in the 500.
                    tracing::error!(method = %parts.method, path = parts.uri.path(), "{UNGUARDED}");
                    Err(IdempotencyKeyRejection {
                        problem: Problem::KeyUnguarded,
                        detail: UNGUARDED.to_owned(),
                    })
                }
            };
        }
        // The layer accepted this header under its own rules; read leniently, the same value
        // parses to the same key under either.
        match client_key(headers, true) {
            Ok(key) => Ok(key.map(IdempotencyKey)),
            Err(e) => Err(IdempotencyKeyRejection {
                problem: Problem::KeyMalformed,
                detail: e.to_string(),
            }),
        }
    }
}

const UNGUARDED: &str = "this request carries an Idempotency-Key that no idempotency layer \
                         checked, so the handler cannot rely on it: the route is not behind the \
                         idempotency layer (a route added to the Router after .layer(…) is not \
                         wrapped by it: add the route before calling .layer), or the layer does \
                         not guard this method (add it to the layer's methods; POST and PATCH \
                         by default)";

const MISSING: &str = "this endpoint needs an Idempotency-Key header, e.g. \
                       Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"";

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<S> FromRequestParts<S> for IdempotencyKey {
    type Rejection = IdempotencyKeyRejection;

    fn from_request_parts(
        parts: &mut Parts,
        _: &S,
    ) -> impl Future<Output = Result<IdempotencyKey, IdempotencyKeyRejection>> + Send {
        ready(Self::read(parts).and_then(|key| {
            key.ok_or_else(|| IdempotencyKeyRejection {
                problem: Problem::KeyMissing,
                detail: MISSING.to_owned(),
            })
        }))
    }
}

impl<S> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = IdempotencyKeyRejection;

    fn from_request_parts(
        parts: &mut Parts,
        _: &S,
    ) -> impl Future<Output = Result<Option<IdempotencyKey>, IdempotencyKeyRejection>> + Send {
        ready(Self::read(parts))
    }
}

/// Why the [`IdempotencyKey`] extractor refused a request; as a response, the
/// `application/problem+json` of its [`problem`](Self::problem).
///
/// ```
/// use axum::response::{IntoResponse, Response};
/// use idem::http::{IdempotencyKey, IdempotencyKeyRejection, Problem};
///
/// /// Answers a missing key in the API's own words, anything else as the extractor does.
/// async fn create(key: Result<IdempotencyKey, IdempotencyKeyRejection>) -> Response {
///     match key {
///         Ok(key) => format!("created under {key}").into_response(),
///         Err(refused) if refused.problem() == Problem::KeyMissing => {
///             (http::StatusCode::BAD_REQUEST, "send an Idempotency-Key").into_response()
///         }
///         Err(refused) => refused.into_response(),
///     }
/// }
/// let app: axum::Router = axum::Router::new().route("/payments", axum::routing::post(create));
/// # let _ = app;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKeyRejection {
    problem: Problem,
    detail: String,
}

impl IdempotencyKeyRejection {
    /// What was wrong: [`Problem::KeyMissing`] (`400`), [`Problem::KeyUnguarded`] (`500`) or
    /// [`Problem::KeyMalformed`] (`400`, only if something between the layer and the handler
    /// changed the header).
    ///
    /// ```
    /// use axum::extract::FromRequestParts;
    /// use http::Request;
    /// use idem::http::{IdempotencyKey, Problem};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (mut parts, ()) = Request::post("/").body(()).unwrap().into_parts();
    /// let refused = IdempotencyKey::from_request_parts(&mut parts, &()).await.unwrap_err();
    /// assert_eq!(refused.problem(), Problem::KeyMissing);
    /// # }
    /// ```
    pub fn problem(&self) -> Problem {
        self.problem
    }
}

impl fmt::Display for IdempotencyKeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.problem.title(), self.detail)
    }
}

impl std::error::Error for IdempotencyKeyRejection {}

impl IntoResponse for IdempotencyKeyRejection {
    fn into_response(self) -> Response {
        self.problem
            .response(&ProblemConfig::default(), self.detail)
    }
}
