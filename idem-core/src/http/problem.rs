//! The layer's own error responses: `application/problem+json` (RFC 9457).

use std::fmt;
use std::time::Duration;

use axum_core::body::Body;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::error::Error;

/// A problem the layer answers itself, without calling the handler (or, for
/// [`LeaseLost`](Self::LeaseLost), after it). The body is `application/problem+json` with
/// `type`, `title`, `status` and `detail`; `type` is the documentation link of the variant.
///
/// ```
/// use idem_core::http::Problem;
/// assert_eq!(Problem::KeyReused.status(), 422);
/// assert_eq!(Problem::KeyInFlight.title(), "A request with this Idempotency-Key is in progress");
/// assert!(Problem::KeyMissing.type_uri().ends_with("#variant.KeyMissing"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// 400: the method requires an `Idempotency-Key` and the request has none.
    KeyMissing,
    /// 400: the `Idempotency-Key` is not one structured-field string of 1 to 255 characters.
    KeyMalformed,
    /// 409 with `Retry-After`: another request with the same key is still running (or, in wait
    /// mode, was still running when the wait ended). Retry unchanged.
    KeyInFlight,
    /// 422: the key was used before for a different request (method, path, query or body).
    /// Send a new key for a new request.
    KeyReused,
    /// 413: the request body is larger than the layer buffers for fingerprinting. Nothing ran
    /// and nothing was stored.
    BodyTooLarge,
    /// 400: the request body could not be read (the client went away or sent a broken body).
    BodyUnreadable,
    /// 503: the idempotency store cannot be reached. Nothing ran; retry later.
    StoreUnavailable,
    /// 500: the handler ran, but its claim on the key was taken over before the response could
    /// be stored, so the request may have run twice. Check the resource before retrying.
    LeaseLost,
    /// 422: the first request with this key ran, but its response was not kept (larger than the
    /// engine's `max_response_bytes`, or with trailers, or a body that failed), so it cannot be
    /// replayed. The request is not run again: look up its effect (read the resource it created)
    /// instead of retrying.
    ResponseNotRetained,
    /// 500: anything else (a store error, an unreadable stored response, an invalid caller
    /// identity). The details are logged, not sent.
    Internal,
}

impl Problem {
    /// The HTTP status of the response.
    ///
    /// ```
    /// use idem_core::http::Problem;
    /// assert_eq!(Problem::BodyTooLarge.status(), 413);
    /// ```
    pub fn status(self) -> StatusCode {
        match self {
            Problem::KeyMissing | Problem::KeyMalformed | Problem::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Problem::KeyInFlight => StatusCode::CONFLICT,
            Problem::KeyReused | Problem::ResponseNotRetained => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::LeaseLost | Problem::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The problem's short, fixed summary (the `title` member).
    ///
    /// ```
    /// use idem_core::http::Problem;
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
        }
    }

    /// The problem type (the `type` member): a link to this variant's documentation.
    ///
    /// ```
    /// use idem_core::http::Problem;
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
        }
    }

    /// The response: status, `Content-Type: application/problem+json` and the JSON body.
    pub(crate) fn response(self, detail: impl fmt::Display) -> Response<Body> {
        let body = ProblemBody {
            kind: self.type_uri(),
            title: self.title(),
            status: self.status().as_u16(),
            detail: detail.to_string(),
        };
        // Serializing four plain fields cannot fail; the fallback keeps the path panic-free.
        let json = serde_json::to_vec(&body).unwrap_or_default();
        let mut response = Response::new(Body::from(json));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }

    /// [`response`](Self::response) with `Retry-After` in whole seconds, at least 1.
    pub(crate) fn retry_after(self, detail: impl fmt::Display, after: Duration) -> Response<Body> {
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        let mut response = self.response(detail);
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
        response
    }
}

/// The members of an RFC 9457 problem, in the order readers expect them.
#[derive(serde::Serialize)]
struct ProblemBody {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: String,
}

/// The response for an engine error met while claiming, running or completing a request.
pub(crate) fn from_engine(error: Error) -> Response<Body> {
    match error {
        Error::Locked { retry_after } => Problem::KeyInFlight.retry_after(
            "a request with the same Idempotency-Key is being processed; retry after the \
             Retry-After delay",
            retry_after,
        ),
        Error::KeyReused => Problem::KeyReused.response(
            "this Idempotency-Key was used for a request with another method, path or body; \
             send a new key for a new request",
        ),
        Error::ResultNotRetained { reason } => Problem::ResponseNotRetained.response(format!(
            "the request with this Idempotency-Key already ran, but its response was not kept \
             ({reason}); it will not run again: look up its effect instead of retrying"
        )),
        Error::Store(e) if e.kind().is_transient() => {
            tracing::warn!(error = %e, "idempotency store unavailable");
            Problem::StoreUnavailable.retry_after(
                "the idempotency store cannot be reached; the request did not run, retry later",
                Duration::from_secs(1),
            )
        }
        Error::LeaseLost => {
            tracing::error!("idempotency lease lost while the handler ran; it may have run twice");
            Problem::LeaseLost.response(
                "the request ran, but its idempotency record was taken over before the response \
                 was stored; it may have run twice, so check the resource before retrying",
            )
        }
        other => {
            tracing::error!(error = %other, "idempotency layer failed");
            Problem::Internal.response("the idempotency layer failed; the error is logged")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up() {
        let r = Problem::KeyInFlight.retry_after("x", Duration::from_millis(1500));
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        let r = Problem::KeyInFlight.retry_after("x", Duration::ZERO);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
    }

    #[tokio::test]
    async fn body_is_a_problem_document() {
        use http_body_util::BodyExt;
        let r = Problem::KeyMissing.response("send one");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&body).unwrap();
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
}
