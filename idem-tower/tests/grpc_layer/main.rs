//! The gRPC layer driven through a real tonic server on a loopback port with a real tonic
//! client (and a raw HTTP/2 client on the same channel, to compare responses byte for byte),
//! once per store: every case in `cases.rs` runs against each store listed at the bottom.

mod cases;
mod server;

// Every case once per store (`None` from a store function skips, after printing why).
idem_test_support::per_store! {
    cases: cases::{
        retried_call_replays_byte_identical,
        final_error_replays_with_details,
        transient_status_frees_key,
        fifty_concurrent_duplicates_run_once,
        fifty_concurrent_duplicates_wait_for_one_run,
        deadline_mid_call_runs_once_then_replays,
        streaming_passes_untouched,
        callers_never_share_keys,
        key_reused_is_failed_precondition,
        request_id_field_is_the_key,
        malformed_keys_are_invalid_argument,
        oversized_response_is_not_run_again,
        flaky_server_with_retries_books_each_payment_once,
        pending_completion_follows_on_locked,
        uncertain_key_is_aborted_naming_the_operation,
        expired_result_is_already_exists,
        changed_policy_is_policy_changed,
    };
    memory_store => idem_test_support::stores::memory,
    sqlite_store => idem_test_support::stores::sqlite,
    postgres_store => idem_test_support::stores::postgres,
}

/// Needs a store whose connection can be taken away: SQLite's pool, closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_unreachable_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap();
    cases::store_unreachable_is_unavailable(store).await;
}
