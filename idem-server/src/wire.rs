//! Diom's wire format over HTTP: JSON or MessagePack chosen by `Content-Type` (requests) and
//! `Accept` (responses), and Diom's error body with its status codes. The bodies themselves are
//! idem-wire's types, which `RemoteStore` sends and reads too. Request bodies are decoded as
//! Diom decodes them (serde with the path of the failing field), so a body Diom refuses is
//! refused here with the same status, code, detail and location.

use std::fmt;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use idem_wire::{msgpack, ErrorBody, ErrorType};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The two encodings Diom speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json`.
    Json,
    /// `application/msgpack` (maps with field names, as [`idem_wire::msgpack`] writes them).
    MsgPack,
}

const MSGPACK: &str = msgpack::CONTENT_TYPE;

fn names_msgpack(value: Option<&HeaderValue>) -> bool {
    value.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(',').any(|part| {
            let essence = part.split(';').next().unwrap_or("").trim();
            essence.eq_ignore_ascii_case(MSGPACK)
        })
    })
}

impl Format {
    /// The request body's encoding, as Diom reads `Content-Type`: `application/json` or
    /// `application/msgpack` (parameters such as `charset` aside). Anything else is refused
    /// as Diom refuses it: `400 missing_content_type` without the header,
    /// `400 invalid_content_type` with another type.
    ///
    /// ```
    /// use axum::http::{header, HeaderMap, HeaderValue};
    /// use idem_server::wire::Format;
    /// let mut headers = HeaderMap::new();
    /// assert_eq!(Format::of_request(&headers).unwrap_err().body.code, "missing_content_type");
    /// headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
    /// assert_eq!(Format::of_request(&headers)?, Format::Json);
    /// headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    /// assert_eq!(Format::of_request(&headers).unwrap_err().body.code, "invalid_content_type");
    /// # Ok::<(), idem_server::wire::ApiError>(())
    /// ```
    pub fn of_request(headers: &HeaderMap) -> Result<Format, ApiError> {
        let Some(value) = headers.get(header::CONTENT_TYPE) else {
            return Err(ApiError::content_type("missing_content_type"));
        };
        let parsed: Option<mime::Mime> = value.to_str().ok().and_then(|v| v.parse().ok());
        match parsed {
            Some(m) if m.type_() == mime::APPLICATION && m.subtype() == "msgpack" => {
                Ok(Format::MsgPack)
            }
            Some(m) if m.type_() == mime::APPLICATION && m.subtype() == mime::JSON => {
                Ok(Format::Json)
            }
            _ => Err(ApiError::content_type("invalid_content_type")),
        }
    }

    /// The response's encoding: MessagePack when `Accept` names it, or when there is no
    /// `Accept` and the request's `Content-Type` is MessagePack (as Diom chooses); JSON
    /// otherwise.
    pub fn of_response(headers: &HeaderMap) -> Format {
        let accept = headers.get(header::ACCEPT);
        if names_msgpack(accept)
            || (accept.is_none()
                && headers
                    .get(header::CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes() == MSGPACK.as_bytes()))
        {
            Format::MsgPack
        } else {
            Format::Json
        }
    }

    /// Decodes a request body as Diom does: a value of the wrong type or refused by its field
    /// (a bad key, a zero period; a missing field, at `.`) is `422 invalid_data` at the
    /// field's path, with serde's words (in JSON, and the line and column); bytes that are
    /// not JSON or MessagePack are `400 invalid_encoding`. Like Diom, bytes after the JSON
    /// value are not read.
    ///
    /// ```
    /// use idem_server::wire::Format;
    /// use idem_wire::StartIn;
    /// let e = Format::Json.decode::<StartIn>(br#"{"key":"k","lock_period_ms":0}"#).unwrap_err();
    /// assert_eq!((e.status.as_u16(), e.body.code.as_str(), e.body.location.as_deref()), (422, "invalid_data", Some("lock_period_ms")));
    /// assert_eq!(e.body.detail, "invalid value: integer `0`, expected a nonzero u64 at line 1 column 29");
    /// let e = Format::Json.decode::<StartIn>(b"{").unwrap_err();
    /// assert_eq!((e.status.as_u16(), e.body.code.as_str(), e.body.location), (400, "invalid_encoding", None));
    /// ```
    pub fn decode<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, ApiError> {
        match self {
            Format::Json => {
                let mut de = serde_json::Deserializer::from_slice(bytes);
                serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    let location = e.path().to_string();
                    let inner = e.into_inner();
                    match inner.classify() {
                        serde_json::error::Category::Data => ApiError::invalid(&location, inner),
                        // An I/O error cannot come from a slice.
                        serde_json::error::Category::Io
                        | serde_json::error::Category::Syntax
                        | serde_json::error::Category::Eof => ApiError::invalid_encoding(inner),
                    }
                })
            }
            Format::MsgPack => {
                let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
                serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    let location = e.path().to_string();
                    match e.inner() {
                        // A value of the wrong type, or one its field refuses (serde's own
                        // errors, which rmp_serde calls `Syntax`): Diom 0.2.6 answers these
                        // `invalid_data` at the field, in MessagePack as in JSON.
                        rmp_serde::decode::Error::TypeMismatch(_)
                        | rmp_serde::decode::Error::Syntax(_) => {
                            ApiError::invalid(&location, e.inner())
                        }
                        other => ApiError::invalid_encoding(other),
                    }
                })
            }
        }
    }

    /// A response with `status` and `body` in this encoding.
    pub fn respond<T: Serialize>(self, status: StatusCode, body: &T) -> Response {
        let encoded = match self {
            Format::Json => serde_json::to_vec(body).map_err(|e| e.to_string()),
            Format::MsgPack => msgpack::to_vec(body).map_err(|e| e.to_string()),
        };
        let content_type = match self {
            Format::Json => "application/json",
            Format::MsgPack => MSGPACK,
        };
        match encoded {
            Ok(bytes) => (
                status,
                [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
                Body::from(bytes),
            )
                .into_response(),
            // Only a bug could get here (every body is plain data): say so in Diom's shape.
            Err(e) => {
                tracing::error!(error = %e, "a response could not be encoded");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
                    Body::from(
                        r#"{"type":"server-error","code":"server_error","detail":"response serialization error","location":null}"#,
                    ),
                )
                    .into_response()
            }
        }
    }
}

