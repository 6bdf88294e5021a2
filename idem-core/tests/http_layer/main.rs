//! The HTTP layer driven through a real axum server on a loopback port with a real HTTP client,
//! once per store: every case in `cases.rs` runs against each store listed at the bottom.
//! `config.rs` checks what the layer's builder refuses, which needs no store; `tasks.rs` which task
//! runs the claim, the handler and a replay.
#![cfg(feature = "http")]

mod cases;
mod config;
mod server;
mod tasks;

use std::sync::Arc;

use idem_core::{MemoryStore, Store};

/// Instantiates every case for one store:
/// `http_suite!(module, path to an async fn() -> Option<(Arc<dyn Store>, Leftover)>)`
/// (`None` skips, after printing why; what the store leaves behind is removed after the case).
macro_rules! http_suite {
    ($name:ident, $store:path) => {
        mod $name {
            http_suite!(@each $store;
                retry_replays_identical_response,
                concurrent_duplicates_fail_fast,
                concurrent_duplicates_wait,
                changed_request_is_422,
                callers_are_independent,
                missing_caller_is_refused,
                invalid_caller_is_400,
                shared_key_space_shares_responses,
                problem_base_sets_type_and_link,
                bad_keys_are_400,
                bare_keys_by_default,
                strict_mode_refuses_bare_keys,
                extractor_rejections_are_not_stored,
                store_if_can_store_rejections,
                handler_reads_the_checked_key,
                key_extractor_refusals,
                optional_key_runs_unguarded,
                server_error_frees_key,
                handler_panic_frees_key,
                disconnect_runs_once_then_replays,
                disconnect_then_fail_fast_gets_409_then_replay,
                oversized_body_is_413,
                upload_cut_short_claims_nothing,
                oversized_response_is_not_run_again,
                five_megabyte_response_is_not_run_again,
                response_with_trailers_is_replayed_with_them,
                response_in_frames_is_replayed_whole,
                completed_response_is_stored
            );
        }
    };
    (@each $store:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let Some((store, leftover)) = $store().await {
                    $crate::cases::$case(store).await;
                    leftover.remove().await;
                }
            }
        )*
    };
}

/// What a store leaves behind after a case.
enum Leftover {
    Nothing,
    /// A temporary directory holding a SQLite file: deleted when dropped.
    #[cfg(feature = "sqlite")]
    Dir(#[allow(dead_code)] tempfile::TempDir),
    /// A table of its own on the shared PostgreSQL server.
    #[cfg(feature = "postgres")]
    PgTable(idem_core::PostgresStore),
    /// A server of the test's own (stopped when dropped), or a table on the shared one.
    #[cfg(feature = "dynamodb")]
    Dynamo(
        #[allow(dead_code)] Option<idem_test_support::dynamodb::Server>,
        String,
        String,
    ),
}

impl Leftover {
    /// Removes it. A failing case skips this, which leaves at most a stray table behind.
    async fn remove(self) {
        #[cfg(feature = "postgres")]
        if let Leftover::PgTable(store) = &self {
            idem_test_support::postgres::drop_store_tables(store).await;
        }
        #[cfg(feature = "dynamodb")]
        if let Leftover::Dynamo(None, url, table) = &self {
            let client = idem_test_support::dynamodb::client(url);
            let _ = client.delete_table().table_name(table).send().await;
        }
        // A directory is deleted as `self` goes out of scope here.
        let _ = self;
    }
}

async fn memory() -> Option<(Arc<dyn Store>, Leftover)> {
    Some((Arc::new(MemoryStore::new()), Leftover::Nothing))
}

/// A SQLite store on a fresh database file.
#[cfg(feature = "sqlite")]
async fn sqlite() -> Option<(Arc<dyn Store>, Leftover)> {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_core::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap();
    Some((Arc::new(store), Leftover::Dir(dir)))
}

/// A PostgreSQL store on a table of its own in the server named by `IDEM_TEST_PG_URL`. Without
/// the variable the case prints why and skips, unless `IDEM_REQUIRE_PG=1` makes that a failure.
#[cfg(feature = "postgres")]
async fn postgres() -> Option<(Arc<dyn Store>, Leftover)> {
    let url = idem_test_support::postgres::pg_url(&idem_test_support::current_test())?;
    let store = idem_test_support::postgres::fresh_store(&url, |b| b).await;
    Some((Arc::new(store.clone()), Leftover::PgTable(store)))
}

/// A server of the test's own when `scripts/test` gave the command to start one (see
/// `idem_test_support::dynamodb::own_or_shared_server` for why), else a fresh table on
/// `IDEM_TEST_DYNAMODB_URL`.
#[cfg(feature = "dynamodb")]
async fn dynamodb() -> Option<(Arc<dyn Store>, Leftover)> {
    let (url, server) = idem_test_support::dynamodb::own_or_shared_server().await?;
    let store = idem_test_support::dynamodb::fresh_store(&url, |b| b).await;
    let table = store.table().to_owned();
    Some((Arc::new(store), Leftover::Dynamo(server, url, table)))
}

/// A Redis store under a fresh key prefix on the shared server (or cluster) that
/// `scripts/test` starts; its records expire by themselves, so nothing is left to remove.
#[cfg(feature = "redis")]
async fn redis(flavor: idem_test_support::redis::Flavor) -> Option<(Arc<dyn Store>, Leftover)> {
    let store = idem_test_support::redis::fresh_store(flavor, |b| b).await?;
    Some((Arc::new(store), Leftover::Nothing))
}

#[cfg(feature = "redis")]
async fn redis_single() -> Option<(Arc<dyn Store>, Leftover)> {
    redis(idem_test_support::redis::Flavor::Single).await
}

#[cfg(feature = "redis")]
async fn redis_cluster() -> Option<(Arc<dyn Store>, Leftover)> {
    redis(idem_test_support::redis::Flavor::Cluster).await
}

http_suite!(memory_store, crate::memory);
#[cfg(feature = "sqlite")]
http_suite!(sqlite_store, crate::sqlite);
#[cfg(feature = "postgres")]
http_suite!(postgres_store, crate::postgres);
#[cfg(feature = "dynamodb")]
http_suite!(dynamodb_store, crate::dynamodb);
#[cfg(feature = "redis")]
http_suite!(redis_store, crate::redis_single);
#[cfg(feature = "redis")]
http_suite!(redis_cluster_store, crate::redis_cluster);
