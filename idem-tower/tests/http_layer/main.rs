//! The HTTP layer driven through a real axum server on a loopback port with a real HTTP client,
//! once per store: every case in `cases.rs` runs against each store listed at the bottom.
//! `config.rs` checks what the layer's builder refuses, which needs no store; `routes.rs` a route
//! added to the `Router` after the layer; `tasks.rs` which task runs the claim, the handler and a
//! replay; `headers.rs` which response headers are stored and replayed (`replay_headers`).
#![cfg(feature = "http")]

mod cases;
mod config;
mod headers;
mod routes;
mod server;
mod tasks;

// Every case once per store (`None` from a store function skips, after printing why).
idem_test_support::per_store! {
    cases: cases::{
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
        a_key_with_a_space_is_sent_quoted,
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
        completed_response_is_stored,
        pending_completion_follows_on_locked,
        uncertain_key_is_409_naming_the_operation,
        expired_result_is_409_then_runs_after_key_retention,
        changed_fingerprint_policy_is_409,
    };
    memory_store => idem_test_support::stores::memory,
    sqlite_store => idem_test_support::stores::sqlite,
    postgres_store => idem_test_support::stores::postgres,
    dynamodb_store => idem_test_support::stores::dynamodb,
    redis_store => idem_test_support::stores::redis_single,
    redis_cluster_store => idem_test_support::stores::redis_cluster,
}
