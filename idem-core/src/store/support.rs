//! What a store needs from idem-core beyond its public API: for store authors, in-tree and out;
//! not covered by semver: pin idem-core with `=` as the idem crates do (`idem-core = "=0.1.0"`),
//! as sqlx-core's "Semver Exempt API" is pinned by sqlx's drivers.
//!
//! The rules every store keeps are the [`Store`](crate::Store) trait's; the conformance suite
//! (`idem::conformance`, feature `conformance`) checks them. What is here are the pieces the
//! in-tree stores share so each writes them once: the duration, fingerprint and response-size
//! checks, the reserved step names, and the scanning stores' page of keys.

// The scanning stores (Redis, DynamoDB): the page a listing keeps, the reads of its records and
// the key's hex form; lapsed claims' keeping; the checks and step names every store uses.
pub use crate::step::{failed_step, FAILED_STEP_PREFIX};
pub use crate::store::admin::scan::{key_from_hex, live_records, live_uncertain, Smallest};
pub use crate::store::admin::store_stats;
pub use crate::store::{check_duration, check_fingerprint, LAPSED_CLAIMS_KEPT_MS};

/// Refuses a completion whose response is over `limit`, the store's
/// [`max_response_bytes`](crate::Store::max_response_bytes): a
/// [`StoreErrorKind::Query`](crate::StoreErrorKind::Query) error naming `store`, the size and
/// the limit, before anything is written. An engine never sends one (it keeps such a result as
/// not retained itself); a caller of the raw store API is told instead of the store's own
/// refusal.
///
/// ```
/// use std::time::Duration;
/// use idem::store::support::check_response_size;
/// use idem::{Completion, StoreErrorKind};
/// let big = vec![0; 11];
/// let completion = Completion { response: Some(&big), is_error: false, retention: Duration::from_secs(60), key_retention: Duration::ZERO };
/// let refused = check_response_size("TinyStore", 10, &completion);
/// assert!(matches!(refused, Err(idem::Error::Store(e)) if e.kind() == StoreErrorKind::Query));
/// assert!(check_response_size("TinyStore", 11, &completion).is_ok());
/// ```
pub fn check_response_size(
    store: &str,
    limit: usize,
    completion: &crate::Completion<'_>,
) -> Result<(), crate::Error> {
    match completion.response {
        Some(bytes) if bytes.len() > limit => Err(crate::Error::Store(crate::StoreError::new(
            crate::StoreErrorKind::Query,
            format!(
                "{store} keeps responses of at most {limit} bytes, not {}: an engine keeps such a \
                 result as not retained (Store::max_response_bytes); nothing was written",
                bytes.len()
            ),
        ))),
        _ => Ok(()),
    }
}

/// The stored bytes of an operation resolved as abandoned with `reason`, as an engine's
/// [`Idempotency::resolve`](crate::Idempotency::resolve) stores them: for a store that learns of
/// such a result from elsewhere (`RemoteStore`, for a key idem-server's own engine resolved),
/// as [`StoredResult::not_retained`](crate::StoredResult::not_retained) is for a result not kept.
/// An engine replays it as [`Error::Abandoned`](crate::Error::Abandoned).
///
/// ```
/// use std::time::SystemTime;
/// use idem::store::support::abandoned_result;
/// use idem::{Error, StoredResult};
/// let kept = StoredResult { response: Some(abandoned_result("refunded")), is_error: false, expires_at: SystemTime::now(), not_retained: None };
/// assert!(matches!(kept.result(), Err(Error::Abandoned { reason }) if reason == "refunded"));
/// ```
pub fn abandoned_result(reason: &str) -> Vec<u8> {
    crate::envelope::abandoned(reason)
}

/// The reserved key of the records pruner's lease: a record of the store itself, which a store's
/// operator views (`StoreAdmin::list`, `stats`) leave out.
pub use crate::background::records_lease_key;

/// Refuses a [`PrunerConfig`](crate::PrunerConfig) whose settings are out of range, as
/// [`Pruner::records`](crate::Pruner::records) would: what a store that spawns its own pruner
/// checks before it opens anything.
pub fn check_pruner_config(config: &crate::PrunerConfig) -> Result<(), crate::Error> {
    config.validate()
}
