//! The consumer rows (issue 29): messages per second through the batch API
//! (`idem::consumer::Consumer`) against the same work with the conditional writes a consumer
//! author would write by hand (`Raw::storm`: insert the claim, on a new key run and update, else
//! read what is there), on the same store, with the same batches: 10 messages, all run at once,
//! 30 % of them a key seen before (a redelivery). Rounds alternate between the two, so a
//! loaded machine slows both alike.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use idem::consumer::{Consumer, Message};
use idem::Idempotency;

use crate::raw::Raw;
use crate::workload::{hex, random_key, work, Receipt};
use crate::BenchError;

const BATCH: usize = 10;

/// One run's figures: messages per second each way, and their ratio (idem / by hand).
pub struct ConsumerRow {
    pub store: &'static str,
    pub idem_per_sec: f64,
    pub raw_per_sec: f64,
}

impl ConsumerRow {
    pub fn ratio(&self) -> f64 {
        self.idem_per_sec / self.raw_per_sec
    }
}

/// `rounds` rounds of `messages` messages each way, alternating.
pub async fn run(
    store: &'static str,
    engine: Idempotency,
    raw: &Raw,
    messages: usize,
    rounds: usize,
) -> Result<ConsumerRow, BenchError> {
    let consumer = Consumer::new(engine, "bench-consumer")?.concurrency(BATCH);
    let (mut idem_time, mut raw_time) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        let keys = deliveries(messages);
        let started = Instant::now();
        for batch in keys.chunks(BATCH) {
            let batch = batch
                .iter()
                .map(|(key, seed)| Message::keyed(*seed, hex(key)))
                .collect();
            let outcomes = consumer
                .process(batch, |seed: u64| async move {
                    Ok::<Receipt, Infallible>(work(seed))
                })
                .await;
            if let Some(bad) = outcomes.iter().find(|o| o.value().is_none())
                && bad.as_str() != "in_flight"
            {
                return Err(BenchError::Unexpected(format!(
                    "a benchmark message ended {}",
                    bad.as_str()
                )));
            }
        }
        idem_time += started.elapsed();

        let keys = deliveries(messages);
        let started = Instant::now();
        for batch in keys.chunks(BATCH) {
            for hit in join_all(batch.iter().map(|(key, seed)| raw.storm(key, *seed))).await {
                hit?;
            }
        }
        raw_time += started.elapsed();
    }
    let total = (messages * rounds) as f64;
    Ok(ConsumerRow {
        store,
        idem_per_sec: total / idem_time.as_secs_f64(),
        raw_per_sec: total / raw_time.as_secs_f64(),
    })
}

/// `n` deliveries: new keys, 30 % of them followed later by a redelivery of an earlier key.
fn deliveries(n: usize) -> Vec<([u8; 32], u64)> {
    let mut out: Vec<([u8; 32], u64)> = Vec::with_capacity(n);
    while out.len() < n {
        if !out.is_empty() && fastrand::u8(..100) < 30 {
            let earlier = out[fastrand::usize(..out.len())];
            out.push(earlier);
        } else {
            out.push((random_key(), fastrand::u64(..)));
        }
    }
    out
}

