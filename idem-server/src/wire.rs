//! Diom's wire format: JSON or MessagePack chosen by `Content-Type` (requests) and `Accept`
//! (responses), the request and result bodies, and Diom's error body `{type, code, detail,
//! location}` with its status codes. Request bodies are decoded as Diom decodes them (serde with
//! the path of the failing field), so a body Diom refuses is refused here with the same status,
//! code, detail and location.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU64;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::keys::{entity_key, namespace_name, optional_namespace_name};

/// The two encodings Diom speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json`.
    Json,
    /// `application/msgpack` (maps with field names, as `rmp_serde::to_vec_named`).
    MsgPack,
}

const MSGPACK: &str = "application/msgpack";

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
    /// assert_eq!(Format::of_request(&headers).unwrap_err().code, "missing_content_type");
    /// headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
    /// assert_eq!(Format::of_request(&headers)?, Format::Json);
    /// headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    /// assert_eq!(Format::of_request(&headers).unwrap_err().code, "invalid_content_type");
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
    /// use idem_server::wire::{Format, StartIn};
    /// let e = Format::Json.decode::<StartIn>(br#"{"key":"k","lock_period_ms":0}"#).unwrap_err();
    /// assert_eq!((e.status.as_u16(), e.code, e.location.as_deref()), (422, "invalid_data", Some("lock_period_ms")));
    /// assert_eq!(e.detail, "invalid value: integer `0`, expected a nonzero u64 at line 1 column 29");
    /// let e = Format::Json.decode::<StartIn>(b"{").unwrap_err();
    /// assert_eq!((e.status.as_u16(), e.code, e.location), (400, "invalid_encoding", None));
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
            Format::MsgPack => rmp_serde::to_vec_named(body).map_err(|e| e.to_string()),
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

/// The class of an error, as Diom's clients sort it (`InvalidInput`, `OperationError`,
/// `ServerError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorType {
    /// The request itself is wrong: fixing it is the caller's job.
    InvalidInput,
    /// The request was understood and refused (unknown namespace, authentication, a stale
    /// holder).
    OperationError,
    /// The server or its store failed: a retry may succeed.
    ServerError,
}

/// An error answer: its status and Diom's error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApiError {
    /// The HTTP status.
    #[serde(skip)]
    pub status: StatusCode,
    /// The class of error.
    #[serde(rename = "type")]
    pub kind: ErrorType,
    /// A stable identifier of the condition.
    pub code: &'static str,
    /// What happened, for a person.
    pub detail: String,
    /// The path of the field the invalid input is at (`lock_period_ms`, `context.status`), as
    /// Diom names it, for `invalid_data`. Always present, `null` when there is none: Diom's
    /// Python client requires the field.
    pub location: Option<String>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.detail)?;
        if let Some(location) = &self.location {
            write!(f, " (at {location})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    fn input(status: StatusCode, code: &'static str, detail: impl fmt::Display) -> ApiError {
        ApiError {
            status,
            kind: ErrorType::InvalidInput,
            code,
            detail: detail.to_string(),
            location: None,
        }
    }

    /// `422 invalid_data`: the value at `location` (a field's path, `lock_period_ms`) is
    /// refused.
    pub fn invalid(location: &str, detail: impl fmt::Display) -> ApiError {
        ApiError {
            location: Some(location.to_owned()),
            ..ApiError::input(StatusCode::UNPROCESSABLE_ENTITY, "invalid_data", detail)
        }
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
        ApiError {
            status,
            kind: ErrorType::OperationError,
            code,
            detail: detail.to_string(),
            location: None,
        }
    }

    /// A server error with its own status and code.
    pub fn server(status: StatusCode, code: &'static str, detail: impl fmt::Display) -> Self {
        ApiError {
            status,
            kind: ErrorType::ServerError,
            code,
            detail: detail.to_string(),
            location: None,
        }
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
        format.respond(self.status, self)
    }
}

