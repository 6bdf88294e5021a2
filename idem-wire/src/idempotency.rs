//! The bodies of the idempotency routes: Diom's `start`, `complete` and `abort`, and the fenced
//! extension's `renew`, `get`, `evict`, `prune`, `steps.begin` and `steps.write`.
//!
//! Optional fields a sender leaves out are skipped when encoding and default when decoding; a
//! request's fields are declared in the order `RemoteStore` has always sent them, so its bytes
//! on the wire are what they were.

use std::collections::HashMap;
use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

use crate::lapse::OnLapse;
use crate::names::{entity_key, optional_namespace_name};

/// `POST /api/v1.idempotency.start` ([`route::START`](crate::route::START)): claim `key`, or
/// get its stored response. Answered with [`StartOut`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartIn {
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
    /// How long the lock holds without a renewal (at least 1).
    pub lock_period_ms: NonZeroU64,
    /// Fenced extension: answer `started` with the claim's token (and `locked` with
    /// `retry_after_ms` and `lease_left_ms`). Implied by a fingerprint.
    #[serde(default)]
    pub fenced: bool,
    /// Fenced extension: the request's fingerprint as its SHA-256, 64 hexadecimal digits,
    /// kept as it is (`fingerprint` is hashed first). What `RemoteStore` sends: its callers'
    /// fingerprints are digests already. At most one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint_sha256: Option<String>,
    /// Fenced extension: what the request was; a later start with the same key and another
    /// fingerprint gets `fingerprint_mismatch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Fenced extension: what the key becomes if the lock runs out with no complete or abort:
    /// free to start again (`release`, the default) or `uncertain` (nobody runs it again until
    /// it is resolved; a fenced `start` then answers `uncertain`).
    #[serde(default, skip_serializing_if = "OnLapse::is_release")]
    pub on_lapse: OnLapse,
}

impl StartIn {
    /// A start of `key` in the default namespace, as Diom sends it: not fenced, no fingerprint.
    ///
    /// ```
    /// let start = idem_wire::StartIn::new("order-1", std::num::NonZeroU64::new(30_000).unwrap());
    /// assert_eq!(
    ///     serde_json::to_value(&start)?,
    ///     serde_json::json!({"key": "order-1", "lock_period_ms": 30000, "fenced": false})
    /// );
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn new(key: impl Into<String>, lock_period_ms: NonZeroU64) -> StartIn {
        StartIn {
            namespace: None,
            key: key.into(),
            lock_period_ms,
            fenced: false,
            fingerprint_sha256: None,
            fingerprint: None,
            on_lapse: OnLapse::Release,
        }
    }
}

/// What [`StartOut`] says of the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartStatus {
    /// The caller holds the key now: run the work, then complete or abort.
    Started,
    /// Another claim holds the key: try again later.
    Locked,
    /// The key is completed: `data` is its stored response.
    Completed,
    /// Fenced extension: a claim made with `on_lapse: uncertain` ran out with no completion
    /// (since `since_ms`): whether its work took effect is unknown, so nobody runs it again
    /// until it is resolved. Diom's clients (not fenced) get `locked`.
    Uncertain,
    /// Fenced extension: the key completed and its response expired at `since_ms`; the key is
    /// kept (a tombstone, `key_retention_ms`) so the work does not run again. Diom's clients
    /// (not fenced) get `locked`.
    Expired,
}

