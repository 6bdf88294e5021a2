//! The engine's metrics (feature `metrics`), through the `metrics` facade: one set of handles
//! per engine and scope, found in the engine's slot for the first scope its calls reported in,
//! or else through a per-thread cache. `no_meters.rs` is the same API
//! recording nothing, for a build without the feature.

use std::sync::Arc;
use std::time::Duration;

use super::{Scope, Stage};

/// The label value of `scope`.
fn label(scope: &Scope) -> metrics::SharedString {
    match scope {
        Scope::Static(s) => metrics::SharedString::from(*s),
        Scope::Shared(s) => metrics::SharedString::from(s.clone()),
    }
}

/// The metric handles of one scope, registered once per engine and scope: recording through a
/// handle is an atomic operation, where the `metrics` macros would build and look up a key on
/// every call.
struct Instruments {
    scope: metrics::SharedString,
    /// `idem_calls_total` by outcome, registered on first use.
    calls: [std::sync::OnceLock<metrics::Counter>; STAGES],
    claim: metrics::Histogram,
    work: metrics::Histogram,
    complete: metrics::Histogram,
    in_flight: metrics::Gauge,
}

const STAGES: usize = Stage::Cancelled as usize + 1;

impl Instruments {
    fn new(scope: &Scope) -> Instruments {
        let scope = label(scope);
        let label = |name: &'static str| metrics::histogram!(name, "scope" => scope.clone());
        Instruments {
            calls: std::array::from_fn(|_| std::sync::OnceLock::new()),
            claim: label("idem_claim_seconds"),
            work: label("idem_work_seconds"),
            complete: label("idem_complete_seconds"),
            in_flight: metrics::gauge!("idem_claims_in_flight", "scope" => scope.clone()),
            scope,
        }
    }

    fn ended(&self, stage: Stage) {
        self.calls[stage as usize]
            .get_or_init(|| {
                metrics::counter!(
                    "idem_calls_total",
                    "scope" => self.scope.clone(),
                    "outcome" => stage.as_str()
                )
            })
            .increment(1);
    }
}

/// An engine's [`Instruments`], by scope, and how many calls in one record their latencies.
pub(crate) struct Meters {
    /// Unique among the process's `Meters`: what a thread's cache of recent instruments is keyed
    /// by (an address could be reused by a later engine).
    id: u64,
    /// The instruments of the first scope this engine's calls reported in (most engines have
    /// one): found here with no write to shared memory and no thread-local cache's search.
    first: std::sync::OnceLock<(Scope, Arc<Instruments>)>,
    by_scope: std::sync::RwLock<
        std::collections::HashMap<Box<str>, Arc<Instruments>, foldhash::fast::RandomState>,
    >,
    latencies_one_in: u32,
}

/// How many (engine, scope) pairs each thread keeps the instruments of.
const RECENT: usize = 4;

/// One entry of a thread's cache: the instruments of one scope of one engine.
struct Recent {
    meters: u64,
    scope: Box<str>,
    instruments: Arc<Instruments>,
}

