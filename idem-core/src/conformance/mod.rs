//! The store conformance suite (feature `conformance`): the rules every [`Store`] keeps,
//! written once, for your own store to run.
//!
//! idem runs this suite against each of its stores (memory; SQLite and PostgreSQL, each in every
//! claim order; DynamoDB; Redis on one server and on a cluster). A store of yours passes it
//! before it can stand in for them. It checks the [`Store`] contract (atomic claim, fencing,
//! lease is not retention, replay, fingerprints, pruning, eviction, bounded input, and steps:
//! resumed across attempts, fenced by the claim, ended with their retention) through the
//! trait, and the engine's promises
//! ([`Idempotency`](crate::Idempotency): work runs once under a storm, long work is renewed,
//! cancelled and failed calls release their claim, unretained results never re-run) on top of
//! your store.
//!
//! Write a [`Harness`] that makes a fresh, empty store, then either
//!
//! - [`suite!`] in a test file: one `#[tokio::test]` per rule, so each rule passes or fails on
//!   its own and runs in parallel with the others; or
//! - [`run_all`]: every rule in turn, inside one test or program.
//!
//! Time passes through `tokio::time::sleep`. Rules wait out short leases of 300 ms (and
//! a lease of 1 s that must be renewed) and allow leases of 30 s to outlive them. A store on
//! the database's own clock really waits (a few seconds in all); a store with an injectable
//! clock can run on [`TokioClock`](crate::TokioClock) in a paused runtime
//! (`start_paused = true`, tokio's `test-util` feature), where the waits are instant and exact.
//! On a slow or loaded machine more than 300 ms can pass between two calls of a rule that
//! expects a lease or retention to be still live: [`time_scale`] lengthens every timed lease,
//! wait and timeout of the rules (`IDEM_TEST_TIME_SCALE=3` makes the 300 ms lease 900 ms).
//! Each rule takes one or two keys in the scope `conformance`. A rule that fails panics, with
//! what it expected and what it got.
//!
//! The macro expands to `#[tokio::test]` functions, so the crate that calls it needs `tokio`
//! (features `macros` and `rt`, plus `rt-multi-thread` for a multi-threaded runtime and
//! `test-util` for a paused one) among its dev-dependencies, and `async-trait` for the harness.
//!
//! # Example
//!
//! A store of your own (here a newtype that hands every call to a [`MemoryStore`](crate::MemoryStore)),
//! its harness, and the whole suite:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use async_trait::async_trait;
//! use idem::conformance::{self, Harness};
//! use idem::{Abandoned, AbandonedQuery, Claim, Completion, Error, Key, MemoryStore, Record};
//! use idem::{ClaimOutcome, ClaimRequest, StepLog, StepWrite, Store, TokioClock};
//! use idem::{Token, UncertainOperation};
//!
//! #[derive(Clone)]
//! struct MyStore(MemoryStore);
//!
//! #[async_trait]
//! impl Store for MyStore {
//!     async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
//!         self.0.claim(request).await
//!     }
//!     async fn complete(&self, claim: &Claim, done: Completion<'_>) -> Result<(), Error> {
//!         self.0.complete(claim, done).await
//!     }
//!     async fn abort(&self, claim: &Claim) -> Result<(), Error> {
//!         self.0.abort(claim).await
//!     }
//!     async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
//!         self.0.renew(claim, lease).await
//!     }
//!     async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
//!         self.0.get(key).await
//!     }
//!     async fn evict(&self, key: &Key) -> Result<bool, Error> {
//!         self.0.evict(key).await
//!     }
//!     async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
//!         self.0.prune_expired(limit).await
//!     }
//!     async fn begin_steps(&self, claim: &Claim, retention: Duration) -> Result<StepLog, Error> {
//!         self.0.begin_steps(claim, retention).await
//!     }
//!     async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
//!         self.0.write_step(claim, step).await
//!     }
//!     async fn find_abandoned(&self, query: AbandonedQuery<'_>) -> Result<Vec<Abandoned>, Error> {
//!         self.0.find_abandoned(query).await
//!     }
//!     async fn take_uncertain(&self, key: &Key, token: Token, lease: Duration) -> Result<Claim, Error> {
//!         self.0.take_uncertain(key, token, lease).await
//!     }
//!     async fn find_uncertain(
//!         &self,
//!         query: AbandonedQuery<'_>,
//!     ) -> Result<Vec<UncertainOperation>, Error> {
//!         self.0.find_uncertain(query).await
//!     }
//! }
//!
//! /// A fresh store per rule, on tokio's clock (paused in the tests below).
//! struct MyHarness(MyStore);
//!
//! #[async_trait]
//! impl Harness for MyHarness {
//!     async fn new() -> Option<Self> {
//!         Some(MyHarness(MyStore(MemoryStore::with_clock(TokioClock::new()))))
//!     }
//!     fn store(&self) -> Arc<dyn Store> {
//!         Arc::new(self.0.clone())
//!     }
//! }
//!
//! // In a test file: `mod my_store` with one test per rule, each on a paused runtime.
//! idem::conformance::suite!(my_store, MyHarness, (start_paused = true));
//!
//! // Or all rules in one go.
//! #[tokio::main(flavor = "current_thread", start_paused = true)]
//! async fn main() {
//!     conformance::run_all::<MyHarness>().await;
//! }
//! ```

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;