/// What `start` answers ([`route::START`](crate::route::START)): `{"status": "started" |
/// "locked" | "completed", …}`, and for a fenced start `"uncertain"` or `"expired"` with
/// `since_ms`.
///
/// ```
/// use idem_wire::{StartOut, StartStatus};
/// let out: StartOut = serde_json::from_str(r#"{"status": "started", "token": "00ff"}"#)?;
/// assert_eq!((out.status, out.token.as_deref()), (StartStatus::Started, Some("00ff")));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartOut {
    /// `started`, `locked` or `completed`.
    pub status: StartStatus,
    /// The stored response, for `completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Completed>,
    /// Fenced extension: the claim's token, for `started` when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Fenced extension: when to try again, for `locked` when asked for: the engine's
    /// estimate of the holder's work, within what is left of its lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Fenced extension: what is left of the holder's lease, for `locked` when asked for (as
    /// the store reported it; absent when the key changed before it was read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_left_ms: Option<u64>,
    /// Fenced extension: why the response was not kept (it was larger than the server keeps),
    /// for `completed`; `data` is then empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_retained: Option<String>,
    /// Fenced extension, for `uncertain` (when the claim's lock ran out) and `expired` (when
    /// the response expired): in Unix milliseconds on the store's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
}

impl StartOut {
    /// An answer of `status` with no other field.
    ///
    /// ```
    /// use idem_wire::{StartOut, StartStatus};
    /// let locked = StartOut::of(StartStatus::Locked);
    /// assert_eq!(serde_json::to_value(&locked)?, serde_json::json!({"status": "locked"}));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn of(status: StartStatus) -> StartOut {
        StartOut {
            status,
            data: None,
            token: None,
            retry_after_ms: None,
            lease_left_ms: None,
            not_retained: None,
            since_ms: None,
        }
    }
}

/// A completed key's response and context (the OpenAPI document's `Completed`), in
/// [`StartOut`] and [`GetOut`]. idem-server also keeps it, in MessagePack, as the result of
/// the key's record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completed {
    /// The stored response.
    #[serde(default, with = "serde_bytes")]
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
    /// Fenced extension: when the response stops replaying, in Unix milliseconds (the
    /// server's clock when it completed the key; `get` answers the store's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

impl Completed {
    /// The response as Diom has it: without the fenced extension's fields.
    ///
    /// ```
    /// use idem_wire::Completed;
    /// let kept = Completed { response: b"ok".to_vec(), is_error: true, expires_at_ms: Some(1), ..Completed::default() };
    /// assert_eq!(serde_json::to_value(kept.diom())?, serde_json::json!({"response": [111, 107]}));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn diom(self) -> Completed {
        Completed {
            response: self.response,
            context: self.context,
            is_error: false,
            absent: false,
            expires_at_ms: None,
        }
    }
}

/// `POST /api/v1.idempotency.complete` ([`route::COMPLETE`](crate::route::COMPLETE)): store
/// the key's response. Answered with [`Empty`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompleteIn {
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
    /// Fenced extension: the claim's token from `start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The response to keep and replay.
    #[serde(with = "serde_bytes")]
    pub response: Vec<u8>,
    /// Fenced extension: the work completed without a response (`response` is then empty).
    #[serde(default)]
    pub absent: bool,
    /// Fenced extension: the response is an error the work returned (replayed as one).
    #[serde(default)]
    pub is_error: bool,
    /// Fenced extension, with `token`: answer `{}` only once the response is in the store; a
    /// store failure that passes is then `503 store_unavailable` (retry with the same token),
    /// where without it the server stores the response in the background and answers `{}`.
    #[serde(default)]
    pub observed: bool,
    /// How long the response replays (at least 1).
    pub ttl_ms: NonZeroU64,
    /// Strings kept with the response (a status code, headers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<HashMap<String, String>>,
    /// Fenced extension: how long the key is kept after `ttl_ms`, as a tombstone without the
    /// response (a fenced `start` then answers `expired`, Diom's `locked`), so the work does
    /// not run again; 0 or absent for none (the key is free when `ttl_ms` ends, as in Diom).
    /// At most ten years.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub key_retention_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `POST /api/v1.idempotency.abort` ([`route::ABORT`](crate::route::ABORT)): release the
/// key's claim, so a retry may run. Answered with [`Empty`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortIn {
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
    /// Fenced extension: the claim's token from `start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `POST /api/v1.idempotency.renew` ([`route::RENEW`](crate::route::RENEW), fenced
