//! Seeing what the engine does: lifecycle hooks ([`Observer`]), metrics (feature `metrics`) and
//! tracing.
//!
//! Every guarded call of an [`Idempotency`](crate::Idempotency) engine reports through one place:
//!
//! - **Hooks.** An [`Observer`] set with [`EngineBuilder::observer`](crate::EngineBuilder::observer) is
//!   called when the call claims its key, and once when it ends (completed, replayed, released,
//!   locked, …; see [`Stage`]). Without one, nothing is called.
//! - **Metrics** (feature `metrics`), through the [`metrics`](https://docs.rs/metrics) facade, so
//!   any exporter works. All are labelled by `scope` (the call's [`Call::scope`](crate::Call::scope);
//!   never the key, so the number of series stays bounded):
//!
//!   | name | kind | labels | what |
//!   |---|---|---|---|
//!   | `idem_calls_total` | counter | `scope`, `outcome` | calls by how they ended: the [`Stage::as_str`] of their last stage |
//!   | `idem_claim_seconds` | histogram | `scope` | from the call's start until it held the key, had the replay, or was refused (includes waiting under `OnLocked::Wait`) |
//!   | `idem_work_seconds` | histogram | `scope` | how long the work ran |
//!   | `idem_complete_seconds` | histogram | `scope` | storing the result (the first try) |
//!   | `idem_claims_in_flight` | gauge | `scope` | claims held by running work in this process: work that is awaiting something, or a claim held between the requests of a split call (work done in its first poll is never seen by a scrape, and is not counted) |
//!   | `idem_pruned_total` | counter | `target` | records (`records`) or request ids (`history`) deleted by a `Pruner` |
//!   | `idem_outbox_published_total` | counter | `outbox` | messages a `Dispatcher` published (its lease name) |
//!   | `idem_outbox_failed_total` | counter | `outbox` | messages whose publishing failed (left unsent for the next run) |
//!   | `idem_outbox_lag_seconds` | gauge | `outbox` | the longest a message published by the last run had waited since it was added |
//!
//!   The three histograms record one call in
//!   [`DEFAULT_LATENCIES_ONE_IN`](crate::DEFAULT_LATENCIES_ONE_IN), drawn at random
//!   ([`EngineBuilder::sample_latencies`](crate::EngineBuilder::sample_latencies) changes it; `1` records
//!   every call); the counters and the gauge count every call.
//!
//! - **Tracing.** Each guarded call runs in a span `idem.call` with the fields `scope`, `key` (the
//!   first 8 bytes of the key's hash, in hex: the key is a SHA-256 of scope, caller and client
//!   key, so this never shows what the client sent) and `outcome`; the store round trips are
//!   `debug` events inside it. No response and no raw client key is ever recorded.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use idem::{Error, Idempotency, Key, MemoryStore, Stage};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let log = seen.clone();
//! let engine = Idempotency::builder(MemoryStore::new())
//!     .observer(move |event: &idem::CallEvent<'_>| log.lock().unwrap().push((event.stage(), event.key().to_string())))
//!     .build()?;
//! let key = Key::derive("charge", "", "order-1")?;
//! engine.call(key).scope("charge").run(async { Ok::<_, Error>(1) }).await?;
//! engine.call(key).scope("charge").run(async { Ok::<_, Error>(2) }).await?;
//! let stages: Vec<Stage> = seen.lock().unwrap().iter().map(|(s, _)| *s).collect();
//! assert_eq!(stages, [Stage::Claimed, Stage::Completed, Stage::Replayed]);
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::key::Key;

// The metrics, or (without the feature) the same API recording nothing: the only place the
// feature `metrics` is looked at.
#[cfg(feature = "metrics")]
mod meters;
#[cfg(not(feature = "metrics"))]
#[path = "observe/no_meters.rs"]
mod meters;

use meters::Meter;
pub(crate) use meters::{dispatched, pruned, Meters};

