//! Uncertain operations past their lease (docs/server.md, "Past the lease"): the names the
//! server keeps of them, a caller's listing of its own (`uncertain.find`, for `RemoteStore`) and
//! the admin's of every one (`uncertain.list`).
//!
//! A store key is SHA-256 of (namespace, the caller's key space, the client's key), so the
//! store's listing of uncertain operations names none of them. Before it claims a key with
//! `on_lapse: uncertain` (a `start`, or a `steps.write` that sets it), the server keeps the
//! key's name in a record of its own, written through the engine: scope `idem-server.names`,
//! keyed by the store key's hex, holding the namespace, the key space and the client's key,
//! kept for [`NAMES_KEPT`] with no tombstone. One record per key, written once (a second
//! claim of the key finds it completed). A listing that meets an uncertain operation whose name
//! has less than half of that left keeps it for as long again, so a name lasts as long as its
//! operation is uncertain and listed at least every [`NAMES_KEPT`]` / 2`.

use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use idem_core::{
    AbandonedQuery, CallClaim, Error, Idempotency, Key, OnLapse, RecordState, UncertainOperation,
};
use idem_wire::hex;
use serde::{Deserialize, Serialize};

use crate::service::engine_error;
use crate::wire::ApiError;

/// The scope of the name records' keys, and of their calls in metrics and the observer.
pub const SCOPE: &str = "idem-server.names";

/// How long the name of a key claimed uncertain on lapse is kept: a week, as long as the
/// engine's default tombstone, and longer again each time a listing finds its operation still
/// uncertain with less than half of it left.
pub const NAMES_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many uncertain operations of the whole store a caller's listing reads, at most, to find
/// its own: past that it is refused (`409 too_many_uncertain`), and the admin's listing, which
/// pages through the store, is the way.
pub const MAX_SCANNED: usize = 10_000;

/// The store's page of uncertain operations a caller's listing reads at a time.
const SCAN_PAGE: u32 = 500;

/// Whose a store key is: what the name record of an uncertain key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Name {
    /// The namespace's scope (its name, or `#` and a digest for a name over 255 bytes).
    pub namespace: String,
    /// The key space of the token that claimed it (`admin`, `caller:NAME`).
    pub caller: String,
    /// The client's key, as it sent it.
    pub key: String,
}

fn name_key(key: &Key) -> Result<Key, ApiError> {
    Key::derive(SCOPE, "", &hex::encode(key.as_bytes()))
        .map_err(|e| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", e))
}

/// Keeps `name` as the name of the store key `key` (if it is not kept already), before the key
/// is claimed uncertain on lapse. A name being written by another request counts as kept.
pub async fn keep(engine: &Idempotency, key: &Key, name: &Name) -> Result<(), ApiError> {
    write(engine, &name_key(key)?, name, false).await
}

/// Writes the name record `at`; with `again`, replaces the one there (evicted first).
async fn write(engine: &Idempotency, at: &Key, name: &Name, again: bool) -> Result<(), ApiError> {
    if again {
        engine.evict(at).await.map_err(engine_error)?;
    }
    let claimed = engine
        .call(*at)
        .scope_named(SCOPE)
        .lease(Duration::from_secs(10))
        .on_lapse(OnLapse::Release)
        .claim()
        .await;
    let claim = match claimed {
        Ok(CallClaim::Claimed(claim)) => claim,
        // Kept already, or being kept by another request.
        Ok(CallClaim::Completed(_)) | Err(Error::Locked { .. }) => return Ok(()),
        Err(e) => return Err(engine_error(e)),
    };
    let bytes = serde_json::to_vec(name)
        .map_err(|e| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", e))?;
    engine
        .finish(SCOPE, &claim, bytes)
        .retention(NAMES_KEPT)
        .key_retention(Duration::ZERO)
        .observed(true)
        .await
        .map_err(engine_error)
}

/// The name of the store key `key`, if the server keeps one; kept for [`NAMES_KEPT`] again
/// when it has less than half of that left.
pub async fn name_of(engine: &Idempotency, key: &Key) -> Result<Option<Name>, ApiError> {
    let at = name_key(key)?;
    let Some(record) = engine.record(&at).await.map_err(engine_error)? else {
        return Ok(None);
    };
    let RecordState::Completed(kept) = record.state else {
        return Ok(None);
    };
    let Ok(bytes) = kept.result() else {
        return Ok(None);
    };
    let Ok(name) = serde_json::from_slice::<Name>(bytes) else {
        return Ok(None);
    };
    if kept.expires_at < SystemTime::now() + NAMES_KEPT / 2 {
        write(engine, &at, &name, true).await?;
    }
    Ok(Some(name))
}

/// Up to `limit` uncertain operations of the key space `caller` in the namespace `namespace`
/// with client keys after `after`, by client key, and their names' client keys.
pub async fn find(
    engine: &Idempotency,
    namespace: &str,
    caller: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, UncertainOperation)>, ApiError> {
    let mut found = Vec::new();
    let mut cursor: Option<Key> = None;
    let mut scanned = 0;
    loop {
        let query = AbandonedQuery {
            after: cursor.as_ref(),
            limit: SCAN_PAGE,
        };
        let page = engine.uncertain(query).await.map_err(engine_error)?;
        scanned += page.len();
        for op in &page {
            let Some(name) = name_of(engine, &op.key).await? else {
                continue;
            };
            let after_cursor = after.is_none_or(|a| name.key.as_str() > a);
            if name.namespace == namespace && name.caller == caller && after_cursor {
                found.push((name.key, op.clone()));
            }
        }
        match page.last() {
            Some(last) if page.len() == SCAN_PAGE as usize => {
                if scanned >= MAX_SCANNED {
                    return Err(too_many());
                }
                cursor = Some(last.key);
            }
            _ => break,
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found.truncate(limit);
    Ok(found)
}

fn too_many() -> ApiError {
    ApiError::operation(
        StatusCode::CONFLICT,
        "too_many_uncertain",
        format!(
            "the store holds more than {MAX_SCANNED} uncertain operations, more than a caller's \
             listing reads: resolve them through the admin's uncertain.list and \
             uncertain.resolve"
        ),
    )
}

/// A store key from its 64 hexadecimal digits, refused at `location`.
pub fn store_key(text: &str, location: &str) -> Result<Key, ApiError> {
    hex::decode::<32>(text).map(Key::from_bytes).ok_or_else(|| {
        ApiError::invalid(
            location,
            "a store key is the 64 hexadecimal digits uncertain.list answers",
        )
    })
}

/// A page size of a listing: 1 to [`idem_wire::MAX_PAGE`].
pub fn page(limit: u32) -> Result<u32, ApiError> {
    if limit == 0 || limit > idem_wire::MAX_PAGE {
        return Err(ApiError::invalid(
            "limit",
            format!(
                "a page holds 1 to {} operations, not {limit}",
                idem_wire::MAX_PAGE
            ),
        ));
    }
    Ok(limit)
}