use crate::store::Store;

mod completer;
mod encrypted;
mod engine;
mod lapse;
mod steps;
mod store;

pub use completer::*;
pub use encrypted::*;
pub use engine::*;
pub use lapse::*;
pub use steps::*;
pub use store::*;

/// Makes the stores a conformance run tests: a fresh, empty one per rule.
///
/// `new` returns `None` to skip the rule (after saying why, for instance that the test
/// database is not configured); `store` hands out the store, as many times as a rule asks, all
/// handles on the same data.
///
/// ```
/// use std::sync::Arc;
/// use idem::{conformance::Harness, MemoryStore, Store};
///
/// struct Memory(MemoryStore);
///
/// #[async_trait::async_trait]
/// impl Harness for Memory {
///     async fn new() -> Option<Self> {
///         Some(Memory(MemoryStore::new()))
///     }
///     fn store(&self) -> Arc<dyn Store> {
///         Arc::new(self.0.clone())
///     }
/// }
/// ```
#[async_trait]
pub trait Harness: Sized + Send + Sync + 'static {
    /// A fresh, empty store, or `None` to skip the rule.
    async fn new() -> Option<Self>;

    /// The store under test.
    fn store(&self) -> Arc<dyn Store>;

    /// Whether the store deletes expired records by itself, as Redis does with key expiry, so
    /// that [`Store::prune_expired`] has nothing left to delete and returns 0. The prune rules
    /// then check that expired records are gone and live ones stay, instead of counting what
    /// `prune_expired` deleted. `false` unless overridden.
    fn expires_by_itself(&self) -> bool {
        false
    }

    /// Whether the store keeps steps ([`Store::begin_steps`], [`Store::write_step`];
    /// docs/steps.md). `true` unless overridden; a store that says `false` must refuse them
    /// with [`Error::StepsUnsupported`](crate::Error::StepsUnsupported), which the step rules
    /// then check instead.
    fn keeps_steps(&self) -> bool {
        true
    }

    /// Whether the store finds operations abandoned past their lease
    /// ([`Store::find_abandoned`], for the [`Completer`](crate::Completer); docs/steps.md,
    /// "Completer"). As [`keeps_steps`](Self::keeps_steps) unless overridden; a store that
    /// says `false` must refuse with
    /// [`Error::CompleterUnsupported`](crate::Error::CompleterUnsupported), which the
    /// completer rules then check instead.
    fn finds_abandoned(&self) -> bool {
        self.keeps_steps()
    }
}

/// How many times longer than nominal the rules' timed leases, waits and timeouts are: the
/// environment variable `IDEM_TEST_TIME_SCALE`, a number from 1 to 20 (1 when unset). A rule
/// that checks that a 300 ms retention still replays on the next call fails wrongly when the
/// machine takes longer than that between two calls (a busy laptop, a loaded CI runner), so
/// `scripts/test` sets it from the machine. On a paused runtime the longer waits cost nothing;
/// on a real clock they cost the suite's waiting time times the scale. Read once per process.
///
/// ```
/// let scale = idem::conformance::time_scale();
/// assert!((1.0..=20.0).contains(&scale));
/// ```
///
/// # Panics
///
/// When `IDEM_TEST_TIME_SCALE` is set to anything but a number from 1 to 20.
pub fn time_scale() -> f64 {
    static SCALE: OnceLock<f64> = OnceLock::new();
    *SCALE.get_or_init(|| match std::env::var("IDEM_TEST_TIME_SCALE") {
        Err(_) => 1.0,
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(scale) if (1.0..=20.0).contains(&scale) => scale,
            _ => panic!("IDEM_TEST_TIME_SCALE must be a number from 1 to 20, not {v:?}"),
        },
    })
}

