//! How the gRPC layer says a [`Problem`]: a gRPC status in a trailers-only response, with a
//! `google.rpc.ErrorInfo` in `grpc-status-details-bin` that says which.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response};
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use super::RETRY_PUSHBACK;
use crate::problem::Problem;
use idem_core::Error;

impl Problem {
    /// The gRPC status code the problem goes out with.
    ///
    /// ```
    /// use idem::grpc::Problem;
    /// assert_eq!(Problem::CallerMissing.code(), tonic::Code::Unauthenticated);
    /// ```
    pub fn code(self) -> Code {
        match self {
            Problem::KeyMissing
            | Problem::KeyMalformed
            | Problem::BodyUnreadable
            | Problem::CallerInvalid => Code::InvalidArgument,
            Problem::KeyInFlight | Problem::StoreUnavailable => Code::Unavailable,
            Problem::KeyReused
            | Problem::ResponseNotRetained
            | Problem::PolicyChanged
            | Problem::OperationAbandoned => Code::FailedPrecondition,
            Problem::OperationUncertain => Code::Aborted,
            Problem::ResultExpired => Code::AlreadyExists,
            Problem::BodyTooLarge => Code::ResourceExhausted,
            Problem::LeaseLost | Problem::Internal | Problem::KeyUnguarded => Code::Internal,
            Problem::CallerMissing => Code::Unauthenticated,
        }
    }

