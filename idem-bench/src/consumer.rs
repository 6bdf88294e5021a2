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