/// How many calls in one get their latencies recorded, by default: see
/// [`EngineBuilder::sample_latencies`](crate::EngineBuilder::sample_latencies).
///
/// ```
/// assert!(idem::DEFAULT_LATENCIES_ONE_IN >= 1);
/// ```
pub const DEFAULT_LATENCIES_ONE_IN: u32 = 16;

/// Where a guarded call is, as an [`Observer`] sees it. Every call reports [`Claimed`]
/// (if it claimed its key) and then exactly one of the others, its outcome.
///
/// [`Claimed`]: Stage::Claimed
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// The call claimed its key; its work is about to run.
    Claimed,
    /// The work ran and its result was stored (or is being stored in the background after a
    /// passing store failure).
    Completed,
    /// The work ran, but its result could not be kept (too large, not encodable): retries get
    /// [`Error::ResultNotRetained`]. Also the outcome of a retry that met such a record.
    NotRetained,
    /// The call replayed a stored result; its work did not run.
    Replayed,
    /// The work failed (or its error was not to be stored): the claim was released, so a retry
    /// runs again.
    Released,
    /// Another call held the key: [`Error::Locked`].
    Locked,
    /// The key was used before with another fingerprint: [`Error::KeyReused`].
    KeyReused,
    /// The key was taken over while the work ran: [`Error::LeaseLost`]. The work may have run
    /// twice: alert on this.
    LeaseLost,
    /// The store failed ([`Error::Store`]), or the call was refused for another reason (an
    /// invalid option, a stored result that cannot be decoded).
    Failed,
    /// The key's claim lapsed with no completion and its work cannot be repeated safely:
    /// [`Error::Uncertain`]. An operator or a reconciler must resolve it: alert on this.
    Uncertain,
    /// The key's result expired and its tombstone refused the call: [`Error::ResultExpired`].
    ResultExpired,
    /// The key was stored under another policy version: [`Error::PolicyChanged`].
    PolicyChanged,
    /// The key's operation was resolved as abandoned: [`Error::Abandoned`].
    Abandoned,
    /// The caller went away (a dropped future) before the call ended. A claim it held is
    /// released; detached work is not cancelled and reports its own end.
    Cancelled,
}

impl Stage {
    /// The stage's name, as the `outcome` label of `idem_calls_total` and the span's `outcome`
    /// field: `claimed`, `completed`, `not_retained`, `replayed`, `released`, `locked`,
    /// `key_reused`, `lease_lost`, `failed`, `uncertain`, `result_expired`, `policy_changed`,
    /// `abandoned`, `cancelled`.
    ///
    /// ```
    /// assert_eq!(idem::Stage::LeaseLost.as_str(), "lease_lost");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Claimed => "claimed",
            Stage::Completed => "completed",
            Stage::NotRetained => "not_retained",
            Stage::Replayed => "replayed",
            Stage::Released => "released",
            Stage::Locked => "locked",
            Stage::KeyReused => "key_reused",
            Stage::LeaseLost => "lease_lost",
            Stage::Failed => "failed",
            Stage::Uncertain => "uncertain",
            Stage::ResultExpired => "result_expired",
            Stage::PolicyChanged => "policy_changed",
            Stage::Abandoned => "abandoned",
            Stage::Cancelled => "cancelled",
        }
    }

    /// The outcome an engine error gives a call.
    pub(crate) fn of_error(error: &Error) -> Stage {
        match error {
            Error::Locked { .. } => Stage::Locked,
            Error::KeyReused => Stage::KeyReused,
            Error::LeaseLost => Stage::LeaseLost,
            Error::ResultNotRetained { .. } => Stage::NotRetained,
            Error::Uncertain { .. } => Stage::Uncertain,
            Error::ResultExpired { .. } => Stage::ResultExpired,
            Error::PolicyChanged { .. } => Stage::PolicyChanged,
            Error::Abandoned { .. } => Stage::Abandoned,
            _ => Stage::Failed,
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stage of one guarded call, given to an [`Observer`].
#[derive(Debug, Clone, Copy)]
pub struct CallEvent<'a> {
    stage: Stage,
    scope: &'a str,
    key: &'a Key,
    took: Option<Duration>,
}

impl CallEvent<'_> {
    /// Where the call is.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// The call's [`scope`](crate::Call::scope) label (`"unscoped"` when none was given).
    pub fn scope(&self) -> &str {
        self.scope
    }

    /// The call's key (a hash: show it with `{}`, find the record with
    /// [`Store::get`](crate::Store::get), remove it with [`Store::evict`](crate::Store::evict)).
    pub fn key(&self) -> &Key {
        self.key
    }

    /// For [`Stage::Completed`], [`Stage::NotRetained`] and [`Stage::Released`] after the work
    /// ran: how long the work took.
    pub fn took(&self) -> Option<Duration> {
        self.took
    }
}

