//! Nanoseconds per call of the memory store's paths, from one task in a tight loop (no boxing,
//! no per-call clock reads).

use std::sync::Arc;
use std::time::Duration;

use idem::{
    ClaimOutcome, ClaimRequest, Completion, Error, Idempotency, Key, MemoryStore, Store,
    DEFAULT_LATENCIES_ONE_IN,
};
use tokio::time::Instant;

use crate::workload::{deposit, random_key, work, RequestId, LEASE, RETENTION};
use crate::BenchError;

/// Mean time per call of each memory path.
pub struct MemoryReport {
    pub calls: u64,
    /// `Store::claim` + `Store::complete` on a new key.
    pub store_claim_complete: Duration,
    /// `Idempotency::run` on a new key: claim, trivial work, JSON encode, complete.
    pub engine_fresh: Duration,
    /// `Idempotency::run` on a completed key: the claim attempt returns it, JSON decode.
    pub engine_replay: Duration,
    /// A function with `#[idempotent]` on a new client key (a 32-character request id): key
    /// derivation (SHA-256) inside, then what `engine_fresh` does.
    pub attribute_fresh: Duration,
    /// What the attribute expands to, written by hand: `Key::derive` of the same request id,
    /// then `Idempotency::run` with the same scope.
    pub derived_fresh: Duration,
    /// The median over turns of 10,000 calls of the by-hand time ÷ the attribute's time (1.0:
    /// the same speed; below 1: the attribute is slower).
    pub attribute_speed: f64,
    /// The engine's full path (new key, then its replay) with and without metrics and tracing,
    /// at the default latency sampling.
    pub observed: Observed,
    /// The same with every call's latencies recorded (`sample_latencies(1)`).
    pub observed_every: Observed,
}

/// Keys per slice of the plain/observed comparison: the two engines take turns every slice.
const SLICE: usize = 1_000;

/// One new-key call plus its replay, for each of `keys`, through `engine`.
async fn full_path(engine: &Idempotency, keys: &[Key]) -> Result<(), BenchError> {
    for (i, key) in keys.iter().enumerate() {
        let seed = i as u64;
        for _ in 0..2 {
            engine
                .call(*key)
                .scope("bench")
                .run(async move { Ok::<_, Error>(work(seed)) })
                .await?;
        }
    }
    Ok(())
}

/// The engine's full path (a new key, then its replay) with nothing installed and with a
/// Prometheus recorder and a JSON tracing subscriber (INFO) installed, one call in `one_in`
/// recording its latencies: mean time per key of each, and the median over slices of the
/// observed ÷ plain time. Two engines over two memory stores on one current-thread runtime take
/// turns every [`SLICE`] keys, in alternating order, so a machine whose speed drifts over
/// seconds weighs on both alike.
fn compare_observed(keys: &[Key], one_in: u32) -> Result<Observed, BenchError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (recorder, tracing) = observers();
    let engine = || {
        Idempotency::builder(MemoryStore::new())
            .sample_latencies(one_in)
            .build()
    };
    let (plain, observed) = (engine()?, engine()?);
    let timed = |engine: &Idempotency, slice: &[Key], on: bool| {
        // The engine registers its metric handles with the recorder installed at its first call
        // of a scope, so the observed engine only ever runs with the recorder in place.
        let _recorder = on.then(|| metrics::set_default_local_recorder(&recorder));
        let _tracing = on.then(|| tracing::dispatcher::set_default(&tracing));
        let t = Instant::now();
        runtime.block_on(full_path(engine, slice))?;
        Ok::<_, BenchError>(t.elapsed())
    };
    let (mut off, mut on, mut ratios) = (Duration::ZERO, Duration::ZERO, Vec::new());
    for (i, slice) in keys.chunks(SLICE).enumerate() {
        let (p, o) = if i % 2 == 0 {
            let p = timed(&plain, slice, false)?;
            (p, timed(&observed, slice, true)?)
        } else {
            let o = timed(&observed, slice, true)?;
            (timed(&plain, slice, false)?, o)
        };
        off += p;
        on += o;
        ratios.push(o.as_secs_f64() / p.as_secs_f64().max(1e-12));
    }
    ratios.sort_by(f64::total_cmp);
    let per_key = |d: Duration| d / u32::try_from(keys.len().max(1)).unwrap_or(u32::MAX);
    Ok(Observed {
        off: per_key(off),
        on: per_key(on),
        ratio: ratios.get(ratios.len() / 2).copied().unwrap_or(1.0),
    })
}

/// What an observed engine runs with: a Prometheus recorder and a JSON tracing subscriber at
/// INFO writing nowhere.
pub(crate) fn observers() -> (
    metrics_exporter_prometheus::PrometheusRecorder,
    tracing::Dispatch,
) {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let tracing = tracing::Dispatch::new(
        tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::INFO)
            .with_writer(std::io::sink)
            .finish(),
    );
    (recorder, tracing)
}

