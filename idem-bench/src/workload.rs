//! The benchmarked calls: fresh operations, replays and a storm, through the engine, through
//! `#[idempotent]` and as raw statements.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Error, Idempotency, Key, ReplayCache};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::cpu::Cpu;
use crate::harness::{op, Hit, Op};
use crate::raw::Raw;
use crate::BenchError;

/// The engine's default lease and retention, which the raw baseline uses too.
pub const LEASE: Duration = Duration::from_secs(30);
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How many consecutive storm calls share one key.
pub const STORM_HITS_PER_KEY: u64 = 16;

/// The result of the trivial work: about 30 bytes of JSON.
#[derive(Debug, Serialize, Deserialize)]
pub struct Receipt {
    pub account: u64,
    pub cents: u64,
}

/// The trivial work every variant does.
pub fn work(seed: u64) -> Receipt {
    Receipt {
        account: seed % 1000,
        cents: std::hint::black_box(seed),
    }
}

pub fn random_key() -> [u8; 32] {
    std::array::from_fn(|_| fastrand::u8(..))
}

/// Lower-case hex of `bytes`, in one allocation.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// A client's request id: 16 random bytes in lower-case hex, on the stack. The client side of an
/// attribute call makes one per call, and the engine rows it is compared with allocate nothing
/// for their keys, so neither does this.
pub(crate) struct RequestId([u8; 32]);

