//! The HTTP layer driven through a real axum server on a loopback port with a real HTTP client,
//! once per store: every case in `cases.rs` runs against each store listed at the bottom.
//! `config.rs` checks what the layer's builder refuses, which needs no store; `tasks.rs` which task
//! runs the claim, the handler and a replay.
#![cfg(feature = "http")]

mod cases;
mod config;
#[cfg(feature = "dynamodb")]
#[path = "../support/dynamo_env.rs"]
mod dynamo_env;
#[cfg(feature = "postgres")]
#[path = "../support/pg_env.rs"]
mod pg_env;
#[cfg(feature = "redis")]
#[path = "../support/redis_env.rs"]
mod redis_env;
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
                response_with_trailers_is_not_run_again,
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
        #[allow(dead_code)] Option<dynamo_env::Server>,
        String,
        String,
    ),
}

impl Leftover {
    /// Removes it. A failing case skips this, which leaves at most a stray table behind.
    async fn remove(self) {
        #[cfg(feature = "postgres")]
        if let Leftover::PgTable(store) = &self {
            let table = store.table();
            let drop = format!("DROP TABLE IF EXISTS \"{table}\", \"{table}_migrations\"");
            let _ = sqlx::raw_sql(&drop).execute(store.pool()).await;
        }
        #[cfg(feature = "dynamodb")]
        if let Leftover::Dynamo(None, url, table) = &self {
            let client = dynamo_env::client(url);
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
    let url = pg_env::pg_url(&pg_env::current_test())?;
    let store = idem_core::PostgresStore::builder()
        .table(format!("idem_http_{:016x}", fastrand::u64(..)))
        .connect(&url)
        .await
        .unwrap();
    Some((Arc::new(store.clone()), Leftover::PgTable(store)))
}

/// A server of the test's own when `scripts/test` gave the command to start one (see
/// `tests/conformance/dynamodb.rs` for why), else a fresh table on `IDEM_TEST_DYNAMODB_URL`.
#[cfg(feature = "dynamodb")]
async fn dynamodb() -> Option<(Arc<dyn Store>, Leftover)> {
    let (url, server) = match dynamo_env::Server::command() {
        Some(cmd) => {
            let server = tokio::task::spawn_blocking(move || dynamo_env::Server::start(&cmd))
                .await
                .unwrap();
            (server.url(), Some(server))
        }
        None => (dynamo_env::dynamo_url(&dynamo_env::current_test())?, None),
    };
    let store = dynamo_env::fresh_store(&url, |b| b).await;
    let table = store.table().to_owned();
    Some((Arc::new(store), Leftover::Dynamo(server, url, table)))
}

/// A Redis store under a fresh key prefix on the shared server (or cluster) that
/// `scripts/test` starts; its records expire by themselves, so nothing is left to remove.
#[cfg(feature = "redis")]
async fn redis_single() -> Option<(Arc<dyn Store>, Leftover)> {
    let store = redis_env::fresh_store(redis_env::Flavor::Single, |b| b).await?;
    Some((Arc::new(store), Leftover::Nothing))
}

#[cfg(feature = "redis")]
async fn redis_cluster() -> Option<(Arc<dyn Store>, Leftover)> {
    let store = redis_env::fresh_store(redis_env::Flavor::Cluster, |b| b).await?;
    Some((Arc::new(store), Leftover::Nothing))
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