/// `POST /api/v1.idempotency.start`.
#[derive(Debug, Deserialize)]
pub struct StartIn {
    /// The namespace; the default one when absent.
    #[serde(default, deserialize_with = "optional_namespace_name")]
    pub namespace: Option<String>,
    /// The caller's idempotency key.
    #[serde(deserialize_with = "entity_key")]
    pub key: String,
    /// How long the lock holds without a renewal (at least 1).
    pub lock_period_ms: NonZeroU64,
    /// Fenced extension: what the request was; a later start with the same key and another
    /// fingerprint gets `fingerprint_mismatch`.
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// Fenced extension: the request's fingerprint as its SHA-256, 64 hexadecimal digits,
    /// kept as it is (`fingerprint` is hashed first). What `RemoteStore` sends: its callers'
    /// fingerprints are digests already. At most one of the two.
    #[serde(default)]
    pub fingerprint_sha256: Option<String>,
    /// Fenced extension: answer `started` with the claim's token (and `locked` with
    /// `retry_after_ms` and `lease_left_ms`). Implied by a fingerprint.
    #[serde(default)]
    pub fenced: bool,
}

/// `POST /api/v1.idempotency.complete`.
#[derive(Debug, Deserialize)]
pub struct CompleteIn {
    /// The namespace; the default one when absent.
    #[serde(default, deserialize_with = "optional_namespace_name")]
    pub namespace: Option<String>,
    /// The caller's idempotency key.
    #[serde(deserialize_with = "entity_key")]
    pub key: String,
    /// The response to keep and replay.
    #[serde(with = "serde_bytes")]
    pub response: Vec<u8>,
    /// Strings kept with the response (a status code, headers).
    #[serde(default)]
    pub context: Option<HashMap<String, String>>,
    /// How long the response replays (at least 1).
    pub ttl_ms: NonZeroU64,
    /// Fenced extension: the claim's token from `start`.
    #[serde(default)]
    pub token: Option<String>,
    /// Fenced extension: the response is an error the work returned (replayed as one).
    #[serde(default)]
    pub is_error: bool,
    /// Fenced extension: the work completed without a response (`response` is then empty).
    #[serde(default)]
    pub absent: bool,
    /// Fenced extension, with `token`: answer `{}` only once the response is in the store; a
    /// store failure that passes is then `503 store_unavailable` (retry with the same token),
    /// where without it the server stores the response in the background and answers `{}`.
    #[serde(default)]
    pub observed: bool,
}

/// `POST /api/v1.idempotency.abort`.
#[derive(Debug, Deserialize)]
pub struct AbortIn {
    /// The namespace; the default one when absent.
    #[serde(default, deserialize_with = "optional_namespace_name")]
    pub namespace: Option<String>,
    /// The caller's idempotency key.
    #[serde(deserialize_with = "entity_key")]
    pub key: String,
    /// Fenced extension: the claim's token from `start`.
    #[serde(default)]
    pub token: Option<String>,
}

/// `POST /api/v1.idempotency.renew` (fenced extension).
#[derive(Debug, Deserialize)]
pub struct RenewIn {
    /// The namespace; the default one when absent.
    #[serde(default, deserialize_with = "optional_namespace_name")]
    pub namespace: Option<String>,
    /// The caller's idempotency key.
    #[serde(deserialize_with = "entity_key")]
    pub key: String,
    /// The claim's token from `start`.
    pub token: String,
    /// The lock's new period, from now (at least 1).
    pub lock_period_ms: NonZeroU64,
}

/// `POST /api/v1.idempotency.namespace.configure`.
#[derive(Debug, Deserialize)]
pub struct ConfigureIn {
    /// The namespace's name.
    #[serde(deserialize_with = "namespace_name")]
    pub name: String,
    /// Fenced extension: refuse complete and abort without a token in this namespace. Absent:
    /// unchanged (off for a new namespace).
    #[serde(default)]
    pub require_token: Option<bool>,
}

/// `POST /api/v1.idempotency.namespace.get`.
#[derive(Debug, Deserialize)]
pub struct GetNamespaceIn {
    /// The namespace's name.
    #[serde(deserialize_with = "namespace_name")]
    pub name: String,
}

/// What `start` answers: `{"status": "started" | "locked" | "completed", "data": …}`.
#[derive(Debug, Serialize)]
pub struct StartOut {
    /// `started`, `locked` or `completed`.
    pub status: &'static str,
    /// The stored response, for `completed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<CompletedOut>,
    /// Fenced extension: the claim's token, for `started` when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Fenced extension: when to try again, for `locked` when asked for: the engine's
    /// estimate of the holder's work, within what is left of its lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Fenced extension: what is left of the holder's lease, for `locked` when asked for (as
    /// the store reported it; absent when the key changed before it was read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_left_ms: Option<u64>,
}

