//! The run loop over a broker written here: an in-process queue that holds what it hands out
//! until it is settled or its hold ends, redelivers what is handed back (after the delay asked
//! for, else after its hold, as SQS does), and keeps a dead-letter list. A real implementation
//! of `Broker`, not a mock: what the queue sees is what any broker would.
//!
//! One batch meets every outcome, and each message is settled once, exactly as the outcome
//! table (docs/consumers.md) says: done, replayed and not retained acknowledged; in flight
//! handed back after its `retry_after`; failed and not processed handed back; poison
//! dead-lettered. The hold of a batch that runs longer than it is extended, so no message is
//! settled after its hold ended. The redeliveries then all run (or replay) and are
//! acknowledged, and every effect happened once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{Fingerprint, Idempotency, MemoryStore, Store};
use idem_consumer::{Broker, Consumer, Disposition, Message, Received};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// A message as the producer sent it.
#[derive(Clone, Debug)]
struct Job {
    /// What the handler does, and the business id its effect is counted under.
    id: &'static str,
    /// The message's key (the producer's message id).
    key: &'static str,
    group: Option<&'static str>,
    /// What the message says, when it is not its id (a reused key).
    says: &'static str,
}

fn job(id: &'static str, key: &'static str, group: Option<&'static str>) -> Job {
    Job {
        id,
        key,
        group,
        says: id,
    }
}

/// One settlement the queue was asked for.
#[derive(Debug, Clone, PartialEq)]
struct Settled {
    id: &'static str,
    delivery: u32,
    disposition: Disposition,
}

#[derive(Default)]
struct State {
    next_receipt: u64,
    /// Messages waiting, each visible from its instant, with its delivery count so far.
    ready: VecDeque<(Instant, u32, Job)>,
    /// Messages handed out and not settled: receipt → (held until, delivery, message).
    held: HashMap<u64, (Instant, u32, Job)>,
    settled: Vec<Settled>,
    dead: Vec<&'static str>,
    extended: u32,
    /// Settlements of a receipt the queue no longer holds (settled twice, or after its hold
    /// ended: the message could have gone to another consumer meanwhile).
    stale: Vec<u64>,
    /// At each receive: how many it asked for, and how many messages were held unsettled.
    receives: Vec<(usize, usize)>,
}

/// The in-process queue.
struct Queue {
    hold: Duration,
    /// The most messages a receive hands out, whatever it asks for.
    per_receive: usize,
    state: Mutex<State>,
}

impl Queue {
    fn new(hold: Duration, jobs: Vec<Job>) -> Queue {
        let now = Instant::now();
        let state = State {
            ready: jobs.into_iter().map(|j| (now, 0, j)).collect(),
            ..State::default()
        };
        Queue {
            hold,
            per_receive: 20,
            state: Mutex::new(state),
        }
    }

