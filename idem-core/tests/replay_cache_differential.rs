//! The replay cache changes what a replay costs, never what a call gets: the same random
//! sequence of calls runs against an engine with the cache and one without, each over its own
//! store, and every answer must be the same.
//!
//! The calls draw from a few keys; fingerprints present or absent; work that succeeds, fails
//! (its error stored or not) or returns a result too large to keep; several retentions. Between
//! calls the clock moves (past retentions and the cache's `max_age`) and keys are evicted through
//! the engine. The cache is kept small, so it evicts entries too.
//!
//! - On the memory store, the stores and the cache share one `ManualClock`: retention ends and
//!   `max_age` are both exercised.
//! - On SQLite, the database keeps time on the system clock, and the durations are long enough
//!   that no record expires in the store during a case; the cache's clock (a `ManualClock` from
//!   the present) moves past its entries' retention and `max_age`.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Error, Fingerprint, Idempotency, Key, ManualClock, MemoryStore, Outcome, ReplayCache, Store,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// What the work of a call does.
#[derive(Debug, Clone, Copy)]
enum Body {
    Ok,
    /// A result larger than `max_response_bytes`: returned, not retained.
    Large,
    Fails,
}

#[derive(Debug, Clone)]
enum Op {
    Call {
        key: u8,
        fingerprint: Option<u8>,
        body: Body,
        /// Whether an `Err` is stored (`run_storing_errors`) or releases the key (`run`).
        storing_errors: bool,
        /// Index into the retentions, in units.
        retention: usize,
    },
    /// Moves the clock forward by this many units.
    Advance(u64),
    Evict(u8),
}

/// Retentions in units; the cache's `max_age` is 20 units.
const RETENTIONS: [u32; 3] = [5, 30, 120];
const MAX_AGE: u32 = 20;

fn op() -> impl Strategy<Value = Op> {
    let body = prop_oneof![
        6 => Just(Body::Ok),
        1 => Just(Body::Large),
        2 => Just(Body::Fails),
    ];
    prop_oneof![
        8 => (0..4u8, proptest::option::of(0..3u8), body, any::<bool>(), 0..RETENTIONS.len())
            .prop_map(|(key, fingerprint, body, storing_errors, retention)| Op::Call {
                key,
                fingerprint,
                body,
                storing_errors,
                retention,
            }),
        2 => (1..40u64).prop_map(Op::Advance),
        1 => (0..4u8).prop_map(Op::Evict),
    ]
}

/// A work error that can be stored, or the engine's own.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum WorkError {
    Declined(String),
    Engine(String),
}

impl From<Error> for WorkError {
    fn from(e: Error) -> Self {
        WorkError::Engine(format!("{e:?}"))
    }
}

/// What a call got, in a form two engines' answers are compared by.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Fresh(String),
    Replayed(String),
    Err(String),
}

fn answer(out: Result<Outcome<String>, WorkError>) -> Answer {
    match out {
        Ok(Outcome::Fresh(v)) => Answer::Fresh(v),
        Ok(Outcome::Replayed(v)) => Answer::Replayed(v),
        Err(e) => Answer::Err(format!("{e:?}")),
    }
}

/// One engine under test and how its clock moves.
struct Side {
    engine: Idempotency,
}

impl Side {
    async fn apply(&self, i: usize, op: &Op, unit: Duration) -> Option<Answer> {
        match *op {
            Op::Call {
                key,
                fingerprint,
                body,
                storing_errors,
                retention,
            } => {
                let k = Key::derive("differential", "", &key.to_string()).unwrap();
                let value = format!("v{i}");
                let work = async move {
                    match body {
                        Body::Ok => Ok(value),
                        Body::Large => Ok("x".repeat(200)),
                        Body::Fails => Err(WorkError::Declined(value)),
                    }
                };
                let call = self
                    .engine
                    .call(k)
                    .fingerprint(fingerprint.map(|f| Fingerprint::of_bytes(&[f])))
                    .retention(unit * RETENTIONS[retention]);
                let out = if storing_errors {
                    call.run_storing_errors(work).await
                } else {
                    call.run(work).await
                };
                Some(answer(out))
            }
            Op::Evict(key) => {
                let k = Key::derive("differential", "", &key.to_string()).unwrap();
                // Whether the store still held an expired record depends on when it last swept
                // its expired entries, which the cache changes (it spares the store calls): not
                // an answer to compare.
                self.engine.evict(&k).await.unwrap();
                None
            }
            Op::Advance(_) => None,
        }
    }
}

/// An engine over `store`, with the replay cache on `clock` or without one.
fn side(store: Arc<dyn Store>, cache: Option<(ManualClock, Duration)>) -> Side {
    let mut builder = Idempotency::builder(store).max_response_bytes(100);
    if let Some((clock, unit)) = cache {
        // Two entries and 256 bytes: the cache evicts as often as it keeps.
        builder = builder.replay_cache(
            ReplayCache::new(2, 256)
                .max_age(unit * MAX_AGE)
                .clock(clock),
        );
    }
    Side {
        engine: builder.build().unwrap(),
    }
}

/// Runs `ops` on both sides, advancing `clocks` by `unit`s, and compares every answer.
async fn compare(ops: &[Op], cached: &Side, plain: &Side, clocks: &[ManualClock], unit: Duration) {
    for (i, op) in ops.iter().enumerate() {
        if let Op::Advance(units) = op {
            for clock in clocks {
                clock.advance(unit * *units as u32);
            }
            continue;
        }
        let with_cache = cached.apply(i, op, unit).await;
        let without = plain.apply(i, op, unit).await;
        assert_eq!(
            with_cache, without,
            "op {i} ({op:?}) answered differently with the cache; the sequence: {ops:?}"
        );
    }
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(0x1de0_cace),
        ..Config::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn the_cache_answers_as_the_memory_store(ops in proptest::collection::vec(op(), 1..60)) {
        let unit = Duration::from_secs(1);
        let clock = ManualClock::new();
        let cached = side(
            Arc::new(MemoryStore::with_clock(clock.clone())),
            Some((clock.clone(), unit)),
        );
        let plain = side(Arc::new(MemoryStore::with_clock(clock.clone())), None);
        runtime().block_on(compare(&ops, &cached, &plain, &[clock], unit));
    }
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn the_cache_answers_as_sqlite(ops in proptest::collection::vec(op(), 1..40)) {
        // Minutes: no record expires in the database while a case runs; the cache's clock
        // moves past retentions and `max_age` all the same.
        let unit = Duration::from_secs(60);
        let clock = ManualClock::at(std::time::SystemTime::now());
        let dir = tempfile::tempdir().unwrap();
        runtime().block_on(async {
            let open = |name: &str| {
                let path = dir.path().join(name);
                async move {
                    Arc::new(idem_sql::SqliteStore::open(path).await.unwrap()) as Arc<dyn Store>
                }
            };
            let cached = side(open("cached.db").await, Some((clock.clone(), unit)));
            let plain = side(open("plain.db").await, None);
            compare(&ops, &cached, &plain, &[clock], unit).await;
        });
    }
}