impl StartOut {
    /// An answer of `status` with no other field.
    ///
    /// ```
    /// let locked = idem_server::wire::StartOut::of("locked");
    /// assert_eq!(serde_json::to_value(&locked)?, serde_json::json!({"status": "locked"}));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn of(status: &'static str) -> StartOut {
        StartOut {
            status,
            data: None,
            token: None,
            retry_after_ms: None,
            lease_left_ms: None,
        }
    }
}

/// A completed key's response and context.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletedOut {
    /// The stored response.
    #[serde(with = "serde_bytes")]
    pub response: Vec<u8>,
    /// The stored context, if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<HashMap<String, String>>,
    /// Fenced extension: the response is an error the work returned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// Fenced extension: the work completed without a response.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub absent: bool,
    /// Fenced extension: when the response stops replaying, in Unix milliseconds (this node's
    /// clock when it completed the key; `get` answers the store's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

impl CompletedOut {
    /// The response as Diom has it: without the fenced extension's fields.
    ///
    /// ```
    /// use idem_server::wire::CompletedOut;
    /// let kept = CompletedOut { response: b"ok".to_vec(), is_error: true, expires_at_ms: Some(1), ..CompletedOut::default() };
    /// assert_eq!(serde_json::to_value(kept.diom())?, serde_json::json!({"response": [111, 107]}));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn diom(self) -> CompletedOut {
        CompletedOut {
            response: self.response,
            context: self.context,
            is_error: false,
            absent: false,
            expires_at_ms: None,
        }
    }
}

/// `POST /api/v1.idempotency.get` and `.evict` (fenced extension): a key of the caller's.
///
/// ```
/// let get: idem_server::wire::KeyIn = serde_json::from_str(r#"{"key": "order-1"}"#)?;
/// assert_eq!((get.key.as_str(), get.namespace), ("order-1", None));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Deserialize)]
pub struct KeyIn {
    /// The namespace; the default one when absent.
    #[serde(default, deserialize_with = "optional_namespace_name")]
    pub namespace: Option<String>,
    /// The caller's idempotency key.
    #[serde(deserialize_with = "entity_key")]
    pub key: String,
}

/// What `get` answers: `{"status": "absent" | "in_progress" | "completed", …}`.
///
/// ```
/// use idem_server::wire::GetOut;
/// let running = GetOut { lease_until_ms: Some(1_800_000_000_000), ..GetOut::of("in_progress") };
/// assert_eq!(serde_json::to_value(&running)?["lease_until_ms"], 1_800_000_000_000u64);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Default, Serialize)]
pub struct GetOut {
    /// `absent` (no live record), `in_progress` or `completed`.
    pub status: &'static str,
    /// The holder's claim token, for `in_progress`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// When the holder's lease ends, in Unix milliseconds on the store's clock, for
    /// `in_progress`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<u64>,
    /// The SHA-256 of the fingerprint the key was started with, if one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint_sha256: Option<String>,
    /// The stored response, for `completed` (empty when `not_retained`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<CompletedOut>,
    /// When the response stops replaying, in Unix milliseconds on the store's clock, for
    /// `completed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Why the response was not kept (it was larger than the server's limit), for `completed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_retained: Option<String>,
}

impl GetOut {
    /// An answer of `status` with no other field.
    ///
    /// ```
    /// let absent = idem_server::wire::GetOut::of("absent");
    /// assert_eq!(serde_json::to_value(&absent)?, serde_json::json!({"status": "absent"}));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn of(status: &'static str) -> GetOut {
        GetOut {
            status,
            ..GetOut::default()
        }
    }
}

/// What `evict` answers.
///
/// ```
/// let out = idem_server::wire::EvictOut { evicted: true };
/// assert_eq!(serde_json::to_value(&out)?, serde_json::json!({"evicted": true}));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Serialize)]
pub struct EvictOut {
    /// Whether the key had a record.
    pub evicted: bool,
}

/// `POST /api/v1.idempotency.prune` (fenced extension, admin).
///
/// ```
/// let prune: idem_server::wire::PruneIn = serde_json::from_str(r#"{"limit": 100}"#)?;
/// assert_eq!(prune.limit, 100);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Deserialize)]
pub struct PruneIn {
    /// The most records to delete.
    pub limit: u32,
}

