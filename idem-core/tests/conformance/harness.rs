use std::sync::Arc;

use async_trait::async_trait;
use idem_core::Store;

/// A store under test. `new` gives a fresh, empty store, or `None` to skip (after printing why).
#[async_trait]
pub trait Harness: Sized + Send + Sync + 'static {
    async fn new() -> Option<Self>;
    fn store(&self) -> Arc<dyn Store>;
}

/// The claim order of a SQL store's harness, as a const generic (an enum cannot be one):
/// 0 adaptive (the default), 1 claim first, 2 read first. Each SQL store runs the suite in all
/// three, so both statement orders keep every rule whatever the adaptive order picks.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn claim_order(order: u8) -> idem_core::ClaimOrder {
    match order {
        1 => idem_core::ClaimOrder::ClaimFirst,
        2 => idem_core::ClaimOrder::ReadFirst,
        _ => idem_core::ClaimOrder::Adaptive,
    }
}

/// Instantiates every conformance test for one store: `conformance!(module, Harness, (tokio::test args))`.
macro_rules! conformance {
    ($store:ident, $harness:ty, $rt:tt) => {
        mod $store {
            conformance!(@each $harness, $rt;
                new_key_starts,
                concurrent_starts_claim_once,
                live_claim_locks,
                completed_replays,
                completed_without_response_replays,
                fingerprint_mismatch_is_key_reused,
                matching_or_absent_fingerprint_replays,
                expired_lease_is_taken_over,
                stale_claim_is_fenced,
                token_is_unique_across_abort_and_reclaim,
                abort_frees_key,
                renew_extends_lease,
                complete_after_lease_end_without_takeover,
                retention_ends_then_runs_again,
                prune_deletes_only_expired,
                prune_respects_limit,
                get_reports_live_records_only,
                evict_fences_running_claim,
                bad_durations_change_nothing,
                complete_twice_keeps_the_first_result,
                engine_storm_runs_each_key_once,
                engine_renews_long_work,
                engine_crashed_worker_frees_after_one_lease,
                engine_error_aborts_so_retry_runs,
                engine_cancelled_call_releases_claim,
                engine_panicking_call_releases_claim,
                engine_key_reused,
                engine_bad_input_changes_nothing,
                engine_unretained_result_never_reruns,
                engine_retention_then_rerun,
                engine_stale_completion_is_lease_lost,
                engine_wait_mode_replays,
                engine_wait_mode_times_out,
                engine_no_key_runs_every_time,
                engine_stored_errors_replay
            );
        }
    };
    (@each $harness:ty, $rt:tt; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test $rt]
            async fn $test() {
                if let Some(h) = <$harness as $crate::harness::Harness>::new().await {
                    $crate::all::$test(h).await;
                }
            }
        )*
    };
}
