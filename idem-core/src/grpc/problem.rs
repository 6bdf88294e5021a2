//! The layer's own answers: a gRPC status in a trailers-only response, with a
//! `google.rpc.ErrorInfo` in `grpc-status-details-bin` that says which.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response};
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use super::RETRY_PUSHBACK;
use crate::error::Error;

/// An answer the layer gives itself, without calling the handler (or, for
/// [`LeaseLost`](Self::LeaseLost), after it). It goes out as a gRPC status whose details
/// (`grpc-status-details-bin`, a `google.rpc.Status`) hold a `google.rpc.ErrorInfo` with the
/// domain `idem` and the [`reason`](Self::reason), so a client can tell the layer's answers
/// apart from the service's own.
///
/// ```
/// use idem_core::grpc::Problem;
/// use tonic::Code;
/// assert_eq!(Problem::KeyInFlight.code(), Code::Unavailable);
/// assert_eq!(Problem::KeyReused.code(), Code::FailedPrecondition);
/// assert_eq!(Problem::KeyReused.reason(), "IDEMPOTENCY_KEY_REUSED");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// `INVALID_ARGUMENT`: the method requires a key and the call has none.
    KeyMissing,
    /// `INVALID_ARGUMENT`: the key is not 1 to 255 printable ASCII characters, the metadata
    /// entry came twice, or the key field could not be read from the request message.
    KeyMalformed,
    /// `UNAVAILABLE` with `grpc-retry-pushback-ms`: a call with the same key is still running
    /// (or, in wait mode, was still running when the wait ended). Retry unchanged after the
    /// pushback.
    KeyInFlight,
    /// `FAILED_PRECONDITION`: the key was used before for another call (another method or
    /// request message). Not retryable: send a new key for a new request.
    KeyReused,
    /// `RESOURCE_EXHAUSTED`: the request message is larger than the layer reads to fingerprint
    /// it. Nothing ran.
    MessageTooLarge,
    /// `INVALID_ARGUMENT`: the request is not one length-prefixed message, or its body failed
    /// while it was read. Nothing ran.
    MessageUnreadable,
    /// `UNAVAILABLE` with `grpc-retry-pushback-ms: 1000`: the idempotency store cannot be
    /// reached. Nothing ran; retry later.
    StoreUnavailable,
    /// `INTERNAL`: the handler ran, but its claim on the key was taken over before the response
    /// could be stored, so the call may have run twice. Check the effect before retrying.
    LeaseLost,
    /// `FAILED_PRECONDITION`: the first call with this key ran, but its response was not kept
    /// (larger than the engine's `max_response_bytes`, or a body that failed), so it cannot be
    /// replayed. The call does not run again: look up its effect instead of retrying.
    ResponseNotRetained,
    /// `INTERNAL`: anything else (a store error, an unreadable stored response). The details are
    /// logged, not sent.
    Internal,
    /// `UNAUTHENTICATED`: the layer scopes keys by the caller, and the
    /// [caller extractor](super::LayerBuilder::caller) found no identity in this call. Nothing
    /// ran.
    CallerMissing,
    /// `INVALID_ARGUMENT`: the caller identity the extractor returned cannot scope a key (empty,
    /// over 255 bytes, or a byte outside printable ASCII). Nothing ran.
    CallerInvalid,
}

impl Problem {
    /// The gRPC status code the problem goes out with.
    ///
    /// ```
    /// use idem_core::grpc::Problem;
    /// assert_eq!(Problem::CallerMissing.code(), tonic::Code::Unauthenticated);
    /// ```
    pub fn code(self) -> Code {
        match self {
            Problem::KeyMissing
            | Problem::KeyMalformed
            | Problem::MessageUnreadable
            | Problem::CallerInvalid => Code::InvalidArgument,
            Problem::KeyInFlight | Problem::StoreUnavailable => Code::Unavailable,
            Problem::KeyReused | Problem::ResponseNotRetained => Code::FailedPrecondition,
            Problem::MessageTooLarge => Code::ResourceExhausted,
            Problem::LeaseLost | Problem::Internal => Code::Internal,
            Problem::CallerMissing => Code::Unauthenticated,
        }
    }

