//! The HTTP layer driven through a real axum server on a loopback port with a real HTTP client,
//! once per store: every case in `cases.rs` runs against each store listed at the bottom.
#![cfg(feature = "http")]

mod cases;
mod server;

use std::sync::Arc;

use idem_core::{MemoryStore, Store};

/// Instantiates every case for one store: `http_suite!(module, path to an async fn() -> Option<(Arc<dyn Store>, Guard)>)`
/// (`None` skips, after printing why; the guard keeps the store's files until the case ends).
macro_rules! http_suite {
    ($name:ident, $store:path) => {
        mod $name {
            http_suite!(@each $store;
                retry_replays_identical_response,
                concurrent_duplicates_fail_fast,
                concurrent_duplicates_wait,
                changed_request_is_422,
                callers_are_independent,
                bad_keys_are_400,
                bare_keys_when_accepted,
                optional_key_runs_unguarded,
                server_error_frees_key,
                disconnect_frees_key,
                oversized_body_is_413,
                oversized_response_is_not_stored,
                completed_response_is_stored
            );
        }
    };
    (@each $store:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let Some((store, _guard)) = $store().await {
                    $crate::cases::$case(store).await;
                }
            }
        )*
    };
}

async fn memory() -> Option<(Arc<dyn Store>, ())> {
    Some((Arc::new(MemoryStore::new()), ()))
}

/// A SQLite store on a fresh database file, deleted with the directory after the case.
#[cfg(feature = "sqlite")]
async fn sqlite() -> Option<(Arc<dyn Store>, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_core::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap();
    Some((Arc::new(store), dir))
}

http_suite!(memory_store, crate::memory);
#[cfg(feature = "sqlite")]
http_suite!(sqlite_store, crate::sqlite);
