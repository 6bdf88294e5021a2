//! Runs one operation from many tasks for a while and records the latency of every call.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cpu::Cpu;
use crate::BenchError;

/// What one call did; the storm counts them, the other workloads check them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hit {
    /// The work ran (a new claim, or a raw insert that took the key).
    Fresh,
    /// A stored result came back.
    Replayed,
    /// Another call held the key.
    Locked,
}

impl Hit {
    /// What a call with a new key did, given whether a layer marked it replayed (`None`: a bare
    /// service, which marks nothing).
    pub(crate) fn fresh(replayed: Option<bool>) -> Result<Hit, BenchError> {
        match replayed {
            Some(true) => Err(BenchError::Unexpected("a new key replayed".into())),
            _ => Ok(Hit::Fresh),
        }
    }

    /// What a call with a completed key did, given whether a layer marked it replayed (`None`:
    /// a bare service, whose "replay" runs `work` again); a layer that ran it again is wrong.
    pub(crate) fn replay(replayed: Option<bool>, work: &str) -> Result<Hit, BenchError> {
        match replayed {
            None => Ok(Hit::Fresh),
            Some(true) => Ok(Hit::Replayed),
            Some(false) => Err(BenchError::Unexpected(format!(
                "a completed key ran the {work} again"
            ))),
        }
    }
}

/// Counts of [`Hit`]s.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hits {
    pub fresh: u64,
    pub replayed: u64,
    pub locked: u64,
}

impl Hits {
    fn count(&mut self, hit: Hit) {
        match hit {
            Hit::Fresh => self.fresh += 1,
            Hit::Replayed => self.replayed += 1,
            Hit::Locked => self.locked += 1,
        }
    }

    fn add(&mut self, other: Hits) {
        self.fresh += other.fresh;
        self.replayed += other.replayed;
        self.locked += other.locked;
    }
}

pub type OpFuture = Pin<Box<dyn Future<Output = Result<Hit, BenchError>> + Send>>;

/// One benchmarked call. Every variant pays the same boxing, so it cancels out in the ratios.
pub type Op = Arc<dyn Fn() -> OpFuture + Send + Sync>;

/// Runs `send(i)` for every `i` below `n` from 8 tasks (task `w` takes `w`, `w + 8`, …): how
/// the peers' and gRPC rows complete their keys ahead of a replay run.
pub async fn from_8_tasks<F, Fut>(n: usize, send: F) -> Result<(), BenchError>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), BenchError>> + Send + 'static,
{
    const WORKERS: usize = 8;
    let mut tasks = JoinSet::new();
    for w in 0..WORKERS {
        let send = send.clone();
        tasks.spawn(async move {
            for i in (w..n).step_by(WORKERS) {
                send(i).await?;
            }
            Ok::<_, BenchError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// Wraps an async closure as an [`Op`].
pub fn op<F, Fut>(f: F) -> Op
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Hit, BenchError>> + Send + 'static,
{
    Arc::new(move || Box::pin(f()))
}

/// An [`Op`] that repeats one of `n` calls completed ahead: `send(i)`, with `i` picked at random
/// below `n` each time.
pub fn replay_op<F, Fut>(n: usize, send: F) -> Op
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Hit, BenchError>> + Send + 'static,
{
    op(move || send(fastrand::usize(..n)))
}

/// Calls and latencies gathered over one or more timed slices.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    ops: u64,
    wall: Duration,
    latencies_ns: Vec<u64>,
    sorted: bool,
    client_cpu: Option<Duration>,
    server_cpu: Option<Duration>,
    pub hits: Hits,
}

impl Sample {
    /// Adds another slice of the same variant.
    pub fn merge(&mut self, other: Sample) {
        self.ops += other.ops;
        self.wall += other.wall;
        self.latencies_ns.extend(other.latencies_ns);
        self.sorted = false;
        self.hits.add(other.hits);
        let add = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (None, b) => b,
            (a, None) => a,
            (Some(a), Some(b)) => Some(a + b),
        };
        self.client_cpu = add(self.client_cpu, other.client_cpu);
        self.server_cpu = add(self.server_cpu, other.server_cpu);
    }

    /// CPU time per call of this process (`client`) and of the PostgreSQL cluster (`server`).
    pub fn cpu_per_call(&self) -> (Option<Duration>, Option<Duration>) {
        let per = |d: Option<Duration>| {
            let n = u32::try_from(self.ops).ok().filter(|n| *n > 0)?;
            Some(d? / n)
        };
        (per(self.client_cpu), per(self.server_cpu))
    }

    /// Completed calls per second of wall time.
    pub fn ops_per_sec(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.ops as f64 / secs
        } else {
            0.0
        }
    }

    /// The `p`-th percentile latency (nearest rank), `p` in 0..=100.
    pub fn percentile(&mut self, p: f64) -> Duration {
        if !self.sorted {
            self.latencies_ns.sort_unstable();
            self.sorted = true;
        }
        let n = self.latencies_ns.len();
        if n == 0 {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        Duration::from_nanos(self.latencies_ns[rank.clamp(1, n) - 1])
    }
}

/// Runs `op` from `concurrency` tasks until `duration` has passed; each task finishes its call
/// in flight, and the wall time runs until the last one did.
pub async fn run(
    op: &Op,
    concurrency: usize,
    duration: Duration,
    cpu: Cpu,
) -> Result<Sample, BenchError> {
    run_until(
        op,
        concurrency,
        duration,
        cpu,
        &Arc::new(AtomicBool::new(false)),
    )
    .await
}

/// [`run`], ending early once `stop` is set.
pub async fn run_until(
    op: &Op,
    concurrency: usize,
    duration: Duration,
    cpu: Cpu,
    stop: &Arc<AtomicBool>,
) -> Result<Sample, BenchError> {
    let before = cpu.read();
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = JoinSet::new();
    for _ in 0..concurrency {
        let (op, stop) = (op.clone(), stop.clone());
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(1024);
            let mut hits = Hits::default();
            while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let hit = op().await?;
                latencies.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
                hits.count(hit);
            }
            Ok::<_, BenchError>((latencies, hits))
        });
    }
    let mut sample = Sample::default();
    while let Some(joined) = tasks.join_next().await {
        let (latencies, hits) = joined??;
        sample.ops += latencies.len() as u64;
        sample.latencies_ns.extend(latencies);
        sample.hits.add(hits);
    }
    sample.wall = start.elapsed();
    (sample.client_cpu, sample.server_cpu) = before.until(&cpu.read());
    Ok(sample)
}

/// Runs `variants` in interleaved slices (a, b, c, a, b, c, …) after one warm-up slice each, so
/// that load from outside the benchmark falls on all of them alike.
pub async fn interleaved(
    variants: &[&Op],
    concurrency: usize,
    timing: Timing,
    cpu: Cpu,
) -> Result<Vec<Sample>, BenchError> {
    for op in variants {
        run(op, concurrency, timing.warmup, cpu).await?;
    }
    let mut samples = vec![Sample::default(); variants.len()];
    for _ in 0..timing.rounds {
        for (op, sample) in variants.iter().zip(&mut samples) {
            sample.merge(run(op, concurrency, timing.slice, cpu).await?);
        }
    }
    Ok(samples)
}

/// How long each variant runs.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub slice: Duration,
    pub rounds: u32,
}
