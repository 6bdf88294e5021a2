//! `--encryption`: what sealing costs a replay. The engine replays a completed key over a
//! memory store and over the same store wrapped in an `EncryptedStore`, at 1 KB and 1 MiB
//! results; the two take turns every slice, and the report is the median over slices of the
//! encrypted ÷ plain time per replay, with each one's mean.

use std::time::{Duration, Instant};

use idem::{EncryptedStore, EncryptionKey, Error, Idempotency, Key, KeyRing, MemoryStore};

use crate::BenchError;

/// One size's figures.
pub struct Row {
    pub bytes: usize,
    pub plain: Duration,
    pub encrypted: Duration,
    /// The median over slices of encrypted ÷ plain.
    pub ratio: f64,
}

/// Replays of `key` through `engine`, `n` of them: the time they took.
async fn replays(engine: &Idempotency, key: Key, n: u32) -> Result<Duration, BenchError> {
    let started = Instant::now();
    for _ in 0..n {
        let replayed = engine
            .call(key)
            .run(async { Ok::<_, Error>(String::new()) })
            .await?;
        std::hint::black_box(replayed.into_inner());
    }
    Ok(started.elapsed())
}

/// The rows at 1 KB and 1 MiB; `quick` measures fewer slices.
pub async fn run(quick: bool) -> Result<Vec<Row>, BenchError> {
    let keys = KeyRing::new("bench", EncryptionKey::from_bytes([7; 32]))?;
    // 1 MiB of text is 2 bytes more in JSON than the default limit.
    let plain = Idempotency::builder(MemoryStore::new())
        .max_response_bytes(2 << 20)
        .build()?;
    let sealed = Idempotency::builder(EncryptedStore::new(MemoryStore::new(), keys))
        .max_response_bytes(2 << 20)
        .build()?;
    let mut rows = Vec::new();
    for (bytes, per_slice) in [(1_000usize, 2_000u32), (1 << 20, 20)] {
        let key = Key::derive("bench", "", &format!("replay-{bytes}")).map_err(Error::from)?;
        let value = "x".repeat(bytes);
        for engine in [&plain, &sealed] {
            let v = value.clone();
            engine
                .call(key)
                .run(async move { Ok::<_, Error>(v) })
                .await?;
        }
        let slices = if quick { 5 } else { 21 };
        let (mut p, mut e, mut ratios) = (Duration::ZERO, Duration::ZERO, Vec::new());
        for slice in 0..slices {
            let (a, b) = if slice % 2 == 0 {
                let a = replays(&plain, key, per_slice).await?;
                (a, replays(&sealed, key, per_slice).await?)
            } else {
                let b = replays(&sealed, key, per_slice).await?;
                (replays(&plain, key, per_slice).await?, b)
            };
            p += a;
            e += b;
            ratios.push(b.as_secs_f64() / a.as_secs_f64());
        }
        ratios.sort_by(f64::total_cmp);
        let n = per_slice * slices;
        rows.push(Row {
            bytes,
            plain: p / n,
            encrypted: e / n,
            ratio: ratios[ratios.len() / 2],
        });
    }
    Ok(rows)
}