    /// The `reason` of the `google.rpc.ErrorInfo` (domain `idem`) the status carries: a
    /// constant in UPPER_SNAKE_CASE, as AIP-193 asks.
    ///
    /// ```
    /// use idem::grpc::Problem;
    /// assert_eq!(Problem::ResponseNotRetained.reason(), "RESPONSE_NOT_RETAINED");
    /// ```
    pub fn reason(self) -> &'static str {
        match self {
            Problem::KeyMissing => "IDEMPOTENCY_KEY_MISSING",
            Problem::KeyMalformed => "IDEMPOTENCY_KEY_MALFORMED",
            Problem::KeyInFlight => "IDEMPOTENCY_KEY_IN_FLIGHT",
            Problem::KeyReused => "IDEMPOTENCY_KEY_REUSED",
            Problem::BodyTooLarge => "REQUEST_MESSAGE_TOO_LARGE",
            Problem::BodyUnreadable => "REQUEST_MESSAGE_UNREADABLE",
            Problem::StoreUnavailable => "IDEMPOTENCY_STORE_UNAVAILABLE",
            Problem::LeaseLost => "IDEMPOTENCY_LEASE_LOST",
            Problem::ResponseNotRetained => "RESPONSE_NOT_RETAINED",
            Problem::Internal => "IDEMPOTENCY_LAYER_FAILED",
            Problem::CallerMissing => "CALLER_MISSING",
            Problem::CallerInvalid => "CALLER_INVALID",
            Problem::KeyUnguarded => "IDEMPOTENCY_KEY_UNGUARDED",
            Problem::OperationUncertain => "OPERATION_UNCERTAIN",
            Problem::ResultExpired => "RESULT_EXPIRED",
            Problem::PolicyChanged => "POLICY_CHANGED",
            Problem::OperationAbandoned => "OPERATION_ABANDONED",
        }
    }

    /// The trailers-only response: `grpc-status`, `grpc-message` (the detail) and
    /// `grpc-status-details-bin`.
    pub(crate) fn grpc_response<B: Default>(self, detail: impl Into<String>) -> Response<B> {
        self.grpc_status(detail.into(), MetadataMap::new(), &[])
            .into_http()
    }

    /// [`grpc_response`](Self::grpc_response) whose `ErrorInfo` carries `metadata` (for
    /// [`OperationUncertain`](Self::OperationUncertain), the `operation` it names).
    pub(crate) fn grpc_response_about<B: Default>(
        self,
        detail: impl Into<String>,
        metadata: &[(&str, &str)],
    ) -> Response<B> {
        self.grpc_status(detail.into(), MetadataMap::new(), metadata)
            .into_http()
    }

    /// [`grpc_response`](Self::grpc_response) with `grpc-retry-pushback-ms`: `after` in milliseconds,
    /// rounded up, at least 1 (gRPC reads 0 as "retry at once").
    pub(crate) fn grpc_retry_after<B: Default>(
        self,
        detail: impl Into<String>,
        after: Duration,
    ) -> Response<B> {
        let mut metadata = MetadataMap::new();
        metadata
            .as_mut()
            .insert(RETRY_PUSHBACK, HeaderValue::from(pushback_ms(after)));
        self.grpc_status(detail.into(), metadata, &[]).into_http()
    }

    fn grpc_status(self, detail: String, metadata: MetadataMap, info: &[(&str, &str)]) -> Status {
        let details = status_details(self.code(), &detail, self.reason(), info);
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
/// "idem", metadata })] }`, encoded by hand: three messages of a few fields do not need a
/// protobuf library.
fn status_details(code: Code, message: &str, reason: &str, metadata: &[(&str, &str)]) -> Bytes {
    let mut info = Vec::new();
    field(&mut info, 1, reason.as_bytes());
    field(&mut info, 2, b"idem");
    // `map<string, string> metadata = 3`: one entry message per pair.
    for (key, value) in metadata {
        let mut entry = Vec::new();
        field(&mut entry, 1, key.as_bytes());
        field(&mut entry, 2, value.as_bytes());
        field(&mut info, 3, &entry);
    }
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
        Error::Locked { retry_after } => Problem::KeyInFlight.grpc_retry_after(
            "a call with the same idempotency key is being processed; retry after the \
             grpc-retry-pushback-ms delay",
            retry_after,
        ),
        Error::KeyReused => Problem::KeyReused.grpc_response(
            "this idempotency key was used for a call with another method or request message; \
             send a new key for a new request",
        ),
        Error::ResultNotRetained { reason } => Problem::ResponseNotRetained.grpc_response(format!(
            "the call with this idempotency key already ran, but its response was not kept \
             ({reason}); it will not run again: look up its effect instead of retrying"
        )),
        Error::Uncertain { operation, .. } => {
            tracing::warn!(%operation, "idempotency: a call met an uncertain operation");
            let operation = operation.to_string();
            Problem::OperationUncertain.grpc_response_about(
                format!(
                    "the call with this idempotency key began work whose effect must not repeat, \
                     and stopped before its response was stored: whether it took effect is \
                     unknown, so it will not run again until operation {operation} is resolved; \
                     do not retry, with this key or another"
                ),
                &[("operation", &operation)],
            )
        }
        Error::ResultExpired { .. } => Problem::ResultExpired.grpc_response(
            "the call with this idempotency key already ran and its response has expired; it will \
             not run again: look up its effect, or send a new key for a new request",
        ),
        Error::PolicyChanged { stored, current } => Problem::PolicyChanged.grpc_response(format!(
            "this idempotency key was first used under request policy {stored}, and this call \
             differs from that one as policy {current} sees it; nothing ran: send a new key for a \
             new request"
        )),
        Error::Abandoned { reason } => Problem::OperationAbandoned.grpc_response(format!(
            "the call with this idempotency key was resolved as abandoned ({reason}); it will not \
             run again"
        )),
        Error::Store(e) if e.kind().is_transient() => {
            tracing::warn!(error = %e, "idempotency store unavailable");
            Problem::StoreUnavailable.grpc_retry_after(
                "the idempotency store cannot be reached; the call did not run, retry later",
                Duration::from_secs(1),
            )
        }
        Error::LeaseLost => {
            tracing::error!("idempotency lease lost while the handler ran; it may have run twice");
            Problem::LeaseLost.grpc_response(
                "the call ran, but its idempotency record was taken over before the response \
                 was stored; it may have run twice, so check its effect before retrying",
            )
        }
        other => {
            tracing::error!(error = %other, "idempotency layer failed");
            Problem::Internal.grpc_response("the idempotency layer failed; the error is logged")
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
        let r: Response<()> =
            Problem::KeyInFlight.grpc_retry_after("busy", Duration::from_millis(20));
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