impl RequestId {
    pub(crate) fn random() -> RequestId {
        let mut out = [0u8; 32];
        for (pair, b) in out
            .chunks_exact_mut(2)
            .zip(fastrand::u128(..).to_le_bytes())
        {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
        RequestId(out)
    }

    pub(crate) fn as_str(&self) -> &str {
        // Hex digits are ASCII, so this never fails.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// A store under test: its engine, the raw baseline on the same pool (none for memory), and
/// keys completed ahead of time for the replay runs.
pub struct Subject {
    pub name: &'static str,
    /// Where this store's CPU time is read.
    pub cpu: Cpu,
    pub engine: Idempotency,
    pub raw: Option<Raw>,
    /// Where the steps rows write (none: no steps rows for this store).
    pub effects: Option<crate::steps::Effects>,
    replay_keys: Arc<Vec<[u8; 32]>>,
}

impl Subject {
    pub fn new(name: &'static str, cpu: Cpu, engine: Idempotency, raw: Option<Raw>) -> Subject {
        Subject {
            name,
            cpu,
            engine,
            raw,
            effects: None,
            replay_keys: Arc::new(Vec::new()),
        }
    }

    /// Completes `n` keys through the engine and the same keys through the raw statements, so
    /// both tables hold `n` results to replay.
    pub async fn seed_replays(&mut self, n: usize) -> Result<(), BenchError> {
        let keys: Arc<Vec<[u8; 32]>> = Arc::new((0..n).map(|_| random_key()).collect());
        let workers = 8;
        let mut tasks = JoinSet::new();
        for w in 0..workers {
            let (keys, engine, raw) = (keys.clone(), self.engine.clone(), self.raw.clone());
            tasks.spawn(async move {
                for (i, key) in keys.iter().enumerate().skip(w).step_by(workers) {
                    let seed = i as u64;
                    engine
                        .call(Key::from_bytes(*key))
                        .run(async move { Ok::<_, Error>(work(seed)) })
                        .await?;
                    if let Some(raw) = &raw {
                        raw.fresh(key, seed).await?;
                    }
                }
                Ok::<_, BenchError>(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        self.replay_keys = keys;
        Ok(())
    }

    /// Claim, trivial work, complete through `Idempotency::run` on a new random key.
    pub fn fresh_engine(&self) -> Op {
        let engine = self.engine.clone();
        op(move || {
            let engine = engine.clone();
            async move {
                let seed = fastrand::u64(..);
                let key = Key::from_bytes(random_key());
                let out = engine
                    .call(key)
                    .run(async move { Ok::<_, Error>(work(seed)) })
                    .await?;
                expect_fresh(out.is_replayed())
            }
        })
    }

    /// The same through a function annotated with `#[idempotent]`, on a new random client key.
    pub fn fresh_attribute(&self) -> Op {
        let engine = self.engine.clone();
        op(move || {
            let engine = engine.clone();
            async move {
                let request_id = RequestId::random();
                deposit(&engine, request_id.as_str(), fastrand::u64(..)).await?;
                Ok(Hit::Fresh)
            }
        })
    }

    /// A replay of a completed key through `Idempotency::run`.
    pub fn replay_engine(&self) -> Op {
        let (engine, keys) = (self.engine.clone(), self.replay_keys.clone());
        op(move || {
            let (engine, keys) = (engine.clone(), keys.clone());
            async move {
                let key = Key::from_bytes(keys[fastrand::usize(..keys.len())]);
                let out = engine
                    .call(key)
                    .run(async {
                        Err::<Receipt, _>(BenchError::Unexpected("a replay ran its work".into()))
                    })
                    .await?;
                if out.is_replayed() {
                    Ok(Hit::Replayed)
                } else {
                    Err(BenchError::Unexpected("a replay ran its work".into()))
                }
            }
        })
    }

    /// [`replay_engine`](Self::replay_engine) through an engine with the replay cache on (over
    /// the same store), every replay key already in the cache: a hot key's replay, no round trip.
    /// The first call replays each key once to fill the cache (the other tasks wait for it), so
    /// that pass falls in the variant's warm-up, not in its timed slices: left to fill as it went,
    /// the 10,000 keys drawn at random took seconds to be seen once on a store answering a few
    /// thousand reads a second, and the slices timed store reads as much as the cache.
    pub fn replay_cached(&self) -> Op {
        let engine = Idempotency::builder(self.engine.store().clone())
            .replay_cache(ReplayCache::new(1 << 20, 1 << 30))
            .build()
            .map(|engine| Subject::new(self.name, Cpu::default(), engine, None));
        match engine {
            Ok(mut cached) => {
                cached.replay_keys = self.replay_keys.clone();
                let replay = cached.replay_engine();
                let filled = Arc::new(tokio::sync::OnceCell::new());
                let (engine, keys) = (cached.engine, self.replay_keys.clone());
                op(move || {
                    let (replay, filled) = (replay.clone(), filled.clone());
                    let (engine, keys) = (engine.clone(), keys.clone());
                    async move {
                        filled.get_or_try_init(|| fill(&engine, &keys)).await?;
                        replay().await
                    }
                })
            }
            Err(e) => {
                let e = e.to_string();
                op(move || {
                    let e = e.clone();
                    async move { Err(BenchError::Unexpected(e)) }
                })
            }
        }
    }

    /// Many tasks on few keys: consecutive calls share a key, so concurrent calls meet on it;
    /// a held key fails fast (the default policy).
    pub fn storm_engine(&self) -> Op {
        let engine = self.engine.clone();
        let next = storm_keys();
        op(move || {
            let (engine, next) = (engine.clone(), next.clone());
            async move {
                let (key, seed) = next();
                match engine
                    .call(Key::from_bytes(key))
                    .run(async move { Ok::<_, Error>(work(seed)) })
                    .await
                {
                    Ok(out) if out.is_replayed() => Ok(Hit::Replayed),
                    Ok(_) => Ok(Hit::Fresh),
                    Err(Error::Locked { .. }) => Ok(Hit::Locked),
                    Err(e) => Err(e.into()),
                }
            }
        })
    }

    pub fn fresh_raw(&self) -> Option<Op> {
        let raw = self.raw.clone()?;
        Some(op(move || {
            let raw = raw.clone();
            async move { raw.fresh(&random_key(), fastrand::u64(..)).await }
        }))
    }

    pub fn replay_raw(&self) -> Option<Op> {
        let (raw, keys) = (self.raw.clone()?, self.replay_keys.clone());
        Some(op(move || {
            let (raw, keys) = (raw.clone(), keys.clone());
            async move { raw.replay(&keys[fastrand::usize(..keys.len())]).await }
        }))
    }

    pub fn storm_raw(&self) -> Option<Op> {
        let raw = self.raw.clone()?;
        let next = storm_keys();
        Some(op(move || {
            let (raw, next) = (raw.clone(), next.clone());
            async move {
                let (key, seed) = next();
                raw.storm(&key, seed).await
            }
        }))
    }
}

/// Hands out storm keys: every [`STORM_HITS_PER_KEY`] calls the next random key.
fn storm_keys() -> Arc<dyn Fn() -> ([u8; 32], u64) + Send + Sync> {
    let base = fastrand::u64(..);
    let counter = AtomicU64::new(0);
    Arc::new(move || {
        let i = counter.fetch_add(1, Ordering::Relaxed);
        let mut rng = fastrand::Rng::with_seed(base ^ (i / STORM_HITS_PER_KEY));
        (std::array::from_fn(|_| rng.u8(..)), i)
    })
}

fn expect_fresh(replayed: bool) -> Result<Hit, BenchError> {
    if replayed {
        Err(BenchError::Unexpected("a new random key replayed".into()))
    } else {
        Ok(Hit::Fresh)
    }
}

/// The attribute under test: a deposit keyed by the client's request id. No fingerprint, as in
/// the engine variants it is compared with (by default `cents` would be hashed).
#[idempotent(key = request_id, scope = "bench_deposit", engine = engine, fingerprint = ())]
pub(crate) async fn deposit(
    engine: &Idempotency,
    request_id: &str,
    cents: u64,
) -> Result<Receipt, BenchError> {
    Ok(work(cents))
}

/// Replays each of `keys` once through `engine`, filling its replay cache.
async fn fill(engine: &Idempotency, keys: &[[u8; 32]]) -> Result<(), BenchError> {
    for key in keys {
        let out = engine
            .call(Key::from_bytes(*key))
            .run(async {
                Err::<Receipt, _>(BenchError::Unexpected("a replay ran its work".into()))
            })
            .await?;
        if !out.is_replayed() {
            return Err(BenchError::Unexpected("a replay ran its work".into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_lower_case_two_digits_a_byte() {
        assert_eq!(super::hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(super::hex(&[]), "");
    }

    #[test]
    fn request_ids_are_32_hex_digits() {
        let (a, b) = (super::RequestId::random(), super::RequestId::random());
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.as_str(), b.as_str());
    }
}