    /// The `reason` of the `google.rpc.ErrorInfo` (domain `idem`) the status carries: a
    /// constant in UPPER_SNAKE_CASE, as AIP-193 asks.
    ///
    /// ```
    /// use idem_core::grpc::Problem;
    /// assert_eq!(Problem::ResponseNotRetained.reason(), "RESPONSE_NOT_RETAINED");
    /// ```
    pub fn reason(self) -> &'static str {
        match self {
            Problem::KeyMissing => "IDEMPOTENCY_KEY_MISSING",
            Problem::KeyMalformed => "IDEMPOTENCY_KEY_MALFORMED",
            Problem::KeyInFlight => "IDEMPOTENCY_KEY_IN_FLIGHT",
            Problem::KeyReused => "IDEMPOTENCY_KEY_REUSED",
            Problem::MessageTooLarge => "REQUEST_MESSAGE_TOO_LARGE",
            Problem::MessageUnreadable => "REQUEST_MESSAGE_UNREADABLE",
            Problem::StoreUnavailable => "IDEMPOTENCY_STORE_UNAVAILABLE",
            Problem::LeaseLost => "IDEMPOTENCY_LEASE_LOST",
            Problem::ResponseNotRetained => "RESPONSE_NOT_RETAINED",
            Problem::Internal => "IDEMPOTENCY_LAYER_FAILED",
            Problem::CallerMissing => "CALLER_MISSING",
            Problem::CallerInvalid => "CALLER_INVALID",
        }
    }

    /// The trailers-only response: `grpc-status`, `grpc-message` (the detail) and
    /// `grpc-status-details-bin`.
    pub(crate) fn response<B: Default>(self, detail: impl Into<String>) -> Response<B> {
        self.status(detail.into(), MetadataMap::new()).into_http()
    }

    /// [`response`](Self::response) with `grpc-retry-pushback-ms`: `after` in milliseconds,
    /// rounded up, at least 1 (gRPC reads 0 as "retry at once").
    pub(crate) fn retry_after<B: Default>(
        self,
        detail: impl Into<String>,
        after: Duration,
    ) -> Response<B> {
        let mut metadata = MetadataMap::new();
        metadata
            .as_mut()
            .insert(RETRY_PUSHBACK, HeaderValue::from(pushback_ms(after)));
        self.status(detail.into(), metadata).into_http()
    }

    fn status(self, detail: String, metadata: MetadataMap) -> Status {
        let details = status_details(self.code(), &detail, self.reason());
        Status::with_details_and_metadata(self.code(), detail, details, metadata)
    }
}

/// `after` in whole milliseconds, rounded up, at least 1.
fn pushback_ms(after: Duration) -> u64 {
    let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
    ms.saturating_add(u64::from(!after.subsec_nanos().is_multiple_of(1_000_000)))
        .max(1)
}

/// A `google.rpc.Status { code, message, details: [Any(google.rpc.ErrorInfo { reason, domain:
/// "idem" })] }`, encoded by hand: three messages of a few fields do not need a protobuf
/// library.
fn status_details(code: Code, message: &str, reason: &str) -> Bytes {
    let mut info = Vec::new();
    field(&mut info, 1, reason.as_bytes());
    field(&mut info, 2, b"idem");
    let mut any = Vec::new();
    field(&mut any, 1, b"type.googleapis.com/google.rpc.ErrorInfo");
    field(&mut any, 2, &info);
    let mut status = Vec::new();
    // code = 1, a varint (status codes are 0..=16).
    status.extend_from_slice(&[0x08, code as u8]);
    field(&mut status, 2, message.as_bytes());
    field(&mut status, 3, &any);
    Bytes::from(status)
}

/// A length-delimited field: tag, length, bytes.
fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
    out.push(number << 3 | 2);
    let mut len = bytes.len();
    while len >= 0x80 {
        out.push((len & 0x7f) as u8 | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(bytes);
}

/// The answer to an engine error met while claiming, running or completing a call.
pub(crate) fn from_engine<B: Default>(error: Error) -> Response<B> {
    match error {
        Error::Locked { retry_after } => Problem::KeyInFlight.retry_after(
            "a call with the same idempotency key is being processed; retry after the \
             grpc-retry-pushback-ms delay",
            retry_after,
        ),
        Error::KeyReused => Problem::KeyReused.response(
            "this idempotency key was used for a call with another method or request message; \
             send a new key for a new request",
        ),
        Error::ResultNotRetained { reason } => Problem::ResponseNotRetained.response(format!(
            "the call with this idempotency key already ran, but its response was not kept \
             ({reason}); it will not run again: look up its effect instead of retrying"
        )),
        Error::Store(e) if e.kind().is_transient() => {
            tracing::warn!(error = %e, "idempotency store unavailable");
            Problem::StoreUnavailable.retry_after(
                "the idempotency store cannot be reached; the call did not run, retry later",
                Duration::from_secs(1),
            )
        }
        Error::LeaseLost => {
            tracing::error!("idempotency lease lost while the handler ran; it may have run twice");
            Problem::LeaseLost.response(
                "the call ran, but its idempotency record was taken over before the response \
                 was stored; it may have run twice, so check its effect before retrying",
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
    fn pushback_rounds_up() {
        assert_eq!(pushback_ms(Duration::ZERO), 1);
        assert_eq!(pushback_ms(Duration::from_micros(1500)), 2);
        assert_eq!(pushback_ms(Duration::from_millis(250)), 250);
    }

    #[test]
    fn responses_are_trailers_only() {
        let r: Response<()> = Problem::KeyInFlight.retry_after("busy", Duration::from_millis(20));
        assert_eq!(r.headers()["grpc-status"], "14");
        assert_eq!(r.headers()["grpc-retry-pushback-ms"], "20");
        let status = Status::from_header_map(r.headers()).unwrap();
        assert_eq!(status.message(), "busy");
        let details = status.details();
        assert_eq!(&details[..2], &[0x08, 14]);
        let text = String::from_utf8_lossy(details);
        assert!(text.contains("IDEMPOTENCY_KEY_IN_FLIGHT"), "{text}");
        assert!(text.contains("google.rpc.ErrorInfo"), "{text}");
    }
}