/// What `prune` answers.
///
/// ```
/// let out = idem_server::wire::PruneOut { pruned: 3 };
/// assert_eq!(serde_json::to_value(&out)?, serde_json::json!({"pruned": 3}));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Serialize)]
pub struct PruneOut {
    /// How many ended records were deleted.
    pub pruned: u64,
}

/// `POST /api/v1.idempotency.steps.begin` (fenced extension).
///
/// ```
/// let body = r#"{"key": "ride-1", "token": "0123456789abcdef0123456789abcdef", "ttl_ms": 60000}"#;
/// let begin: idem_server::wire::StepsBeginIn = serde_json::from_str(body)?;
/// assert_eq!(begin.ttl_ms.get(), 60_000);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Deserialize)]
pub struct StepsBeginIn {
    /// The namespace; the default one when absent.
    #[serde(default, deserialize_with = "optional_namespace_name")]
    pub namespace: Option<String>,
    /// The operation's idempotency key.
    #[serde(deserialize_with = "entity_key")]
    pub key: String,
    /// The operation's claim token from `start`.
    pub token: String,
    /// How long the operation's steps are kept, from now (at least 1).
    pub ttl_ms: NonZeroU64,
}

/// `POST /api/v1.idempotency.steps.write` (fenced extension).
///
/// ```
/// let body = r#"{"key": "ride-1", "token": "0123456789abcdef0123456789abcdef",
///               "name": "charge", "position": 0, "result": [55], "ttl_ms": 60000}"#;
/// let step: idem_server::wire::StepWriteIn = serde_json::from_str(body)?;
/// assert_eq!(step.result.as_deref(), Some(&b"7"[..]));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Deserialize)]
pub struct StepWriteIn {
    /// The namespace; the default one when absent.
    #[serde(default, deserialize_with = "optional_namespace_name")]
    pub namespace: Option<String>,
    /// The operation's idempotency key.
    #[serde(deserialize_with = "entity_key")]
    pub key: String,
    /// The operation's claim token from `start`.
    pub token: String,
    /// The step's name, 1 to 255 bytes.
    pub name: String,
    /// Its position in the operation (0 for the first).
    pub position: u32,
    /// Its result; absent to record that an at-most-once step begins.
    #[serde(default, with = "serde_bytes")]
    pub result: Option<Vec<u8>>,
    /// How long the operation's steps are kept, from now (at least 1).
    pub ttl_ms: NonZeroU64,
}

/// One stored step, as `steps.begin` answers it.
///
/// ```
/// let begun = idem_server::wire::StepOut { name: "charge".into(), position: 1, result: None };
/// assert_eq!(serde_json::to_value(&begun)?["result"], serde_json::Value::Null);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Serialize)]
pub struct StepOut {
    /// The step's name.
    pub name: String,
    /// Its position.
    pub position: u32,
    /// Its result; absent (`null`) for a step that began and has none.
    #[serde(with = "serde_bytes")]
    pub result: Option<Vec<u8>>,
}

/// What `steps.begin` answers.
///
/// ```
/// let first = idem_server::wire::StepsOut { attempt: 1, steps: Vec::new() };
/// assert_eq!(serde_json::to_value(&first)?, serde_json::json!({"attempt": 1, "steps": []}));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Serialize)]
pub struct StepsOut {
    /// 1 for the first claim that began the operation's steps, 2 for the next, and so on.
    pub attempt: u32,
    /// The stored steps, by position.
    pub steps: Vec<StepOut>,
}

/// `{}`: what complete, abort and renew answer.
#[derive(Debug, Serialize)]
pub struct Empty {}

/// A namespace as configure and get answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceOut {
    /// Its name.
    pub name: String,
    /// When it was first configured, in Unix milliseconds.
    pub created: u64,
    /// When it was last configured, in Unix milliseconds.
    pub updated: u64,
    /// Fenced extension: whether complete and abort need a token here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_token: bool,
}

/// `{"ok": true}`: the health ping.
#[derive(Debug, Serialize)]
pub struct PingOut {
    /// Always true.
    pub ok: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_always_carries_its_location() {
        let body = serde_json::to_value(ApiError::not_found()).unwrap();
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
                Format::of_request(&headers).unwrap_err().code,
                "invalid_content_type",
                "{refused}"
            );
        }
    }
}
