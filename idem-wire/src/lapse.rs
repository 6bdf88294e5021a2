//! Past the lease (docs/architecture.md, "Past the lease"), in the fenced extension: what a
//! claim's key becomes when its lock runs out ([`OnLapse`]), the store routes that find and take
//! over a caller's uncertain operations (`uncertain.find`, `uncertain.take`, which `RemoteStore`
//! calls), and the admin's routes that list every uncertain operation and resolve one
//! (`uncertain.list`, `uncertain.resolve`).

use std::collections::HashMap;
use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

use crate::names::{entity_key, optional_entity_key, optional_namespace_name};

/// What a claim's key becomes if its lock runs out with no complete or abort (`on_lapse` of
/// [`StartIn`](crate::StartIn) and [`StepWriteIn`](crate::StepWriteIn)).
///
/// ```
/// use idem_wire::OnLapse;
/// assert_eq!(OnLapse::default(), OnLapse::Release);
/// assert_eq!(serde_json::to_value(OnLapse::Uncertain)?, "uncertain");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLapse {
    /// The key is free: the next start runs the work again (Diom's behaviour).
    #[default]
    Release,
    /// The key is uncertain: nobody runs it again until it is resolved.
    Uncertain,
}

impl OnLapse {
    /// Whether this is [`OnLapse::Release`], the default (left out when encoding).
    pub fn is_release(&self) -> bool {
        *self == OnLapse::Release
    }
}

/// `POST /api/v1.idempotency.uncertain.take`
/// ([`route::UNCERTAIN_TAKE`](crate::route::UNCERTAIN_TAKE), fenced extension): take over the
/// caller's uncertain key to resolve it, fenced by the lapsed claim's `token` (what `get` and
/// `uncertain.find` answer). Answered with [`TakeUncertainOut`]; a key that is not uncertain
/// under that token is `409 not_uncertain`, and nothing changes.
///
/// ```
/// let body = r#"{"key": "charge-1", "token": "0123456789abcdef0123456789abcdef", "lock_period_ms": 30000}"#;
/// let take: idem_wire::TakeUncertainIn = serde_json::from_str(body)?;
/// assert_eq!(take.lock_period_ms.get(), 30_000);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeUncertainIn {
    /// The namespace; the default one when absent.
    #[serde(
        default,
        deserialize_with = "optional_namespace_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace: Option<String>,
    /// The caller's idempotency key.
    #[serde(deserialize_with = "entity_key")]
    pub key: String,
    /// The lapsed claim's token.
    pub token: String,
    /// The takeover's lock period, from now (at least 1). It stays uncertain if it runs out.
    pub lock_period_ms: NonZeroU64,
}

/// What `uncertain.take` answers ([`route::UNCERTAIN_TAKE`](crate::route::UNCERTAIN_TAKE)):
/// the takeover's claim token, which `complete` (resolved: it happened, or abandoned) and
/// `abort` (resolved: it did not happen, the key frees) take.
///
/// ```
/// let out = idem_wire::TakeUncertainOut { token: "0123456789abcdef0123456789abcdef".into() };
/// assert_eq!(serde_json::to_value(&out)?["token"], "0123456789abcdef0123456789abcdef");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeUncertainOut {
    /// The new claim's token, 32 hexadecimal digits.
    pub token: String,
}

/// `POST /api/v1.idempotency.uncertain.find`
/// ([`route::UNCERTAIN_FIND`](crate::route::UNCERTAIN_FIND), fenced extension): up to `limit`
/// of the caller's uncertain keys in the namespace, by key, after `after`. Answered with
/// [`FindUncertainOut`].
///
/// ```
/// let find: idem_wire::FindUncertainIn = serde_json::from_str(r#"{"limit": 100}"#)?;
/// assert_eq!((find.limit, find.after), (100, None));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindUncertainIn {
    /// The namespace; the default one when absent.
    #[serde(
        default,
        deserialize_with = "optional_namespace_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace: Option<String>,
    /// The last key of the previous page; absent for the first page.
    #[serde(
        default,
        deserialize_with = "optional_entity_key",
        skip_serializing_if = "Option::is_none"
    )]
    pub after: Option<String>,
    /// The most keys a page holds, 1 to [`MAX_PAGE`]; a shorter page is the last.
    pub limit: u32,
}

