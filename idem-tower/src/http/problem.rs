//! How the HTTP layer says a [`Problem`]: `application/problem+json` (RFC 9457).

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use axum_core::body::Body;
use http::header::{CONTENT_TYPE, LINK, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};

use crate::problem::Problem;
use idem_core::Error;

impl Problem {
    /// The HTTP status of the response. For [`CallerMissing`](Self::CallerMissing) this is the
    /// default, `401`; a layer may answer `400` instead
    /// ([`caller_missing_status`](super::LayerBuilder::caller_missing_status)).
    ///
    /// ```
    /// use idem::http::Problem;
    /// assert_eq!(Problem::BodyTooLarge.status(), 413);
    /// assert_eq!(Problem::CallerMissing.status(), 401);
    /// ```
    pub fn status(self) -> StatusCode {
        match self {
            Problem::KeyMissing
            | Problem::KeyMalformed
            | Problem::BodyUnreadable
            | Problem::CallerInvalid => StatusCode::BAD_REQUEST,
            Problem::CallerMissing => StatusCode::UNAUTHORIZED,
            Problem::KeyInFlight
            | Problem::OperationUncertain
            | Problem::ResultExpired
            | Problem::PolicyChanged => StatusCode::CONFLICT,
            Problem::KeyReused | Problem::ResponseNotRetained | Problem::OperationAbandoned => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::LeaseLost | Problem::Internal | Problem::KeyUnguarded => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The problem's short, fixed summary (the `title` member).
    ///
    /// ```
    /// use idem::http::Problem;
    /// assert_eq!(Problem::KeyMissing.title(), "Idempotency-Key is missing");
    /// ```
    pub fn title(self) -> &'static str {
        match self {
            Problem::KeyMissing => "Idempotency-Key is missing",
            Problem::KeyMalformed => "Idempotency-Key is malformed",
            Problem::KeyInFlight => "A request with this Idempotency-Key is in progress",
            Problem::KeyReused => "Idempotency-Key is already used for another request",
            Problem::BodyTooLarge => "Request body is too large",
            Problem::BodyUnreadable => "Request body could not be read",
            Problem::StoreUnavailable => "Idempotency store is unavailable",
            Problem::LeaseLost => "Idempotency claim was lost while the request ran",
            Problem::ResponseNotRetained => "The response to this Idempotency-Key was not kept",
            Problem::Internal => "Idempotency layer failed",
            Problem::CallerMissing => "Caller identity is missing",
            Problem::CallerInvalid => "Caller identity is invalid",
            Problem::KeyUnguarded => "Idempotency-Key was not checked by an idempotency layer",
            Problem::OperationUncertain => {
                "The outcome of the request with this Idempotency-Key is uncertain"
            }
            Problem::ResultExpired => "The response to this Idempotency-Key has expired",
            Problem::PolicyChanged => "Idempotency-Key was used under another request policy",
            Problem::OperationAbandoned => "The request with this Idempotency-Key was abandoned",
        }
    }

    /// The variant's name in kebab case: the fragment of its `type` URI under a configured
    /// [`problem_base`](super::LayerBuilder::problem_base), so the API's documentation page can
    /// hold one anchor per problem (`<h2 id="key-in-flight">`).
    ///
    /// ```
    /// use idem::http::Problem;
    /// assert_eq!(Problem::KeyReused.slug(), "key-reused");
    /// assert_eq!(Problem::CallerMissing.slug(), "caller-missing");
    /// ```
    pub fn slug(self) -> &'static str {
        match self {
            Problem::KeyMissing => "key-missing",
            Problem::KeyMalformed => "key-malformed",
            Problem::KeyInFlight => "key-in-flight",
            Problem::KeyReused => "key-reused",
            Problem::BodyTooLarge => "body-too-large",
            Problem::BodyUnreadable => "body-unreadable",
            Problem::StoreUnavailable => "store-unavailable",
            Problem::LeaseLost => "lease-lost",
            Problem::ResponseNotRetained => "response-not-retained",
            Problem::Internal => "internal",
            Problem::CallerMissing => "caller-missing",
            Problem::CallerInvalid => "caller-invalid",
            Problem::KeyUnguarded => "key-unguarded",
            Problem::OperationUncertain => "operation-uncertain",
            Problem::ResultExpired => "result-expired",
            Problem::PolicyChanged => "policy-changed",
            Problem::OperationAbandoned => "operation-abandoned",
        }
    }

