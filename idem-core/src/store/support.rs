//! What a store needs from idem-core beyond its public API: for store authors, in-tree and out;
//! not covered by semver: pin idem-core with `=` as the idem crates do (`idem-core = "=0.1.0"`),
//! as sqlx-core's "Semver Exempt API" is pinned by sqlx's drivers.
//!
//! The rules every store keeps are the [`Store`](crate::Store) trait's; the conformance suite
//! (`idem::conformance`, feature `conformance`) checks them. What is here are the pieces the
//! in-tree stores share so each writes them once: the duration and fingerprint checks, the
//! reserved step names, and the scanning stores' page of keys.

// The scanning stores (Redis, DynamoDB): the page a listing keeps, the reads of its records and
// the key's hex form; lapsed claims' keeping; the checks and step names every store uses.
pub use crate::step::{failed_step, FAILED_STEP_PREFIX};
pub use crate::store::admin::scan::{key_from_hex, live_records, Smallest};
pub use crate::store::admin::store_stats;
pub use crate::store::{check_duration, check_fingerprint, LAPSED_CLAIMS_KEPT_MS};

/// The engine's envelope of a result not retained, which it opens as
/// [`Error::ResultNotRetained`](crate::Error::ResultNotRetained). `DynamoStore` writes it for a
/// result over its item size and `RemoteStore` for one its server did not keep; a later
/// release makes the engine seal it, and stores stop writing the engine's envelope.
pub use crate::envelope::not_retained;

/// The reserved key of the records pruner's lease: a record of the store itself, which a store's
/// operator views (`StoreAdmin::list`, `stats`) leave out.
pub use crate::background::records_lease_key;

/// Refuses a [`PrunerConfig`](crate::PrunerConfig) whose settings are out of range, as
/// [`Pruner::records`](crate::Pruner::records) would: what a store that spawns its own pruner
/// checks before it opens anything.
pub fn check_pruner_config(config: &crate::PrunerConfig) -> Result<(), crate::Error> {
    config.validate()
}