/// `nominal` times [`time_scale`].
///
/// ```
/// use std::time::Duration;
/// let lease = idem::conformance::scaled(Duration::from_millis(300));
/// assert!(lease >= Duration::from_millis(300));
/// ```
pub fn scaled(nominal: Duration) -> Duration {
    nominal.mul_f64(time_scale())
}

/// Runs every rule in turn against a fresh store from `H` each, on the current runtime;
/// panics at the first rule that fails. A rule whose [`Harness::new`] gives `None` is skipped.
/// See [the module](self) for an example; [`suite!`] runs the rules as separate tests instead.
pub async fn run_all<H: Harness>() {
    crate::__conformance!(@rules run_all H);
}

/// Instantiates the conformance suite: `suite!(module, Harness, (tokio::test arguments))`
/// expands to `mod module` holding one `#[tokio::test(arguments)]` per rule, named after the
/// rule, each on a fresh store of the [`Harness`] (a type in scope where the macro is called).
/// See [the module](self) for an example.
///
/// ```
/// # use std::sync::Arc;
/// # use idem::{conformance::Harness, MemoryStore, Store};
/// # struct MyHarness(MemoryStore);
/// # #[async_trait::async_trait]
/// # impl Harness for MyHarness {
/// #     async fn new() -> Option<Self> { Some(MyHarness(MemoryStore::new())) }
/// #     fn store(&self) -> Arc<dyn Store> { Arc::new(self.0.clone()) }
/// # }
/// // Tests `my_store::new_key_starts`, `my_store::engine_storm_runs_each_key_once`, … on a
/// // multi-threaded runtime each.
/// idem::conformance::suite!(my_store, MyHarness, (flavor = "multi_thread", worker_threads = 2));
/// # fn main() {}
/// ```
#[doc(inline)]
pub use crate::__conformance as suite;

/// The list of rules, written once for [`suite!`] and [`run_all`].
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance {
    ($module:ident, $harness:ty, $rt:tt $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::__conformance!(@rules tests $harness, $rt);
        }
    };
    (@rules $($then:tt)*) => {
        $crate::__conformance!(@ $($then)*;
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
            lapsed_holder_completes_while_nobody_took_over,
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
            engine_stored_errors_replay,
            engine_panicking_observer_changes_nothing,
            steps_resume_across_attempts,
            claim_steps_begins_as_begin_steps_would,
            stale_claim_cannot_write_steps,
            finished_step_keeps_its_first_result,
            evict_deletes_steps,
            steps_end_with_their_retention,
            engine_steps_replay_finished_steps,
            engine_changed_step_is_a_mismatch,
            engine_interrupted_step_per_mode,
            abandoned_found_when_unheld_only,
            abandoned_pages_by_key,
            engine_completer_finishes_abandoned,
            uncertain_lapse_is_never_taken_over,
            uncertain_holder_still_completes,
            take_uncertain_is_fenced,
            uncertain_resolutions_free_or_lapse_again,
            uncertain_pages_by_key,
            step_writes_set_what_a_lapse_leaves,
            tombstone_answers_expired_then_frees,
            tombstone_is_pruned_after_key_retention,
            policy_change_is_not_key_reused,
            engine_uncertain_never_reruns,
            engine_uncertain_failed_or_abandoned,
            engine_tombstone_then_runs,
            engine_reconciler_settles_uncertain_operations,
            engine_failed_resolution_reruns_an_interrupted_step,
            encrypted_store_keeps_no_plaintext,
            encrypted_store_rotates_keys,
            encrypted_store_refuses_moved_and_wrong_keys
        );
    };
    (@tests $harness:ty, $rt:tt; $($rule:ident),*) => {
        $(
            #[::tokio::test $rt]
            async fn $rule() {
                if let Some(h) = <$harness as $crate::conformance::Harness>::new().await {
                    $crate::conformance::$rule(h).await;
                }
            }
        )*
    };
    (@run_all $harness:ident; $($rule:ident),*) => {
        $(
            if let Some(h) = <$harness as $crate::conformance::Harness>::new().await {
                $crate::conformance::$rule(h).await;
            }
        )*
    };
}