    /// The default problem type (the `type` member): a link to this variant's documentation on
    /// docs.rs. A layer with a [`problem_base`](super::LayerBuilder::problem_base) sends
    /// `{base}#{slug}` instead.
    ///
    /// ```
    /// use idem::http::Problem;
    /// assert!(Problem::KeyReused.type_uri().starts_with("https://docs.rs/idem-core/"));
    /// ```
    pub fn type_uri(self) -> &'static str {
        macro_rules! doc {
            ($v:literal) => {
                concat!(
                    "https://docs.rs/idem-core/latest/idem_core/http/enum.Problem.html#variant.",
                    $v
                )
            };
        }
        match self {
            Problem::KeyMissing => doc!("KeyMissing"),
            Problem::KeyMalformed => doc!("KeyMalformed"),
            Problem::KeyInFlight => doc!("KeyInFlight"),
            Problem::KeyReused => doc!("KeyReused"),
            Problem::BodyTooLarge => doc!("BodyTooLarge"),
            Problem::BodyUnreadable => doc!("BodyUnreadable"),
            Problem::StoreUnavailable => doc!("StoreUnavailable"),
            Problem::LeaseLost => doc!("LeaseLost"),
            Problem::ResponseNotRetained => doc!("ResponseNotRetained"),
            Problem::Internal => doc!("Internal"),
            Problem::CallerMissing => doc!("CallerMissing"),
            Problem::CallerInvalid => doc!("CallerInvalid"),
            Problem::KeyUnguarded => doc!("KeyUnguarded"),
            Problem::OperationUncertain => doc!("OperationUncertain"),
            Problem::ResultExpired => doc!("ResultExpired"),
            Problem::PolicyChanged => doc!("PolicyChanged"),
            Problem::OperationAbandoned => doc!("OperationAbandoned"),
        }
    }

    /// The response: status, `Content-Type: application/problem+json`, the JSON body, and the
    /// headers `config` adds (`Link`, and `WWW-Authenticate` on a `401`).
    pub(crate) fn response(
        self,
        config: &ProblemConfig,
        detail: impl fmt::Display,
    ) -> Response<Body> {
        self.response_about(config, detail, None)
    }

    /// [`response`](Self::response) naming the operation it is about: the extension member
    /// `operation` (the key's hex form, what `idem resolve` takes), as
    /// [`OperationUncertain`](Self::OperationUncertain) carries.
    pub(crate) fn response_about(
        self,
        config: &ProblemConfig,
        detail: impl fmt::Display,
        operation: Option<String>,
    ) -> Response<Body> {
        let status = match self {
            Problem::CallerMissing => config.caller_missing_status,
            _ => self.status(),
        };
        let kind = match &config.base {
            Some(base) => Cow::Owned(format!("{base}#{}", self.slug())),
            None => Cow::Borrowed(self.type_uri()),
        };
        let body = ProblemBody {
            kind,
            title: self.title(),
            status: status.as_u16(),
            detail: detail.to_string(),
            operation,
        };
        // Serializing four plain fields cannot fail; the fallback keeps the path panic-free.
        let json = serde_json::to_vec(&body).unwrap_or_default();
        let mut response = Response::new(Body::from(json));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(link) = &config.link {
            headers.insert(LINK, link.clone());
        }
        if status == StatusCode::UNAUTHORIZED
            && let Some(challenge) = &config.www_authenticate
        {
            headers.insert(WWW_AUTHENTICATE, challenge.clone());
        }
        response
    }

    /// [`response`](Self::response) with `Retry-After: <delay-seconds>` (RFC 9110 section
    /// 10.2.3): `after` rounded up to whole seconds, at least 1, so a client that waits as told
    /// never comes back early, and never gets `0` (which reads as "retry at once").
    pub(crate) fn retry_after(
        self,
        config: &ProblemConfig,
        detail: impl fmt::Display,
        after: Duration,
    ) -> Response<Body> {
        let mut response = self.response(config, detail);
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        response
    }
}

