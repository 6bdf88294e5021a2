//! Diom's error body, which every route answers with a status other than `200`.

use serde::{Deserialize, Serialize};

/// The class of an error, as Diom's clients sort it (`InvalidInput`, `OperationError`,
/// `ServerError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

/// The body of an error answer on any route (the OpenAPI document's `Error`): `{type, code,
/// detail, location}`, with the answer's status beside it (`409 stale_holder`, `422
/// invalid_data` at `location`, `503 store_unavailable`; docs/server.md, "Errors"). The fenced
/// extension's refusals past the lease (`422 policy_changed`, `409 abandoned`, `409
/// result_expired`, `409 uncertain`) add what their caller needs, in fields Diom's own
/// answers never carry.
///
/// ```
/// use idem_wire::{ErrorBody, ErrorType};
/// let body = ErrorBody::new(ErrorType::OperationError, "not_found", "Entity not found");
/// assert_eq!(
///     serde_json::to_value(&body)?,
///     serde_json::json!({"type": "operation-error", "code": "not_found",
///         "detail": "Entity not found", "location": null})
/// );
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The class of error.
    #[serde(rename = "type")]
    pub kind: ErrorType,
    /// A stable identifier of the condition (`stale_holder`, `invalid_data`, …).
    #[serde(default)]
    pub code: String,
    /// What happened, for a person.
    #[serde(default)]
    pub detail: String,
    /// The path of the field the invalid input is at (`lock_period_ms`, `context.status`), as
    /// Diom names it, for `invalid_data`. Always sent, `null` when there is none: Diom's
    /// Python client requires the field.
    #[serde(default)]
    pub location: Option<String>,
    /// Fenced extension, `result_expired` and `uncertain`: when the key's result expired, or
    /// its claim's lock ran out, in Unix milliseconds on the store's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// Fenced extension, `abandoned`: the reason recorded when the key was resolved as
    /// abandoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Fenced extension, `policy_changed`: the policy version the key's fingerprint was
    /// stored under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_policy: Option<u32>,
    /// Fenced extension, `policy_changed`: the policy version of this request's fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_policy: Option<u32>,
}

impl ErrorBody {
    /// A body of `kind` with `code` and `detail`, at no location.
    pub fn new(kind: ErrorType, code: impl Into<String>, detail: impl Into<String>) -> ErrorBody {
        ErrorBody {
            kind,
            code: code.into(),
            detail: detail.into(),
            location: None,
            since_ms: None,
            reason: None,
            stored_policy: None,
            current_policy: None,
        }
    }
}
