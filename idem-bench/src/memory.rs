//! Nanoseconds per call of the memory store's paths, from one task in a tight loop (no boxing,
//! no per-call clock reads).

use std::time::Duration;

use idem::{Completion, Error, Idempotency, Key, MemoryStore, Start, Store};
use tokio::time::Instant;

use crate::workload::{random_key, work, LEASE, RETENTION};
use crate::BenchError;

/// Mean time per call of each memory path.
pub struct MemoryReport {
    pub calls: u64,
    /// `Store::start` + `Store::complete` on a new key.
    pub store_claim_complete: Duration,
    /// `Idempotency::run` on a new key: claim, trivial work, JSON encode, complete.
    pub engine_fresh: Duration,
    /// `Idempotency::run` on a completed key: the claim attempt returns it, JSON decode.
    pub engine_replay: Duration,
    /// The engine's full path (new key, then its replay) on a current-thread runtime, with
    /// nothing installed: in the round with the median ratio.
    pub plain_full: Duration,
    /// The same with a Prometheus recorder and a JSON tracing subscriber (INFO) installed and
    /// every call scoped: in the round with the median ratio.
    pub observed_full: Duration,
}

/// Rounds of the plain/observed comparison, alternating.
const ROUNDS: usize = 9;

/// Mean time of one new-key call plus its replay, on a fresh engine and a current-thread
/// runtime, with or without a recorder and a subscriber.
fn full_path(keys: &[Key], observed: bool) -> Result<Duration, BenchError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let body = || {
        runtime.block_on(async {
            let engine = Idempotency::new(MemoryStore::new());
            let t = Instant::now();
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
            Ok::<_, BenchError>(t.elapsed() / u32::try_from(keys.len().max(1)).unwrap_or(u32::MAX))
        })
    };
    if !observed {
        return body();
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(subscriber, || metrics::with_local_recorder(&recorder, body))
}

pub async fn run(calls: u64) -> Result<MemoryReport, BenchError> {
    let store = MemoryStore::new();
    let response = serde_json::to_vec(&work(7))?;
    let keys: Vec<Key> = (0..calls).map(|_| Key::from_bytes(random_key())).collect();
    let t = Instant::now();
    for key in &keys {
        let Start::Started(claim) = store.start(key, None, LEASE).await? else {
            return Err(BenchError::Unexpected("a new key was not claimable".into()));
        };
        let done = Completion {
            response: Some(&response),
            is_error: false,
        };
        store.complete(&claim, done, RETENTION).await?;
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

    let sample: Vec<Key> = keys.iter().take(100_000).copied().collect();
    let (plain_full, observed_full) = tokio::task::spawn_blocking(move || {
        // Each round measures both back to back, in alternating order; the round with the
        // median ratio is reported, so one disturbed round moves neither figure.
        let mut rounds = Vec::with_capacity(ROUNDS);
        for round in 0..ROUNDS {
            let (plain, observed) = if round % 2 == 0 {
                let plain = full_path(&sample, false)?;
                (plain, full_path(&sample, true)?)
            } else {
                let observed = full_path(&sample, true)?;
                (full_path(&sample, false)?, observed)
            };
            rounds.push((plain, observed));
        }
        let ratio = |(p, o): &(Duration, Duration)| o.as_secs_f64() / p.as_secs_f64().max(1e-12);
        rounds.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
        Ok::<_, BenchError>(rounds[ROUNDS / 2])
    })
    .await
    .map_err(|e| BenchError::Unexpected(format!("the comparison task failed: {e}")))??;

    let per_call = |d: Duration| d / u32::try_from(calls.max(1)).unwrap_or(u32::MAX);
    Ok(MemoryReport {
        calls,
        store_claim_complete: per_call(store_claim_complete),
        engine_fresh: per_call(engine_fresh),
        engine_replay: per_call(engine_replay),
        plain_full,
        observed_full,
    })
}