/// `after` in whole seconds, rounded up, at least 1.
fn retry_after_secs(after: Duration) -> u64 {
    let secs = after
        .as_secs()
        .saturating_add(u64::from(after.subsec_nanos() > 0));
    secs.max(1)
}

/// How one layer writes its problem responses; checked by
/// [`LayerBuilder::build`](super::LayerBuilder::build).
#[derive(Debug, Clone)]
pub(crate) struct ProblemConfig {
    /// The API's idempotency documentation (an absolute `http(s)` URI without a fragment):
    /// `type` becomes `{base}#{slug}`. `None`: the docs.rs links.
    pub(crate) base: Option<String>,
    /// `Link: <{base}>; rel="describedby"`, prepared from `base` once.
    pub(crate) link: Option<HeaderValue>,
    /// The status of [`Problem::CallerMissing`]: 401 or 400.
    pub(crate) caller_missing_status: StatusCode,
    /// The challenge a 401 carries.
    pub(crate) www_authenticate: Option<HeaderValue>,
}

impl Default for ProblemConfig {
    fn default() -> Self {
        ProblemConfig {
            base: None,
            link: None,
            caller_missing_status: StatusCode::UNAUTHORIZED,
            www_authenticate: None,
        }
    }
}

/// The members of an RFC 9457 problem, in the order readers expect them.
#[derive(serde::Serialize)]
struct ProblemBody {
    #[serde(rename = "type")]
    kind: Cow<'static, str>,
    title: &'static str,
    status: u16,
    detail: String,
    /// The operation a problem is about, where one is named (an extension member, RFC 9457
    /// section 3.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    operation: Option<String>,
}