    /// The same queue, handing out at most `n` messages a receive.
    fn per_receive(self, n: usize) -> Queue {
        Queue {
            per_receive: n,
            ..self
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Resolves once `n` settlements were made.
    async fn settled(&self, n: usize) {
        while self.state().settled.len() < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Resolves once nothing is waiting or held.
    async fn drained(&self) {
        loop {
            {
                let state = self.state();
                if state.ready.is_empty() && state.held.is_empty() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Broker for Queue {
    type Body = Job;
    type Receipt = u64;
    type Error = std::convert::Infallible;

    fn hold(&self) -> Duration {
        self.hold
    }

    fn name(&self) -> &str {
        "the test queue"
    }

    async fn receive(&self) -> Result<Received<Self>, Self::Error> {
        self.receive_up_to(usize::MAX).await
    }

    async fn receive_up_to(&self, most: usize) -> Result<Received<Self>, Self::Error> {
        let most = most.min(self.per_receive);
        let received = {
            let mut state = self.state();
            let held = state.held.len();
            state.receives.push((most, held));
            let now = Instant::now();
            // A hold that ended: the message is delivered again.
            let ended: Vec<u64> = state
                .held
                .iter()
                .filter(|(_, (until, ..))| *until <= now)
                .map(|(r, _)| *r)
                .collect();
            for receipt in ended {
                let (_, delivery, job) = state.held.remove(&receipt).unwrap();
                state.ready.push_back((now, delivery, job));
            }
            let mut received = Vec::new();
            let mut waiting = VecDeque::new();
            while let Some((visible, delivery, job)) = state.ready.pop_front() {
                if visible > now || received.len() == most {
                    waiting.push_back((visible, delivery, job));
                    continue;
                }
                state.next_receipt += 1;
                let receipt = state.next_receipt;
                let delivery = delivery + 1;
                state
                    .held
                    .insert(receipt, (now + self.hold, delivery, job.clone()));
                let message = Message::keyed(job.clone(), job.key)
                    .fingerprint(Fingerprint::of_bytes(job.says.as_bytes()));
                let message = match job.group {
                    Some(group) => message.group(group),
                    None => message,
                };
                received.push((message, receipt));
            }
            state.ready = waiting;
            received
        };
        if received.is_empty() {
            // A short long poll.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(received)
    }

    async fn extend(&self, held: &[u64]) {
        let mut state = self.state();
        let until = Instant::now() + self.hold;
        for receipt in held {
            if let Some(entry) = state.held.get_mut(receipt) {
                entry.0 = until;
            }
        }
        state.extended += 1;
    }

    async fn settle(&self, settled: Vec<(u64, Disposition)>) {
        let mut state = self.state();
        let now = Instant::now();
        for (receipt, disposition) in settled {
            let Some((until, delivery, job)) = state.held.remove(&receipt) else {
                state.stale.push(receipt);
                continue;
            };
            if until < now {
                state.stale.push(receipt);
            }
            state.settled.push(Settled {
                id: job.id,
                delivery,
                disposition,
            });
            match disposition {
                Disposition::Acknowledge => {}
                Disposition::Redeliver { after } => {
                    let visible = now + after.unwrap_or(self.hold);
                    state.ready.push_back((visible, delivery, job));
                }
                Disposition::DeadLetter => state.dead.push(job.id),
            }
        }
    }
}

/// A handler's work.
type Work = std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>;

/// The business table: how many times each message's effect was applied, and how many times
/// each handler was called.
#[derive(Clone, Default)]
struct Effects {
    applied: Arc<Mutex<HashMap<&'static str, u32>>>,
    calls: Arc<Mutex<HashMap<&'static str, u32>>>,
}

impl Effects {
    fn apply(&self, id: &'static str) {
        *self.applied.lock().unwrap().entry(id).or_default() += 1;
    }

    fn applied(&self) -> HashMap<&'static str, u32> {
        self.applied.lock().unwrap().clone()
    }

    /// The handler: `fail…` fails and `panic` panics on their first call, `slow` outlasts the
    /// hold, `big` returns more than the engine keeps; each effect is applied once per success.
    fn handler(&self, slow: Duration) -> impl Fn(Job) -> Work + use<> {
        let effects = self.clone();
        move |job: Job| {
            let effects = effects.clone();
            Box::pin(async move {
                let call = {
                    let mut calls = effects.calls.lock().unwrap();
                    let n = calls.entry(job.id).or_default();
                    *n += 1;
                    *n
                };
                match job.id {
                    "fail" | "g1" if call == 1 => return Err(format!("{} failed", job.id)),
                    "panic" if call == 1 => panic!("{} panicked", job.id),
                    "slow" => tokio::time::sleep(slow).await,
                    _ => {}
                }
                effects.apply(job.id);
                Ok(match job.id {
                    "big" => "x".repeat(4096),
                    id => format!("done {id}"),
                })
            })
        }
    }

    /// The handler of the run elsewhere: says it started, then waits for the gate.
    fn held_elsewhere(
        &self,
        gate: Arc<Semaphore>,
        started: Arc<Semaphore>,
    ) -> impl Fn(Job) -> Work + use<> {
        let effects = self.clone();
        move |job: Job| {
            let (gate, started, effects) = (gate.clone(), started.clone(), effects.clone());
            Box::pin(async move {
                started.add_permits(1);
                gate.acquire().await.unwrap().forget();
                effects.apply(job.id);
                Ok("done elsewhere".to_owned())
            })
        }
    }
}

fn ack(id: &'static str, delivery: u32) -> Settled {
    Settled {
        id,
        delivery,
        disposition: Disposition::Acknowledge,
    }
}

fn back(id: &'static str, delivery: u32) -> Settled {
    Settled {
        id,
        delivery,
        disposition: Disposition::Redeliver { after: None },
    }
}

fn dead(id: &'static str, delivery: u32) -> Settled {
    Settled {
        id,
        delivery,
        disposition: Disposition::DeadLetter,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_settled_once_as_its_outcome_says() {
    let scale = idem::conformance::time_scale();
    let hold = Duration::from_secs_f64(scale);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let engine = Idempotency::builder(store.clone())
        .max_response_bytes(1024)
        .build()
        .unwrap();
    let consumer = Consumer::new(engine, "orders").unwrap().ordered(true);
    let fx = Effects::default();

    // Another consumer (same store, its own engine: another process) runs "held" and is slow.
    let elsewhere = Consumer::new(Idempotency::from_arc(store.clone()), "orders")
        .unwrap()
        .lease(hold);
    let gate = Arc::new(Semaphore::new(0));
    let started = Arc::new(Semaphore::new(0));
    let handler = fx.held_elsewhere(gate.clone(), started.clone());
    let held = Message::keyed(job("held", "held", None), "held")
        .fingerprint(Fingerprint::of_bytes(b"held"));
    let running = tokio::spawn(async move { elsewhere.process(vec![held], handler).await });
    started.acquire().await.unwrap().forget();

    let queue = Queue::new(
        hold,
        vec![
            job("a", "a", Some("ga")),          // done
            job("a", "a", Some("ga")),          // replayed (its twin, before it in its group)
            job("big", "big", Some("gb")),      // done, its result too large to keep
            job("big", "big", Some("gb")),      // not retained
            job("fail", "fail", None),          // failed (the handler's error)
            job("panic", "panic", None),        // failed (a panic)
            job("held", "held", None),          // in flight elsewhere
            job("slow", "slow", None),          // done, after more than the hold
            job("bad", "not\tprintable", None), // poison: not a key
            job("r", "r", Some("gr")),          // done
            Job {
                says: "another payload",
                ..job("r2", "r", Some("gr")) // poison: r's key, another payload
            },
            job("g1", "g1", Some("g")), // failed: its group stops
            job("g2", "g2", Some("g")), // not processed
        ],
    );
    let slow = hold * 5 / 2;
    consumer
        .run(&queue, fx.handler(slow), queue.settled(13))
        .await;

    let (first, in_flight) = {
        let state = queue.state();
        let in_flight = state.settled.iter().find(|s| s.id == "held").cloned();
        (state.settled.clone(), in_flight)
    };
    let Some(Settled {
        disposition: Disposition::Redeliver {
            after: Some(retry_after),
        },
        ..
    }) = in_flight
    else {
        panic!("the message in flight elsewhere was settled as {in_flight:?}")
    };
    assert!(retry_after <= hold, "{retry_after:?}");
    let mut expected = vec![
        ack("a", 1),
        ack("a", 1),
        ack("big", 1),
        ack("big", 1),
        back("fail", 1),
        back("panic", 1),
        Settled {
            id: "held",
            delivery: 1,
            disposition: Disposition::Redeliver {
                after: Some(retry_after),
            },
        },
        ack("slow", 1),
        dead("bad", 1),
        ack("r", 1),
        dead("r2", 1),
        back("g1", 1),
        back("g2", 1),
    ];
    assert_eq!(
        first, expected,
        "one settlement per message, in batch order"
    );
    {
        let state = queue.state();
        assert!(
            state.stale.is_empty(),
            "settled after its hold: {:?}",
            state.stale
        );
        assert!(
            state.extended >= 2,
            "a batch of {slow:?} under a hold of {hold:?} extended it {} times",
            state.extended
        );
        assert_eq!(state.dead, ["bad", "r2"]);
    }

    // The run elsewhere ends; every message handed back comes again and is acknowledged.
    gate.add_permits(1);
    running.await.unwrap();
    consumer
        .run(&queue, fx.handler(slow), queue.drained())
        .await;
    let state = queue.state();
    let mut again: Vec<Settled> = state.settled[first.len()..].to_vec();
    again.sort_by_key(|s| s.id);
    assert_eq!(
        again,
        [
            ack("fail", 2),
            ack("g1", 2),
            ack("g2", 2),
            ack("held", 2),
            ack("panic", 2),
        ]
    );
    assert!(
        state.stale.is_empty(),
        "settled after its hold: {:?}",
        state.stale
    );
    expected.extend(again);
    assert_eq!(
        state.settled.len(),
        expected.len(),
        "no message settled twice"
    );
    let once: HashMap<&'static str, u32> =
        ["a", "big", "fail", "panic", "held", "slow", "r", "g1", "g2"]
            .into_iter()
            .map(|id| (id, 1))
            .collect();
    assert_eq!(fx.applied(), once, "every effect once");
}

/// The ids of the messages of the tests below.
const IDS: [&str; 12] = [
    "m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9", "m10", "m11",
];

/// Handlers that count how many run at once (the most at any time) and how many finished,
/// each applying its message's effect once.
#[derive(Clone)]
struct Running {
    effects: Effects,
    /// How many run now, and the most that ran at once.
    now: Arc<Mutex<(usize, usize)>>,
    /// A permit for each message finished.
    finished: Arc<Semaphore>,
}

impl Default for Running {
    fn default() -> Running {
        Running {
            effects: Effects::default(),
            now: Arc::default(),
            finished: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Running {
    /// The most that ran at once.
    fn most(&self) -> usize {
        self.now.lock().unwrap().1
    }

    /// The handler: `slow` waits until `wait_for` other messages have finished, `gated` until
    /// the `gate` opens; the others finish at once.
    fn handler(&self, wait_for: u32, gate: Arc<Semaphore>) -> impl Fn(Job) -> Work + use<> {
        let me = self.clone();
        move |job: Job| {
            let (me, gate) = (me.clone(), gate.clone());
            Box::pin(async move {
                {
                    let mut now = me.now.lock().unwrap();
                    now.0 += 1;
                    now.1 = now.1.max(now.0);
                }
                match job.id {
                    "slow" => me.finished.acquire_many(wait_for).await.unwrap().forget(),
                    "gated" => gate.acquire().await.unwrap().forget(),
                    _ => {}
                }
                me.effects.apply(job.id);
                me.now.lock().unwrap().0 -= 1;
                me.finished.add_permits(1);
                Ok(format!("done {}", job.id))
            })
        }
    }
}

/// Runs `consumer` over `queue` until `done`, failing (not hanging) if that takes longer than
/// a minute of the test's paused clock: the loop is stuck.
async fn run_until(
    consumer: &Consumer,
    queue: &Queue,
    handler: impl Fn(Job) -> Work,
    done: impl std::future::Future<Output = ()>,
    what: &str,
) {
    let run = consumer.run(queue, handler, done);
    if tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .is_err()
    {
        let state = queue.state();
        panic!(
            "{what}: the loop was stuck, {} settled, receives (asked, held) {:?}",
            state.settled.len(),
            state.receives
        );
    }
}

/// A message that waits for ten others to finish, in a consumer that runs four at once: the
/// loop receives more while it waits, as its batch's other messages free their room, so the ten
/// run and it finishes. Were a batch to run whole before the next receive, it would wait
/// forever on messages never received. No receive asks for more than the room left.
#[tokio::test(start_paused = true)]
async fn a_slow_message_holds_up_its_batch_not_the_queue() {
    let hold = Duration::from_secs(30);
    let mut jobs = vec![job("slow", "slow", None)];
    jobs.extend(IDS[..10].iter().map(|id| job(id, id, None)));
    let queue = Queue::new(hold, jobs);
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()), "orders")
        .unwrap()
        .concurrency(4);
    let running = Running::default();
    let handler = running.handler(10, Arc::new(Semaphore::new(0)));
    run_until(
        &consumer,
        &queue,
        handler,
        queue.settled(11),
        "a slow message",
    )
    .await;

    let state = queue.state();
    assert_eq!(state.settled.len(), 11, "{:?}", state.settled);
    assert!(
        state
            .settled
            .iter()
            .all(|s| s.delivery == 1 && s.disposition == Disposition::Acknowledge),
        "each acknowledged on its first delivery: {:?}",
        state.settled
    );
    // The first batch held the slow message and m0-m2; the other seven were received and
    // settled while it waited, and its batch was settled last.
    let mut first: Vec<&str> = state.settled[..7].iter().map(|s| s.id).collect();
    first.sort_unstable();
    assert_eq!(
        first,
        ["m3", "m4", "m5", "m6", "m7", "m8", "m9"],
        "settled while the slow message ran: {:?}",
        state.settled
    );
    assert!(
        state
            .receives
            .iter()
            .all(|&(asked, _)| (2..=4).contains(&asked)),
        "each receive asked for the room left, once half the four were free: {:?}",
        state.receives
    );
    assert!(running.most() <= 4, "{} ran at once", running.most());
    let mut once: HashMap<&'static str, u32> = IDS[..10].iter().map(|id| (*id, 1)).collect();
    once.insert("slow", 1);
    assert_eq!(running.effects.applied(), once, "every effect once");
}

/// Two batches at once, up to the concurrency and no further, and a shutdown with both in hand:
/// the queue hands out two messages a receive and the consumer runs four, so four run only if
/// the second batch is received while the first runs; with four running no third receive is
/// made; and after the shutdown both batches finish and are settled before `run` returns.
#[tokio::test(start_paused = true)]
async fn shutdown_finishes_and_settles_every_batch_in_hand() {
    let hold = Duration::from_secs(30);
    let jobs = (0..6)
        .map(|_| job("gated", "gated", None))
        .collect::<Vec<_>>();
    // Six messages with keys of their own, each waiting for the gate.
    let jobs: Vec<Job> = jobs
        .into_iter()
        .zip(IDS)
        .map(|(j, key)| Job { key, ..j })
        .collect();
    let queue = Queue::new(hold, jobs).per_receive(2);
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()), "orders")
        .unwrap()
        .concurrency(4);
    let running = Running::default();
    let gate = Arc::new(Semaphore::new(0));
    let handler = running.handler(0, gate.clone());
    // Shutdown once four handlers run (two batches); the gate opens with it.
    let started = {
        let running = running.clone();
        let gate = gate.clone();
        async move {
            while running.now.lock().unwrap().0 < 4 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            gate.add_permits(6);
        }
    };
    run_until(&consumer, &queue, handler, started, "shutdown").await;

    let state = queue.state();
    assert_eq!(
        state.settled.len(),
        4,
        "the four messages in hand, settled before run returned: {:?}",
        state.settled
    );
    assert!(state
        .settled
        .iter()
        .all(|s| s.disposition == Disposition::Acknowledge));
    assert_eq!(state.held.len(), 0, "nothing left held");
    assert_eq!(
        running.most(),
        4,
        "four ran at once, across two batches, and no more"
    );
    assert_eq!(state.ready.len(), 2, "the two never received wait");
    assert_eq!(
        state.receives.len(),
        2,
        "no receive after the shutdown: {:?}",
        state.receives
    );
}

/// In ordered mode the loop receives a batch only once the one before it is settled: a
/// group's next message must wait for the one before it, which a batch beside it would not.
#[tokio::test(start_paused = true)]
async fn ordered_batches_run_one_at_a_time() {
    let hold = Duration::from_secs(30);
    let jobs: Vec<Job> = IDS
        .iter()
        .enumerate()
        .map(|(i, id)| job(id, id, Some(["g1", "g2", "g3"][i % 3])))
        .collect();
    let queue = Queue::new(hold, jobs).per_receive(5);
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()), "orders")
        .unwrap()
        .ordered(true);
    let running = Running::default();
    let handler = running.handler(0, Arc::new(Semaphore::new(0)));
    run_until(&consumer, &queue, handler, queue.settled(12), "ordered").await;

    let state = queue.state();
    let batches: Vec<(usize, usize)> = state
        .receives
        .iter()
        .copied()
        .filter(|&(asked, _)| asked > 0)
        .collect();
    assert!(
        batches.iter().all(|&(_, held)| held == 0),
        "a receive while a batch was held: {:?}",
        state.receives
    );
    let order: Vec<&str> = state.settled.iter().map(|s| s.id).collect();
    assert_eq!(order, IDS, "settled in the queue's order");
}