/// A lifecycle hook: called with each [`CallEvent`] of every guarded call of an engine (audit logs,
/// tests, finding the key of one request). Set it with
/// [`EngineBuilder::observer`](crate::EngineBuilder::observer); any `Fn(&CallEvent)` closure is one.
///
/// It runs inline on the call's task, so keep it short and never block in it: a slow observer
/// slows the call (and a blocked one stops it, lease renewal included, as any blocking code in
/// an async task does).
///
/// **An observer cannot change a call's outcome.** A panic in it, at any stage, is caught and
/// reported through `tracing` (an `error` event in the call's span, with the stage and the
/// panic's message), and the call goes on as if the observer had returned: its work runs once,
/// its claim is completed or released as without an observer, and its caller gets the work's
/// result or the typed error it would have had.
///
/// ```
/// use idem::{CallEvent, Observer, Stage};
/// struct LeaseLostAlarm;
/// impl Observer for LeaseLostAlarm {
///     fn observe(&self, event: &CallEvent<'_>) {
///         if event.stage() == Stage::LeaseLost {
///             eprintln!("key {} ({}) may have run twice", event.key(), event.scope());
///         }
///     }
/// }
/// let engine = idem::Idempotency::builder(idem::MemoryStore::new())
///     .observer(LeaseLostAlarm)
///     .build()?;
/// # let _ = engine; Ok::<(), idem::Error>(())
/// ```
pub trait Observer: Send + Sync + 'static {
    /// One stage of one call.
    fn observe(&self, event: &CallEvent<'_>);
}

impl<F: Fn(&CallEvent<'_>) + Send + Sync + 'static> Observer for F {
    fn observe(&self, event: &CallEvent<'_>) {
        self(event)
    }
}

/// The label a call carries in metrics, traces and hooks.
#[derive(Debug, Clone)]
pub(crate) enum Scope {
    Static(&'static str),
    Shared(Arc<str>),
}

impl Default for Scope {
    fn default() -> Self {
        Scope::Static("unscoped")
    }
}

impl Scope {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Scope::Static(s) => s,
            Scope::Shared(s) => s,
        }
    }
}

/// The first 8 bytes of a key, in hex: enough to find it in logs, nothing of what the client
/// sent.
pub(crate) struct ShortKey<'a>(pub(crate) &'a Key);

impl fmt::Display for ShortKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0.as_bytes()[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl Default for Meters {
    fn default() -> Meters {
        Meters::new(DEFAULT_LATENCIES_ONE_IN)
    }
}

/// What one guarded call reports, wherever it ends; dropped before it ended, it reports
/// [`Stage::Cancelled`]. Costs nothing beyond a disabled span when there is no observer, no
/// `metrics` feature and no subscriber for the span.
pub(crate) struct Probe<'a> {
    observer: Option<&'a dyn Observer>,
    scope: &'a Scope,
    key: Key,
    /// The call's span; `None` for the empty span (nothing to close or log when dropped).
    span: Option<tracing::Span>,
    meters: Meter<'a>,
    /// Whether this call records its latencies (always false without `metrics`).
    sampled: bool,
    ended: bool,
    claimed: bool,
    /// Whether this call raised `idem_claims_in_flight` (and so lowers it when it ends): once
    /// its work is pending, or its claim is handed to another task or request.
    in_flight: bool,
    work_took: Option<Duration>,
}

