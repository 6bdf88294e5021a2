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

    let per_call = |d: Duration| d / u32::try_from(calls.max(1)).unwrap_or(u32::MAX);
    Ok(MemoryReport {
        calls,
        store_claim_complete: per_call(store_claim_complete),
        engine_fresh: per_call(engine_fresh),
        engine_replay: per_call(engine_replay),
    })
}