/// An error answer: its status and Diom's error body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body: Diom's `{type, code, detail, location}` and the fenced extension's fields; boxed, so
    /// a `Result` with it stays small.
    pub body: Box<ErrorBody>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let body = &self.body;
        write!(f, "{} {}: {}", self.status.as_u16(), body.code, body.detail)?;
        if let Some(location) = &body.location {
            write!(f, " (at {location})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    fn of(
        status: StatusCode,
        kind: ErrorType,
        code: &'static str,
        detail: impl fmt::Display,
    ) -> ApiError {
        ApiError {
            status,
            body: Box::new(ErrorBody::new(kind, code, detail.to_string())),
        }
    }

    fn input(status: StatusCode, code: &'static str, detail: impl fmt::Display) -> ApiError {
        ApiError::of(status, ErrorType::InvalidInput, code, detail)
    }

    /// `422 invalid_data`: the value at `location` (a field's path, `lock_period_ms`) is
    /// refused.
    pub fn invalid(location: &str, detail: impl fmt::Display) -> ApiError {
        let mut e = ApiError::input(StatusCode::UNPROCESSABLE_ENTITY, "invalid_data", detail);
        e.body.location = Some(location.to_owned());
        e
    }

    /// `400 invalid_encoding`: the body is not JSON or MessagePack.
    pub fn invalid_encoding(detail: impl fmt::Display) -> ApiError {
        ApiError::input(StatusCode::BAD_REQUEST, "invalid_encoding", detail)
    }

    /// `400 missing_content_type` or `400 invalid_content_type`, Diom's answers.
    pub fn content_type(code: &'static str) -> ApiError {
        ApiError::input(
            StatusCode::BAD_REQUEST,
            code,
            "Expected request with `content-type: application/msgpack` or `content-type: application/json`",
        )
    }

    /// `413 payload_too_large`: the body is over the server's limit.
    pub fn payload_too_large() -> ApiError {
        ApiError::input(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "Request payload is too large.",
        )
    }

    /// An operation error with its own status and code.
    pub fn operation(status: StatusCode, code: &'static str, detail: impl fmt::Display) -> Self {
        ApiError::of(status, ErrorType::OperationError, code, detail)
    }

    /// A server error with its own status and code.
    pub fn server(status: StatusCode, code: &'static str, detail: impl fmt::Display) -> Self {
        ApiError::of(status, ErrorType::ServerError, code, detail)
    }

    /// `400 not_found`, Diom's answer to an unknown namespace.
    pub fn not_found() -> ApiError {
        ApiError::operation(StatusCode::BAD_REQUEST, "not_found", "Entity not found")
    }

    /// `401 auth_required`: no `Authorization: Bearer TOKEN` header.
    pub fn auth_required() -> ApiError {
        ApiError::operation(
            StatusCode::UNAUTHORIZED,
            "auth_required",
            "`Authorization` header required",
        )
    }

    /// `401 invalid_token`: a bearer token the server does not know.
    pub fn invalid_token() -> ApiError {
        ApiError::operation(StatusCode::UNAUTHORIZED, "invalid_token", "Invalid token.")
    }

    /// `403 forbidden`: a caller token asked for `action` on `resource`, which takes the admin
    /// token (Diom's detail).
    pub fn forbidden(action: &str, resource: &str) -> ApiError {
        ApiError::operation(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("You do not have permission to perform `{action}` on `{resource}`"),
        )
    }

    /// The answer in `format`.
    pub fn respond(&self, format: Format) -> Response {
        format.respond(self.status, &self.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_always_carries_its_location() {
        let body = serde_json::to_value(ApiError::not_found().body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"type": "operation-error", "code": "not_found",
                "detail": "Entity not found", "location": null})
        );
    }

    #[test]
    fn accept_and_content_type_choose_the_encoding() {
        let mut headers = HeaderMap::new();
        assert!(Format::of_request(&headers).is_err());
        assert_eq!(Format::of_response(&headers), Format::Json);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/msgpack"),
        );
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html, application/msgpack;q=0.9"),
        );
        assert_eq!(Format::of_request(&headers).unwrap(), Format::MsgPack);
        assert_eq!(Format::of_response(&headers), Format::MsgPack);
        // No Accept: the answer is in the request's encoding when that is MessagePack.
        headers.remove(header::ACCEPT);
        assert_eq!(Format::of_response(&headers), Format::MsgPack);
        for refused in [
            "application/x-msgpack",
            "text/json",
            "application/problem+json",
            "json",
        ] {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(refused));
            assert_eq!(
                Format::of_request(&headers).unwrap_err().body.code,
                "invalid_content_type",
                "{refused}"
            );
        }
    }
}