/// Whether `tracing`'s `log` fallback could print a line of a disabled DEBUG span: only while no
/// `tracing` subscriber has been set, and `log` lets DEBUG lines through
/// (`tests/observe_log.rs`).
fn log_could_print_spans() -> bool {
    !tracing::dispatcher::has_been_set() && log::max_level() >= log::LevelFilter::Debug
}

impl<'a> Probe<'a> {
    pub(crate) fn new(
        observer: Option<&'a dyn Observer>,
        meters: &'a Meters,
        scope: &'a Scope,
        key: Key,
    ) -> Self {
        // A disabled span keeps its metadata for `tracing`'s `log` fallback (the `log` feature,
        // which sqlx turns on), and checks `log`'s level each time it is entered (every poll) or
        // a field is recorded: about 280 instructions a call. When nothing could come of it, the
        // call gets the empty span, which checks nothing, and is not built at all.
        let could_log = log_could_print_spans();
        let span = if could_log || tracing::enabled!(tracing::Level::DEBUG) {
            let span = tracing::debug_span!(
                "idem.call",
                scope = scope.as_str(),
                key = %ShortKey(&key),
                outcome = tracing::field::Empty,
            );
            (!span.is_disabled() || could_log).then_some(span)
        } else {
            None
        };
        let meters = Meter::new(meters);
        Probe {
            observer,
            scope,
            key,
            span,
            meters,
            sampled: meters.sample(),
            ended: false,
            claimed: false,
            in_flight: false,
            work_took: None,
        }
    }

    /// The report of a call that claimed its key in an earlier request (the engine's split
    /// calls): it ends here, as a call that claimed ends.
    pub(crate) fn held(
        observer: Option<&'a dyn Observer>,
        meters: &'a Meters,
        scope: &'a Scope,
        key: Key,
    ) -> Self {
        let mut probe = Probe::new(observer, meters, scope, key);
        // The request that claimed raised the gauge when it handed the claim over.
        probe.claimed = true;
        probe.in_flight = true;
        probe
    }

    /// Hands the call's report over to another task: what it has recorded so far, without
    /// ending it (a suspended probe reports nothing when dropped). [`Probe::resume`] takes it
    /// back up.
    pub(crate) fn suspend(mut self) -> Suspended {
        self.ended = true;
        // A claim handed to another task or request is held across it: in flight from now.
        if self.claimed {
            self.working();
        }
        Suspended {
            key: self.key,
            span: self.span.take().unwrap_or_else(tracing::Span::none),
            sampled: self.sampled,
            claimed: self.claimed,
            in_flight: self.in_flight,
        }
    }

    /// Takes up a suspended call's report, with the engine's observer and meters and the call's
    /// scope.
    pub(crate) fn resume(
        suspended: Suspended,
        observer: Option<&'a dyn Observer>,
        meters: &'a Meters,
        scope: &'a Scope,
    ) -> Self {
        Probe {
            observer,
            scope,
            key: suspended.key,
            span: (!suspended.span.is_none()).then_some(suspended.span),
            meters: Meter::new(meters),
            sampled: suspended.sampled,
            ended: false,
            claimed: suspended.claimed,
            in_flight: suspended.in_flight,
            work_took: None,
        }
    }

    /// The span the call's store round trips are reported in.
    pub(crate) fn span(&self) -> &tracing::Span {
        static NONE: tracing::Span = tracing::Span::none();
        self.span.as_ref().unwrap_or(&NONE)
    }

    /// Whether anything reads the durations of this call; if not, the clock is not read for
    /// them.
    pub(crate) fn timed(&self) -> bool {
        self.sampled
            || self.observer.is_some()
            || self.span.as_ref().is_some_and(|span| !span.is_disabled())
    }

