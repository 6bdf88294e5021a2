//! `#[idempotent]` end to end on SQLite (a database file in a temporary directory), with the
//! same scenarios as on the memory store. Time-driven cases (retention, lease renewal) run on the
//! memory store only, where tokio's paused clock controls them.
#![cfg(feature = "sqlite")]

mod macro_support;

use std::time::Duration;

use idem::{Idempotency, SqliteStore};
use macro_support::Harness;

/// A fresh database file, responses limited to 512 bytes; the record count is read with SQL.
async fn harness() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    // Without the background pruner, whose lease is a row while it runs: the harness counts rows.
    let store = SqliteStore::builder()
        .pruner(None)
        .open(dir.path().join("idem.db"))
        .await
        .unwrap();
    let engine = Idempotency::builder(store.clone())
        .max_response_bytes(512)
        .build()
        .unwrap();
    let records = store.clone();
    Harness::new(
        engine,
        Idempotency::new(store.clone()),
        Box::new(move || {
            let store = records.clone();
            Box::pin(async move {
                let sql = format!("SELECT COUNT(*) FROM {}", store.table());
                let n: i64 = sqlx::query_scalar(&sql)
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                usize::try_from(n).unwrap()
            })
        }),
        dir,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_storm() {
    macro_support::duplicate_storm(&harness().await, Duration::from_millis(20)).await;
}

#[tokio::test]
async fn skipped_arguments_are_not_hashed() {
    macro_support::skipped_arguments_are_not_hashed(&harness().await).await;
}

#[tokio::test]
async fn key_only_arguments_are_not_hashed() {
    macro_support::key_only_arguments_are_not_hashed(&harness().await).await;
}

#[tokio::test]
async fn error_releases_the_claim() {
    macro_support::error_releases_the_claim(&harness().await).await;
}

#[tokio::test]
async fn fingerprint_mismatch_is_key_reused() {
    macro_support::fingerprint_mismatch_is_key_reused(&harness().await).await;
}

#[tokio::test]
async fn default_fingerprint_refuses_another_request() {
    macro_support::default_fingerprint_refuses_another_request(&harness().await).await;
}

#[tokio::test]
async fn unit_fingerprint_replays_any_request() {
    macro_support::unit_fingerprint_replays_any_request(&harness().await).await;
}

#[tokio::test]
async fn explicit_fingerprint_wins() {
    macro_support::explicit_fingerprint_wins(&harness().await).await;
}

#[tokio::test]
async fn default_fingerprint_leaves_out_engine_key_and_caller() {
    macro_support::default_fingerprint_leaves_out_engine_key_and_caller(&harness().await).await;
}

#[tokio::test]
async fn invalid_keys_change_nothing() {
    macro_support::invalid_keys_change_nothing(&harness().await).await;
}

#[tokio::test]
async fn oversized_response_is_not_run_again() {
    macro_support::oversized_response_is_not_run_again(&harness().await).await;
}

#[tokio::test]
async fn no_key_runs_every_time() {
    macro_support::no_key_runs_every_time(&harness().await).await;
}

#[tokio::test]
async fn cancelled_call_releases_its_claim() {
    macro_support::cancelled_call_releases_its_claim(&harness().await).await;
}

#[tokio::test]
async fn callers_do_not_share_records() {
    macro_support::callers_do_not_share_records(&harness().await).await;
}

#[tokio::test(flavor = "current_thread")]
async fn cancelled_then_retried_is_never_locked() {
    macro_support::cancelled_then_retried_is_never_locked(&harness().await).await;
}

#[tokio::test(flavor = "current_thread")]
async fn detached_body_survives_its_caller() {
    macro_support::detached_body_survives_its_caller(&harness().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_versions_tell_a_changed_fingerprint_from_a_reused_key() {
    macro_support::policy_versions_tell_a_changed_fingerprint_from_a_reused_key(&harness().await)
        .await;
}