/// The most operations one page of `uncertain.find` or `uncertain.list` holds.
pub const MAX_PAGE: u32 = 1000;

/// One of the caller's uncertain keys, in [`FindUncertainOut`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UncertainOut {
    /// The caller's idempotency key.
    pub key: String,
    /// The lapsed claim's token: what `uncertain.take` is fenced by.
    pub token: String,
    /// When its lock ran out, in Unix milliseconds on the store's clock.
    pub since_ms: u64,
}

/// What `uncertain.find` answers ([`route::UNCERTAIN_FIND`](crate::route::UNCERTAIN_FIND)).
///
/// ```
/// let none = idem_wire::FindUncertainOut { operations: Vec::new() };
/// assert_eq!(serde_json::to_value(&none)?, serde_json::json!({"operations": []}));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindUncertainOut {
    /// The caller's uncertain keys, by key.
    pub operations: Vec<UncertainOut>,
}

/// `POST /api/v1.idempotency.uncertain.list`
/// ([`route::UNCERTAIN_LIST`](crate::route::UNCERTAIN_LIST), admin token): up to `limit`
/// uncertain operations of every caller and namespace, by store key, after `after`. Answered
/// with [`ListUncertainOut`].
///
/// ```
/// let list: idem_wire::ListUncertainIn = serde_json::from_str(r#"{"limit": 50}"#)?;
/// assert_eq!(list.limit, 50);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListUncertainIn {
    /// The last `key` of the previous page (64 hexadecimal digits); absent for the first page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// The most operations a page holds, 1 to [`MAX_PAGE`]; a shorter page is the last.
    pub limit: u32,
}

/// One uncertain operation, as the admin's `uncertain.list` shows it, in
/// [`ListUncertainOut`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedUncertain {
    /// The store's key of the operation, 64 hexadecimal digits: what `uncertain.resolve`
    /// takes.
    pub key: String,
    /// The lapsed claim's token.
    pub token: String,
    /// When its lock ran out, in Unix milliseconds on the store's clock.
    pub since_ms: u64,
    /// The namespace it was started in, when the server kept its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The key space of the token that started it (`admin`, `caller:NAME`), when the server
    /// kept its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// The client's key, when the server kept its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<String>,
}

/// What `uncertain.list` answers ([`route::UNCERTAIN_LIST`](crate::route::UNCERTAIN_LIST)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListUncertainOut {
    /// The uncertain operations, by store key.
    pub operations: Vec<ListedUncertain>,
}

/// What an operator found an uncertain operation's effect to be, in [`ResolveIn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolutionKind {
    /// It happened: every start replays `response` (and `context`).
    Completed,
    /// It did not happen: the key is freed, and the next start runs the work.
    Failed,
    /// Neither, and it must not run again: a fenced start is refused `409 abandoned` with
    /// `reason` (Diom's clients get `locked`) until the retention ends.
    Abandoned,
}

/// `POST /api/v1.idempotency.uncertain.resolve`
/// ([`route::UNCERTAIN_RESOLVE`](crate::route::UNCERTAIN_RESOLVE), admin token): resolve the
/// uncertain operation `key` (a store key from `uncertain.list`). Answered with
/// [`Empty`](crate::Empty); one that is not uncertain (any more) is `409 not_uncertain`, and
/// nothing changes.
///
/// ```
/// let body = r#"{"key": "00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff00ff",
///               "resolution": "abandoned", "reason": "refunded by hand"}"#;
/// let resolve: idem_wire::ResolveIn = serde_json::from_str(body)?;
/// assert_eq!(resolve.resolution, idem_wire::ResolutionKind::Abandoned);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolveIn {
    /// The operation's store key, 64 hexadecimal digits.
    pub key: String,
    /// `completed`, `failed` or `abandoned`.
    pub resolution: ResolutionKind,
    /// For `completed` (and only then; required): the response starts replay.
    #[serde(default, with = "serde_bytes", skip_serializing_if = "Option::is_none")]
    pub response: Option<Vec<u8>>,
    /// For `completed` (and only then): strings kept with the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<HashMap<String, String>>,
    /// For `abandoned` (and only then; required): why, 1 to [`MAX_REASON_LEN`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The longest `reason` of an abandoned resolution, in bytes.
pub const MAX_REASON_LEN: usize = 1024;