    /// Calls the observer. A panic in it is caught and reported through `tracing`: an
    /// observer is the user's code, and a call ends as it would without one whatever it does
    /// (a panic at `Claimed` would otherwise leave the key claimed until its lease ends).
    // Inlined, so that a call without an observer (most) pays one test here, not a call.
    #[inline(always)]
    fn emit(&self, stage: Stage, took: Option<Duration>) {
        if let Some(observer) = self.observer {
            self.observe(observer, stage, took);
        }
    }

    /// [`emit`](Self::emit) to `observer`.
    #[inline(never)]
    fn observe(&self, observer: &dyn Observer, stage: Stage, took: Option<Duration>) {
        let event = CallEvent {
            stage,
            scope: self.scope.as_str(),
            key: &self.key,
            took,
        };
        let observed =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| observer.observe(&event)));
        if let Err(panic) = observed {
            let message = panic
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("a panic without a message");
            tracing::error!(
                parent: self.span(),
                key = %ShortKey(&self.key),
                stage = stage.as_str(),
                panic = message,
                "the idempotency observer panicked; the call goes on as if it had returned"
            );
        }
    }

    /// The claim attempt ended after `took` (claimed, replayed or refused).
    pub(crate) fn claim_took(&self, took: Duration) {
        tracing::debug!(parent: self.span(), op = "claim", took_us = took.as_micros() as u64);
        self.meters.claim_took(self.scope, self.sampled, took);
    }

    /// The call holds its key; its work starts.
    pub(crate) fn claimed(&mut self) {
        self.claimed = true;
        self.emit(Stage::Claimed, None);
    }

    /// The call's work is pending (it awaits something): its claim is in flight until the call
    /// ends. Work that is done in its first poll never raises `idem_claims_in_flight`: no scrape
    /// could have seen it between two of its instructions, and the gauge's two updates were the
    /// dearest part of a call's metrics (docs/performance.md, "Metrics and tracing").
    pub(crate) fn working(&mut self) {
        if self.claimed && !std::mem::replace(&mut self.in_flight, true) {
            self.meters.claimed(self.scope);
        }
    }

    /// The work ended after `took`.
    pub(crate) fn work_took(&mut self, took: Duration) {
        self.work_took = Some(took);
        self.meters.work_took(self.scope, self.sampled, took);
    }

    /// The first try at storing the result ended after `took`.
    pub(crate) fn complete_took(&self, took: Duration) {
        tracing::debug!(parent: self.span(), op = "complete", took_us = took.as_micros() as u64);
        self.meters.complete_took(self.scope, self.sampled, took);
    }

    /// The call ended this way.
    // Inlined, so that the second report of a call that ended (its drop) is one test.
    #[inline(always)]
    pub(crate) fn end(&mut self, stage: Stage) {
        if !std::mem::replace(&mut self.ended, true) {
            self.ended(stage);
        }
    }

    /// [`end`](Self::end), the first time.
    #[inline(never)]
    fn ended(&mut self, stage: Stage) {
        if let Some(span) = &self.span {
            span.record("outcome", stage.as_str());
        }
        self.meters.ended(self.scope, stage, self.in_flight);
        let took = match stage {
            Stage::Completed | Stage::NotRetained | Stage::Released | Stage::LeaseLost => {
                self.work_took
            }
            _ => None,
        };
        self.emit(stage, took);
    }

    /// The call ended with this result: its error's outcome, or `ok`.
    pub(crate) fn end_with<T>(&mut self, result: &Result<T, Error>, ok: Stage) {
        self.end(match result {
            Ok(_) => ok,
            Err(e) => Stage::of_error(e),
        });
    }
}

/// A [`Probe`] between two tasks: see [`Probe::suspend`].
pub(crate) struct Suspended {
    key: Key,
    span: tracing::Span,
    sampled: bool,
    claimed: bool,
    in_flight: bool,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        self.end(Stage::Cancelled);
    }
}