/// The plain/observed comparison at one sampling.
#[derive(Debug, Clone, Copy)]
pub struct Observed {
    /// Mean time per key (new key + replay) with nothing installed.
    pub off: Duration,
    /// The same with the recorder and the subscriber.
    pub on: Duration,
    /// The median over slices of on ÷ off.
    pub ratio: f64,
}

pub async fn run(calls: u64) -> Result<MemoryReport, BenchError> {
    let store = MemoryStore::new();
    let response = serde_json::to_vec(&work(7))?;
    let keys: Vec<Key> = (0..calls).map(|_| Key::from_bytes(random_key())).collect();
    let t = Instant::now();
    for key in &keys {
        let ClaimOutcome::Claimed(claim) = store.claim(ClaimRequest::new(key, LEASE)).await? else {
            return Err(BenchError::Unexpected("a new key was not claimable".into()));
        };
        let done = Completion {
            response: Some(&response),
            is_error: false,
            retention: RETENTION,
            key_retention: Duration::ZERO,
        };
        store.complete(&claim, done).await?;
    }
    let store_claim_complete = t.elapsed();

    let engine = Idempotency::new(MemoryStore::new());
    let t = Instant::now();
    for (i, key) in keys.iter().enumerate() {
        let seed = i as u64;
        engine
            .call(*key)
            .run(async move { Ok::<_, Error>(work(seed)) })
            .await?;
    }
    let engine_fresh = t.elapsed();

    let t = Instant::now();
    for key in &keys {
        let out = engine
            .call(*key)
            .run(async { Ok::<_, Error>(work(0)) })
            .await?;
        if !out.is_replayed() {
            return Err(BenchError::Unexpected("a completed key ran again".into()));
        }
    }
    let engine_replay = t.elapsed();

    // The attribute against the same calls by hand, on request ids made ahead, in turns of
    // 10,000 calls so a drifting machine weighs on both alike.
    let ids: Vec<RequestId> = (0..calls).map(|_| RequestId::random()).collect();
    let (by_attribute, by_hand) = (
        Idempotency::new(MemoryStore::new()),
        Idempotency::new(MemoryStore::new()),
    );
    let (mut attribute_fresh, mut derived_fresh) = (Duration::ZERO, Duration::ZERO);
    let mut speeds = Vec::new();
    for (turn, slice) in ids.chunks(10_000).enumerate() {
        let attribute = async {
            let t = Instant::now();
            for (i, id) in slice.iter().enumerate() {
                deposit(&by_attribute, id.as_str(), i as u64).await?;
            }
            Ok::<_, BenchError>(t.elapsed())
        };
        let hand = async {
            let t = Instant::now();
            for (i, id) in slice.iter().enumerate() {
                let seed = i as u64;
                by_hand
                    .call(Key::derive("bench_deposit", "", id.as_str()).map_err(Error::from)?)
                    .scope("bench_deposit")
                    .run(async move { Ok::<_, BenchError>(work(seed)) })
                    .await?;
            }
            Ok::<_, BenchError>(t.elapsed())
        };
        let (a, h) = if turn % 2 == 0 {
            let a = attribute.await?;
            (a, hand.await?)
        } else {
            let h = hand.await?;
            (attribute.await?, h)
        };
        attribute_fresh += a;
        derived_fresh += h;
        speeds.push(h.as_secs_f64() / a.as_secs_f64().max(1e-12));
    }

    let sample: Arc<Vec<Key>> = Arc::new(keys.iter().take(100_000).copied().collect());
    let compare = |one_in: u32| {
        let sample = sample.clone();
        tokio::task::spawn_blocking(move || compare_observed(&sample, one_in))
    };
    let failed = |e: tokio::task::JoinError| {
        BenchError::Unexpected(format!("the comparison task failed: {e}"))
    };
    let observed = compare(DEFAULT_LATENCIES_ONE_IN).await.map_err(failed)??;
    let observed_every = compare(1).await.map_err(failed)??;

    let per_call = |d: Duration| d / u32::try_from(calls.max(1)).unwrap_or(u32::MAX);
    Ok(MemoryReport {
        calls,
        store_claim_complete: per_call(store_claim_complete),
        engine_fresh: per_call(engine_fresh),
        engine_replay: per_call(engine_replay),
        attribute_fresh: per_call(attribute_fresh),
        derived_fresh: per_call(derived_fresh),
        attribute_speed: {
            speeds.sort_by(f64::total_cmp);
            speeds.get(speeds.len() / 2).copied().unwrap_or(1.0)
        },
        observed,
        observed_every,
    })
}