/// extension): extend the claim's lock. Answered with [`Empty`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewIn {
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
    /// The claim's token from `start`.
    pub token: String,
    /// The lock's new period, from now (at least 1).
    pub lock_period_ms: NonZeroU64,
}

/// `POST /api/v1.idempotency.get` and `.evict` ([`route::GET`](crate::route::GET),
/// [`route::EVICT`](crate::route::EVICT), fenced extension): a key of the caller's. Answered
/// with [`GetOut`] and [`EvictOut`].
///
/// ```
/// let get: idem_wire::KeyIn = serde_json::from_str(r#"{"key": "order-1"}"#)?;
/// assert_eq!((get.key.as_str(), get.namespace), ("order-1", None));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyIn {
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
}

/// What [`GetOut`] says of the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GetStatus {
    /// No live record.
    Absent,
    /// A claim holds the key.
    InProgress,
    /// The key is completed.
    Completed,
    /// A claim made with `on_lapse: uncertain` ran out with no completion: `token` is the
    /// lapsed claim's (what [`route::UNCERTAIN_TAKE`](crate::route::UNCERTAIN_TAKE) is
    /// fenced by), `since_ms` when its lock ran out.
    Uncertain,
    /// The response expired at `since_ms`; the key is kept as a tombstone.
    Expired,
}

/// What `get` answers ([`route::GET`](crate::route::GET)): `{"status": "absent" |
/// "in_progress" | "completed" | "uncertain" | "expired", …}`.
///
/// ```
/// use idem_wire::{GetOut, GetStatus};
/// let running = GetOut { lease_until_ms: Some(1_800_000_000_000), ..GetOut::of(GetStatus::InProgress) };
/// assert_eq!(serde_json::to_value(&running)?["lease_until_ms"], 1_800_000_000_000u64);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetOut {
    /// `absent` (no live record), `in_progress` or `completed`.
    pub status: GetStatus,
    /// The holder's claim token, for `in_progress`; the lapsed claim's, for `uncertain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// When the holder's lease ends, in Unix milliseconds on the store's clock, for
    /// `in_progress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<u64>,
    /// The SHA-256 of the fingerprint the key was started with, if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint_sha256: Option<String>,
    /// The stored response, for `completed` (empty when `not_retained`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Completed>,
    /// When the response stops replaying, in Unix milliseconds on the store's clock, for
    /// `completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Why the response was not kept (it was larger than the server's limit), for `completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_retained: Option<String>,
    /// For `uncertain`, when the claim's lock ran out; for `expired`, when the response
    /// expired: in Unix milliseconds on the store's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// For `completed`: the key was resolved as abandoned (an operator's resolution of an
    /// uncertain key), for this reason; `data` is then empty and the work never runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandoned: Option<String>,
}

impl GetOut {
    /// An answer of `status` with no other field.
    ///
    /// ```
    /// use idem_wire::{GetOut, GetStatus};
    /// let absent = GetOut::of(GetStatus::Absent);
    /// assert_eq!(serde_json::to_value(&absent)?, serde_json::json!({"status": "absent"}));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn of(status: GetStatus) -> GetOut {
        GetOut {
            status,
            token: None,
            lease_until_ms: None,
            fingerprint_sha256: None,
            data: None,
            expires_at_ms: None,
            not_retained: None,
            since_ms: None,
            abandoned: None,
        }
    }
}

/// What `evict` answers ([`route::EVICT`](crate::route::EVICT)).
///
/// ```
/// let out = idem_wire::EvictOut { evicted: true };
/// assert_eq!(serde_json::to_value(&out)?, serde_json::json!({"evicted": true}));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictOut {
    /// Whether the key had a record.
    pub evicted: bool,
}

/// `POST /api/v1.idempotency.prune` ([`route::PRUNE`](crate::route::PRUNE), fenced
/// extension, admin token): delete ended records. Answered with [`PruneOut`].
///
/// ```
/// let prune: idem_wire::PruneIn = serde_json::from_str(r#"{"limit": 100}"#)?;
/// assert_eq!(prune.limit, 100);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneIn {
    /// The most records to delete.
    pub limit: u32,
}