thread_local! {
    /// The instruments this thread used last, by engine ([`Meters::id`]) and scope. Found here,
    /// a call reads them with no write to memory that other threads share: the shared map's
    /// lock and an `Arc`'s count, taken on every call, made each worker thread of a busy
    /// runtime pull those cache lines from the other (a tenth of a microsecond a call). An
    /// entry keeps its instruments (metric handles) alive after its engine is gone, at most
    /// [`RECENT`] per thread.
    static RECENT_INSTRUMENTS: std::cell::RefCell<Vec<Recent>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Meters {
    pub(crate) fn new(latencies_one_in: u32) -> Meters {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Meters {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            first: std::sync::OnceLock::new(),
            by_scope: Default::default(),
            latencies_one_in,
        }
    }

    /// The instruments of `scope` from the shared map, registered (with the recorder installed
    /// now) at the scope's first call.
    fn of(&self, scope: &Scope) -> Arc<Instruments> {
        use std::sync::PoisonError;
        if let Some(found) = self
            .by_scope
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(scope.as_str())
        {
            return found.clone();
        }
        self.by_scope
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(scope.as_str().into())
            .or_insert_with(|| Arc::new(Instruments::new(scope)))
            .clone()
    }

    /// Runs `record` on the instruments of `scope`: from the engine's slot when `scope` is the
    /// first its calls reported in; else from this thread's cache when they are in it,
    /// otherwise from the shared map, then kept in the cache (the oldest of [`RECENT`] entries
    /// gives way).
    fn with(&self, scope: &Scope, record: impl FnOnce(&Instruments)) {
        let first = self.first.get_or_init(|| (scope.clone(), self.of(scope)));
        if same(&first.0, scope) {
            return record(&first.1);
        }
        let name = scope.as_str();
        let mut record = Some(record);
        // `try_with`: a probe dropped while its thread's locals are being torn down goes to the
        // map instead.
        let _ = RECENT_INSTRUMENTS.try_with(|recent| {
            let Ok(mut recent) = recent.try_borrow_mut() else {
                return;
            };
            let found = recent
                .iter()
                .position(|r| r.meters == self.id && *r.scope == *name);
            let at = match found {
                Some(at) => at,
                None => {
                    if recent.len() == RECENT {
                        recent.remove(0);
                    }
                    recent.push(Recent {
                        meters: self.id,
                        scope: name.into(),
                        instruments: self.of(scope),
                    });
                    recent.len() - 1
                }
            };
            if let (Some(record), Some(entry)) = (record.take(), recent.get(at)) {
                record(&entry.instruments);
            }
        });
        if let Some(record) = record {
            record(&self.of(scope));
        }
    }

    /// Whether this call records its latencies: one in `latencies_one_in`, at random (a
    /// per-thread generator, no atomic).
    fn sampled(&self) -> bool {
        self.latencies_one_in <= 1 || fastrand::u32(..self.latencies_one_in) == 0
    }
}

/// An engine's [`Meters`] as one call records through them (a reference: what a call's probe
/// keeps). Latencies are recorded only for a call whose `sampled` is true.
#[derive(Clone, Copy)]
pub(crate) struct Meter<'a>(&'a Meters);

impl<'a> Meter<'a> {
    pub(crate) fn new(meters: &'a Meters) -> Meter<'a> {
        Meter(meters)
    }

    /// Whether a new call records its latencies: [`Meters::sampled`].
    pub(crate) fn sample(self) -> bool {
        self.0.sampled()
    }

    /// The claim attempt of a call of `scope` ended after `took`.
    pub(crate) fn claim_took(self, scope: &Scope, sampled: bool, took: Duration) {
        if sampled {
            self.0.with(scope, |i| i.claim.record(took.as_secs_f64()));
        }
    }

    /// The work of a call of `scope` ended after `took`.
    pub(crate) fn work_took(self, scope: &Scope, sampled: bool, took: Duration) {
        if sampled {
            self.0.with(scope, |i| i.work.record(took.as_secs_f64()));
        }
    }

    /// The first try at storing a call's result ended after `took`.
    pub(crate) fn complete_took(self, scope: &Scope, sampled: bool, took: Duration) {
        if sampled {
            self.0
                .with(scope, |i| i.complete.record(took.as_secs_f64()));
        }
    }

    /// A call of `scope` holds its key across an await.
    pub(crate) fn claimed(self, scope: &Scope) {
        self.0.with(scope, |i| i.in_flight.increment(1.0));
    }

    /// A call of `scope` ended at `stage`; `in_flight`: it had raised the gauge
    /// ([`claimed`](Self::claimed)).
    pub(crate) fn ended(self, scope: &Scope, stage: Stage, in_flight: bool) {
        self.0.with(scope, |i| {
            i.ended(stage);
            if in_flight {
                i.in_flight.decrement(1.0);
            }
        });
    }
}

/// Whether `a` and `b` are the same scope: by address first (a static scope given twice, an
/// `Arc` shared), then by their text.
fn same(a: &Scope, b: &Scope) -> bool {
    let (a, b) = (a.as_str(), b.as_str());
    std::ptr::eq(a, b) || a == b
}

/// A pruner deleted `deleted` entries of `target` (`records` or `history`): `idem_pruned_total`.
pub(crate) fn pruned(target: &'static str, deleted: u64) {
    metrics::counter!("idem_pruned_total", "target" => target).increment(deleted);
}

/// A dispatcher run published `published` messages, failed to publish `failed`, and the
/// longest a published message had waited was `max_lag`: `idem_outbox_published_total`,
/// `idem_outbox_failed_total`, `idem_outbox_lag_seconds` (a gauge, per dispatcher name).
pub(crate) fn dispatched(name: &str, published: u64, failed: u64, max_lag: Duration) {
    let name = metrics::SharedString::from(name.to_owned());
    metrics::counter!("idem_outbox_published_total", "outbox" => name.clone()).increment(published);
    metrics::counter!("idem_outbox_failed_total", "outbox" => name.clone()).increment(failed);
    metrics::gauge!("idem_outbox_lag_seconds", "outbox" => name).set(max_lag.as_secs_f64());
}