/// The response for an engine error met while claiming, running or completing a request.
pub(crate) fn from_engine(config: &ProblemConfig, error: Error) -> Response<Body> {
    match error {
        Error::Locked { retry_after } => Problem::KeyInFlight.retry_after(
            config,
            "a request with the same Idempotency-Key is being processed; retry after the \
             Retry-After delay",
            retry_after,
        ),
        Error::KeyReused => Problem::KeyReused.response(
            config,
            "this Idempotency-Key was used for a request with another method, path or body; \
             send a new key for a new request",
        ),
        Error::ResultNotRetained { reason } => Problem::ResponseNotRetained.response(
            config,
            format!(
                "the request with this Idempotency-Key already ran, but its response was not kept \
             ({reason}); it will not run again: look up its effect instead of retrying"
            ),
        ),
        Error::Uncertain { operation, .. } => {
            tracing::warn!(%operation, "idempotency: a request met an uncertain operation");
            Problem::OperationUncertain.response_about(
                config,
                format!(
                    "the request with this Idempotency-Key began work whose effect must not \
                     repeat, and stopped before its response was stored: whether it took effect \
                     is unknown, so it will not run again until operation {operation} is \
                     resolved; do not retry, with this key or another"
                ),
                Some(operation.to_string()),
            )
        }
        Error::ResultExpired { .. } => Problem::ResultExpired.response(
            config,
            "the request with this Idempotency-Key already ran and its response has expired; it \
             will not run again: look up its effect, or send a new key for a new request",
        ),
        Error::PolicyChanged { stored, current } => Problem::PolicyChanged.response(
            config,
            format!(
                "this Idempotency-Key was first used under request policy {stored}, and this \
                 request differs from that one as policy {current} sees it; nothing ran: send a \
                 new key for a new request"
            ),
        ),
        Error::Abandoned { reason } => Problem::OperationAbandoned.response(
            config,
            format!(
                "the request with this Idempotency-Key was resolved as abandoned ({reason}); it \
                 will not run again"
            ),
        ),
        Error::Store(e) if e.kind().is_transient() => {
            tracing::warn!(error = %e, "idempotency store unavailable");
            Problem::StoreUnavailable.retry_after(
                config,
                "the idempotency store cannot be reached; the request did not run, retry later",
                Duration::from_secs(1),
            )
        }
        Error::LeaseLost => {
            tracing::error!("idempotency lease lost while the handler ran; it may have run twice");
            Problem::LeaseLost.response(
                config,
                "the request ran, but its idempotency record was taken over before the response \
                 was stored; it may have run twice, so check the resource before retrying",
            )
        }
        other => {
            tracing::error!(error = %other, "idempotency layer failed");
            Problem::Internal.response(config, "the idempotency layer failed; the error is logged")
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    async fn body_text(r: Response<Body>) -> String {
        let body = r.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[test]
    fn retry_after_rounds_up() {
        let config = ProblemConfig::default();
        let r = Problem::KeyInFlight.retry_after(&config, "x", Duration::from_millis(1500));
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        let r = Problem::KeyInFlight.retry_after(&config, "x", Duration::from_millis(1));
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        let r = Problem::KeyInFlight.retry_after(&config, "x", Duration::from_secs(3));
        assert_eq!(r.headers()[RETRY_AFTER], "3");
        let r = Problem::KeyInFlight.retry_after(&config, "x", Duration::ZERO);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        // No overflow at the far end.
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }

    #[tokio::test]
    async fn body_is_a_problem_document() {
        let r = Problem::KeyMissing.response(&ProblemConfig::default(), "send one");
        assert!(r.headers().get(LINK).is_none());
        let text = body_text(r).await;
        assert!(
            text.starts_with(r#"{"type":"https://docs.rs/idem-core/"#),
            "{text}"
        );
        assert!(
            text.ends_with(
                r#""title":"Idempotency-Key is missing","status":400,"detail":"send one"}"#
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn base_sets_type_and_link() {
        let config = ProblemConfig {
            base: Some("https://api.example.com/docs/idempotency".into()),
            link: Some(HeaderValue::from_static(
                "<https://api.example.com/docs/idempotency>; rel=\"describedby\"",
            )),
            ..ProblemConfig::default()
        };
        let r = Problem::KeyReused.response(&config, "x");
        assert_eq!(
            r.headers()[LINK],
            "<https://api.example.com/docs/idempotency>; rel=\"describedby\""
        );
        let text = body_text(r).await;
        assert!(
            text.starts_with(r#"{"type":"https://api.example.com/docs/idempotency#key-reused","#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn caller_missing_status_is_configured() {
        let default = Problem::CallerMissing.response(&ProblemConfig::default(), "x");
        assert_eq!(default.status(), StatusCode::UNAUTHORIZED);
        assert!(default.headers().get(WWW_AUTHENTICATE).is_none());
        let challenge = HeaderValue::from_static("Bearer realm=\"api\"");
        let with_challenge = ProblemConfig {
            www_authenticate: Some(challenge.clone()),
            ..ProblemConfig::default()
        };
        let r = Problem::CallerMissing.response(&with_challenge, "x");
        assert_eq!(r.headers()[WWW_AUTHENTICATE], challenge);
        let bad_request = ProblemConfig {
            caller_missing_status: StatusCode::BAD_REQUEST,
            ..ProblemConfig::default()
        };
        let r = Problem::CallerMissing.response(&bad_request, "x");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(body_text(r).await.contains(r#""status":400"#));
    }

    #[test]
    fn slugs_are_distinct() {
        let all = [
            Problem::KeyMissing,
            Problem::KeyMalformed,
            Problem::KeyInFlight,
            Problem::KeyReused,
            Problem::BodyTooLarge,
            Problem::BodyUnreadable,
            Problem::StoreUnavailable,
            Problem::LeaseLost,
            Problem::ResponseNotRetained,
            Problem::Internal,
            Problem::CallerMissing,
            Problem::CallerInvalid,
            Problem::KeyUnguarded,
        ];
        let slugs: std::collections::HashSet<_> = all.iter().map(|p| p.slug()).collect();
        assert_eq!(slugs.len(), all.len());
    }
}