/// What `prune` answers ([`route::PRUNE`](crate::route::PRUNE)).
///
/// ```
/// let out = idem_wire::PruneOut { pruned: 3 };
/// assert_eq!(serde_json::to_value(&out)?, serde_json::json!({"pruned": 3}));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneOut {
    /// How many ended records were deleted.
    pub pruned: u64,
}

/// `POST /api/v1.idempotency.steps.begin` ([`route::STEPS_BEGIN`](crate::route::STEPS_BEGIN),
/// fenced extension): begin or resume the steps of the operation the token holds. Answered
/// with [`StepsOut`].
///
/// ```
/// let body = r#"{"key": "ride-1", "token": "0123456789abcdef0123456789abcdef", "ttl_ms": 60000}"#;
/// let begin: idem_wire::StepsBeginIn = serde_json::from_str(body)?;
/// assert_eq!(begin.ttl_ms.get(), 60_000);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepsBeginIn {
    /// The namespace; the default one when absent.
    #[serde(
        default,
        deserialize_with = "optional_namespace_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace: Option<String>,
    /// The operation's idempotency key.
    #[serde(deserialize_with = "entity_key")]
    pub key: String,
    /// The operation's claim token from `start`.
    pub token: String,
    /// How long the operation's steps are kept, from now (at least 1).
    pub ttl_ms: NonZeroU64,
}

/// `POST /api/v1.idempotency.steps.write` ([`route::STEPS_WRITE`](crate::route::STEPS_WRITE),
/// fenced extension): store that a step begins, or its result. Answered with [`Empty`].
///
/// ```
/// let body = r#"{"key": "ride-1", "token": "0123456789abcdef0123456789abcdef",
///               "name": "charge", "position": 0, "result": [55], "ttl_ms": 60000}"#;
/// let step: idem_wire::StepWriteIn = serde_json::from_str(body)?;
/// assert_eq!(step.result.as_deref(), Some(&b"7"[..]));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepWriteIn {
    /// The namespace; the default one when absent.
    #[serde(
        default,
        deserialize_with = "optional_namespace_name",
        skip_serializing_if = "Option::is_none"
    )]
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
    /// Its result; absent (or `null`) to record that an at-most-once step begins.
    #[serde(default, with = "serde_bytes")]
    pub result: Option<Vec<u8>>,
    /// How long the operation's steps are kept, from now (at least 1).
    pub ttl_ms: NonZeroU64,
    /// What the operation's key becomes if its claim's lock runs out, set with this write
    /// (the same fence): `uncertain` with an at-most-once step's begin, the call's own choice
    /// back with its result. Absent: unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_lapse: Option<OnLapse>,
}

/// One stored step, as `steps.begin` answers it, in [`StepsOut`].
///
/// ```
/// let begun = idem_wire::StepOut { name: "charge".into(), position: 1, result: None };
/// assert_eq!(serde_json::to_value(&begun)?["result"], serde_json::Value::Null);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepOut {
    /// The step's name.
    pub name: String,
    /// Its position.
    pub position: u32,
    /// Its result; `null` for a step that began and has none.
    #[serde(default, with = "serde_bytes")]
    pub result: Option<Vec<u8>>,
}

/// What `steps.begin` answers ([`route::STEPS_BEGIN`](crate::route::STEPS_BEGIN)).
///
/// ```
/// let first = idem_wire::StepsOut { attempt: 1, steps: Vec::new() };
/// assert_eq!(serde_json::to_value(&first)?, serde_json::json!({"attempt": 1, "steps": []}));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepsOut {
    /// 1 for the first claim that began the operation's steps, 2 for the next, and so on.
    pub attempt: u32,
    /// The stored steps, by position.
    pub steps: Vec<StepOut>,
}

/// `{}`: what `complete`, `abort`, `renew` and `steps.write` answer. Decoding ignores any
/// field a later server adds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}