/// The run loop's row (`--consumer`): [`Consumer::run`] over an in-process queue that hands out
/// at most 10 messages a receive (as SQS does), a consumer of concurrency 16, and handlers that
/// wait 2 ms, one in ten 40 ms (a slow call). Each round drains `messages` messages twice:
/// with the loop overlapping its batches (the default) and with one batch at a time (ordered
/// mode, whose lanes are the same here: every message is its own group, and none fails), in
/// turns. The figure is what a batch's slowest message costs the ones after it.
pub async fn run_loop(messages: usize, rounds: usize) -> Result<LoopRow, BenchError> {
    let engine = Idempotency::new(idem::MemoryStore::new());
    let consumer = Consumer::new(engine, "bench-loop")?.concurrency(16);
    let (mut overlapping, mut one_at_a_time) = (Duration::ZERO, Duration::ZERO);
    for round in 0..rounds {
        for ordered in [round % 2 == 1, round % 2 == 0] {
            // Keys of this run's own: the engine would replay another run's.
            let queue = InProcess::new(messages, format!("r{round}-{ordered}"));
            let consumer = consumer.clone().ordered(ordered);
            let started = Instant::now();
            let handler = |slow: bool| async move {
                let wait = if slow { 40 } else { 2 };
                tokio::time::sleep(Duration::from_millis(wait)).await;
                Ok::<_, Infallible>(())
            };
            consumer.run(&queue, handler, queue.drained()).await;
            let took = started.elapsed();
            if queue.acknowledged() != messages {
                return Err(BenchError::Unexpected(format!(
                    "the loop acknowledged {} of {messages} messages",
                    queue.acknowledged()
                )));
            }
            if ordered {
                one_at_a_time += took;
            } else {
                overlapping += took;
            }
        }
    }
    let total = (messages * rounds) as f64;
    Ok(LoopRow {
        overlapping_per_sec: total / overlapping.as_secs_f64(),
        one_at_a_time_per_sec: total / one_at_a_time.as_secs_f64(),
    })
}

/// The run loop's figures: messages per second with overlapping batches and one at a time.
pub struct LoopRow {
    pub overlapping_per_sec: f64,
    pub one_at_a_time_per_sec: f64,
}

impl LoopRow {
    pub fn ratio(&self) -> f64 {
        self.overlapping_per_sec / self.one_at_a_time_per_sec
    }
}

/// An in-process queue of messages whose body says whether its handler is slow (one in ten),
/// each with a key of its own (`prefix`, then its number); a receive hands out at most 10 and as many as asked.
struct InProcess {
    total: usize,
    prefix: String,
    ready: std::sync::Mutex<Vec<u64>>,
    settled: std::sync::atomic::AtomicUsize,
    acknowledged: std::sync::atomic::AtomicUsize,
    done: tokio::sync::Notify,
}

impl InProcess {
    fn new(messages: usize, prefix: String) -> InProcess {
        InProcess {
            total: messages,
            prefix,
            ready: std::sync::Mutex::new((0..messages as u64).rev().collect()),
            settled: Default::default(),
            acknowledged: Default::default(),
            done: tokio::sync::Notify::new(),
        }
    }

    fn acknowledged(&self) -> usize {
        self.acknowledged.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Resolves once every message is settled.
    async fn drained(&self) {
        loop {
            let done = self.done.notified();
            let mut done = std::pin::pin!(done);
            done.as_mut().enable();
            if self.settled.load(std::sync::atomic::Ordering::SeqCst) >= self.total {
                return;
            }
            done.await;
        }
    }
}

impl idem::consumer::Broker for InProcess {
    type Body = bool;
    type Receipt = u64;
    type Error = Infallible;

    fn hold(&self) -> Duration {
        Duration::from_secs(30)
    }

    async fn receive(&self) -> Result<idem::consumer::Received<Self>, Infallible> {
        self.receive_up_to(BATCH).await
    }

    async fn receive_up_to(
        &self,
        most: usize,
    ) -> Result<idem::consumer::Received<Self>, Infallible> {
        let taken: Vec<u64> = match self.ready.lock() {
            Ok(mut ready) => {
                let n = most.min(BATCH).min(ready.len());
                let at = ready.len() - n;
                ready.split_off(at)
            }
            Err(_) => Vec::new(),
        };
        if taken.is_empty() {
            // A long poll on an empty queue: wait for the loop's shutdown instead.
            std::future::pending::<()>().await;
        }
        Ok(taken
            .into_iter()
            .rev()
            .map(|n| {
                (
                    Message::keyed(n % 10 == 3, format!("{}-{n}", self.prefix)),
                    n,
                )
            })
            .collect())
    }

    async fn extend(&self, _held: &[u64]) {}

    async fn settle(&self, settled: Vec<(u64, idem::consumer::Disposition)>) {
        let acked = settled.iter().filter(|(_, d)| d.acknowledges()).count();
        self.acknowledged
            .fetch_add(acked, std::sync::atomic::Ordering::SeqCst);
        self.settled
            .fetch_add(settled.len(), std::sync::atomic::Ordering::SeqCst);
        self.done.notify_waiters();
    }
}
