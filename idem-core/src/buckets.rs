//! The histogram buckets idem recommends for its metrics in Prometheus.

/// Histogram bucket bounds, in seconds, for each histogram idem records (feature `metrics`):
/// give them to your exporter so that it renders histograms, which Prometheus can aggregate
/// across instances (`histogram_quantile` over `sum by (le)`), instead of summaries, whose
/// quantiles are each process's own. `metrics-exporter-prometheus` renders every histogram
/// without buckets set for it as a summary.
///
/// | histogram | bounds | why |
/// |---|---|---|
/// | `idem_claim_seconds` | 100 µs to 10 s | a claim or replay is one store round trip (0.1–2 ms on SQLite and PostgreSQL), or a wait under `OnLocked::Wait` |
/// | `idem_complete_seconds` | 100 µs to 10 s | storing a result is one round trip |
/// | `idem_work_seconds` | 1 ms to 5 min | the guarded work itself, whatever it is |
///
/// With `metrics-exporter-prometheus` (see `docs/operations.md` for the whole setup):
///
/// ```text
/// let mut builder = PrometheusBuilder::new();
/// for (name, bounds) in idem::PROMETHEUS_BUCKETS {
///     builder = builder.set_buckets_for_metric(Matcher::Full(name.to_string()), bounds)?;
/// }
/// let handle = builder.install_recorder()?;
/// ```
///
/// ```
/// let names: Vec<&str> = idem::PROMETHEUS_BUCKETS.iter().map(|(name, _)| *name).collect();
/// assert_eq!(names, ["idem_claim_seconds", "idem_work_seconds", "idem_complete_seconds"]);
/// assert!(idem::PROMETHEUS_BUCKETS
///     .iter()
///     .all(|(_, bounds)| bounds.windows(2).all(|w| w[0] < w[1])));
/// ```
pub const PROMETHEUS_BUCKETS: &[(&str, &[f64])] = &[
    ("idem_claim_seconds", ROUND_TRIPS),
    ("idem_work_seconds", WORK),
    ("idem_complete_seconds", ROUND_TRIPS),
];

/// A store round trip, or a wait for another caller's work: 100 µs to 10 s.
const ROUND_TRIPS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The guarded work: 1 ms to 5 minutes.
const WORK: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];
