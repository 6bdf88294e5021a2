//! The consumer's batch API against real stores: every message's effect once, whatever the
//! broker redelivers (duplicates in a batch and across batches, twins in flight elsewhere,
//! failing and panicking handlers, results too large to keep, reused and invalid keys, FIFO
//! groups that stop, a caller that goes away mid-batch, a deadline), and every outcome counted
//! and seen by the observer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{Error, Fingerprint, Idempotency, MemoryStore, SqliteStore, Store, TokioClock};
use idem_consumer::{Consumer, Disposition, Failure, Message, MessageOutcome};
use tokio::sync::Semaphore;

/// What a handler does with a message.
#[derive(Clone)]
enum Act {
    Ok,
    Fail,
    Panic,
    /// Waits for a permit first (a slow handler the test lets go of).
    Wait(Arc<Semaphore>),
    /// Returns a result larger than the engine keeps.
    Big,
}

struct Job {
    id: &'static str,
    act: Act,
}

type Out = MessageOutcome<String, String>;

/// The business table: how many times each message's effect was applied, and when handlers
/// started.
#[derive(Clone)]
struct Effects {
    applied: Arc<Mutex<HashMap<&'static str, u32>>>,
    started: Arc<Semaphore>,
    running: Arc<Mutex<(u32, u32)>>,
}

impl Default for Effects {
    fn default() -> Self {
        Effects {
            applied: Arc::default(),
            started: Arc::new(Semaphore::new(0)),
            running: Arc::default(),
        }
    }
}

impl Effects {
    fn count(&self, id: &str) -> u32 {
        self.applied.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// The handler: applies the effect once per run, as a charge would.
    fn handler(
        &self,
    ) -> impl Fn(
        Job,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
           + Clone
           + use<> {
        let effects = self.clone();
        move |job: Job| {
            let effects = effects.clone();
            Box::pin(async move {
                effects.started.add_permits(1);
                {
                    let mut running = effects.running.lock().unwrap();
                    running.0 += 1;
                    running.1 = running.1.max(running.0);
                }
                if let Act::Wait(gate) = &job.act {
                    gate.acquire().await.unwrap().forget();
                }
                effects.running.lock().unwrap().0 -= 1;
                match job.act {
                    Act::Fail => return Err(format!("{} failed", job.id)),
                    Act::Panic => panic!("{} panicked", job.id),
                    _ => {}
                }
                *effects.applied.lock().unwrap().entry(job.id).or_default() += 1;
                Ok(match job.act {
                    Act::Big => "x".repeat(4096),
                    _ => format!("done {}", job.id),
                })
            })
        }
    }
}

fn msg(id: &'static str, act: Act) -> Message<Job> {
    Message::keyed(Job { id, act }, id)
}

fn names(outcomes: &[Out]) -> Vec<&'static str> {
    outcomes.iter().map(|o| o.as_str()).collect()
}

/// An engine over a fresh store of each kind.
async fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

async fn sqlite() -> Arc<dyn Store> {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    // The directory lives as long as the test's process: the store keeps its file open.
    std::mem::forget(dir);
    Arc::new(store)
}
async fn postgres() -> Option<Arc<dyn Store>> {
    let url = idem_test_support::postgres::pg_url(&idem_test_support::current_test())?;
    Some(Arc::new(
        idem_test_support::postgres::fresh_store(&url, |b| b).await,
    ))
}

fn consumer(store: Arc<dyn Store>) -> Consumer {
    Consumer::new(Idempotency::from_arc(store), "orders").unwrap()
}

async fn duplicates_in_and_across_batches_apply_once(store: Arc<dyn Store>) {
    let c = consumer(store);
    let fx = Effects::default();
    let first = c
        .process(
            vec![msg("a", Act::Ok), msg("b", Act::Ok), msg("a", Act::Ok)],
            fx.handler(),
        )
        .await;
    assert_eq!(names(&first), ["done", "done", "replayed"]);
    assert_eq!(first[2].value().map(String::as_str), Some("done a"));
    let again = c
        .process(
            vec![msg("a", Act::Ok), msg("b", Act::Ok), msg("c", Act::Ok)],
            fx.handler(),
        )
        .await;
    assert_eq!(names(&again), ["replayed", "replayed", "done"]);
    assert!(again
        .iter()
        .all(|o| o.disposition() == Disposition::Acknowledge));
    assert_eq!((fx.count("a"), fx.count("b"), fx.count("c")), (1, 1, 1));
}

async fn a_twin_in_flight_elsewhere_is_handed_back_not_dropped(store: Arc<dyn Store>) {
    let c = consumer(store).lease(Duration::from_secs(30));
    let fx = Effects::default();
    let gate = Arc::new(Semaphore::new(0));
    // Another consumer (same store, its own engine: another process) runs "a" and is slow.
    let elsewhere =
        Consumer::new(Idempotency::from_arc(c.engine().store().clone()), "orders").unwrap();
    let handler = fx.handler();
    let slow = tokio::spawn({
        let gate = gate.clone();
        async move {
            elsewhere
                .process(vec![msg("a", Act::Wait(gate))], handler)
                .await
        }
    });
    fx.started.acquire().await.unwrap().forget();
    let twin = c.process(vec![msg("a", Act::Ok)], fx.handler()).await;
    match &twin[0] {
        MessageOutcome::InFlight { retry_after } => {
            assert!(*retry_after <= Duration::from_secs(30), "{retry_after:?}");
            assert_eq!(
                twin[0].disposition(),
                Disposition::Redeliver {
                    after: Some(*retry_after)
                }
            );
        }
        other => panic!("a twin in flight came back {other:?}"),
    }
    gate.add_permits(1);
    assert_eq!(names(&slow.await.unwrap()), ["done"]);
    let redelivered = c.process(vec![msg("a", Act::Ok)], fx.handler()).await;
    assert_eq!(names(&redelivered), ["replayed"]);
    assert_eq!(fx.count("a"), 1);
}

async fn failures_and_panics_free_the_key_for_the_redelivery(store: Arc<dyn Store>) {
    let c = consumer(store);
    let fx = Effects::default();
    let first = c
        .process(
            vec![
                msg("f", Act::Fail),
                msg("p", Act::Panic),
                msg("ok", Act::Ok),
            ],
            fx.handler(),
        )
        .await;
    assert_eq!(names(&first), ["failed", "failed", "done"]);
    assert!(matches!(&first[0], MessageOutcome::Failed(Failure::Handler(e)) if e == "f failed"));
    assert!(
        matches!(&first[1], MessageOutcome::Failed(Failure::Panicked(m)) if m == "p panicked"),
        "{:?}",
        first[1]
    );
    assert_eq!(
        first[0].disposition(),
        Disposition::Redeliver { after: None }
    );
    let again = c
        .process(
            vec![msg("f", Act::Ok), msg("p", Act::Ok), msg("ok", Act::Ok)],
            fx.handler(),
        )
        .await;
    assert_eq!(names(&again), ["done", "done", "replayed"]);
    assert_eq!((fx.count("f"), fx.count("p"), fx.count("ok")), (1, 1, 1));
}

async fn an_unkept_result_is_acknowledged_and_never_runs_again(store: Arc<dyn Store>) {
    let engine = Idempotency::builder(store)
        .max_response_bytes(1024)
        .build()
        .unwrap();
    let c = Consumer::new(engine, "orders").unwrap();
    let fx = Effects::default();
    let first = c.process(vec![msg("big", Act::Big)], fx.handler()).await;
    assert_eq!(
        names(&first),
        ["done"],
        "the handler's result goes to the caller"
    );
    let again = c.process(vec![msg("big", Act::Big)], fx.handler()).await;
    assert_eq!(names(&again), ["not_retained"]);
    assert_eq!(again[0].disposition(), Disposition::Acknowledge);
    assert_eq!(fx.count("big"), 1);
}

async fn a_reused_or_invalid_key_is_poison(store: Arc<dyn Store>) {
    let c = consumer(store);
    let fx = Effects::default();
    let order = |cents: u32| {
        Message::keyed(
            Job {
                id: "k",
                act: Act::Ok,
            },
            "k",
        )
        .fingerprint(Fingerprint::of_json(&cents).unwrap())
    };
    assert_eq!(
        names(&c.process(vec![order(100)], fx.handler()).await),
        ["done"]
    );
    let reused = c
        .process(
            vec![
                order(900),
                Message::keyed(
                    Job {
                        id: "bad",
                        act: Act::Ok,
                    },
                    "not\tprintable",
                ),
                order(100),
            ],
            fx.handler(),
        )
        .await;
    assert_eq!(names(&reused), ["poison", "poison", "replayed"]);
    assert!(matches!(
        &reused[0],
        MessageOutcome::Poison(Error::KeyReused)
    ));
    assert!(matches!(
        &reused[1],
        MessageOutcome::Poison(Error::InvalidKey(_))
    ));
    assert_eq!(reused[0].disposition(), Disposition::DeadLetter);
    assert_eq!((fx.count("k"), fx.count("bad")), (1, 0));
}

async fn fifo_groups_stop_at_their_first_unacknowledged_message(store: Arc<dyn Store>) {
    let c = consumer(store).ordered(true);
    let fx = Effects::default();
    let grouped = |id, act, g| msg(id, act).group(g);
    let batch = |m2: Act| {
        vec![
            grouped("g1-1", Act::Ok, "g1"),
            grouped("g2-1", Act::Ok, "g2"),
            grouped("g1-2", m2, "g1"),
            grouped("g2-2", Act::Ok, "g2"),
            grouped("g1-3", Act::Ok, "g1"),
            Message::keyed(
                Job {
                    id: "bad",
                    act: Act::Ok,
                },
                "\u{e9}",
            )
            .group("g3"),
            grouped("g3-2", Act::Ok, "g3"),
        ]
    };
    let first = c.process(batch(Act::Fail), fx.handler()).await;
    assert_eq!(
        names(&first),
        [
            "done",
            "done",
            "failed",
            "done",
            "not_processed",
            "poison",
            "not_processed"
        ]
    );
    assert_eq!(
        (fx.count("g1-3"), fx.count("g3-2")),
        (0, 0),
        "later messages of a stopped group ran"
    );
    let again = c.process(batch(Act::Ok), fx.handler()).await;
    assert_eq!(
        names(&again),
        [
            "replayed",
            "replayed",
            "done",
            "replayed",
            "done",
            "poison",
            "not_processed"
        ]
    );
    for id in ["g1-1", "g1-2", "g1-3", "g2-1", "g2-2"] {
        assert_eq!(fx.count(id), 1, "{id}");
    }
}

async fn a_caller_gone_mid_batch_leaves_started_work_finished(store: Arc<dyn Store>) {
    let c = consumer(store).concurrency(1);
    let fx = Effects::default();
    let gate = Arc::new(Semaphore::new(0));
    let batch = c.process(
        vec![msg("a", Act::Wait(gate.clone())), msg("b", Act::Ok)],
        fx.handler(),
    );
    tokio::select! {
        _ = batch => panic!("the batch ended while its first handler was held"),
        p = fx.started.acquire() => p.unwrap().forget(),
    }
    // The batch is dropped now, with "a" running and "b" not started.
    gate.add_permits(1);
    let settled = idem_test_support::eventually(|| {
        let fx = fx.clone();
        async move { fx.count("a") == 1 }
    })
    .await;
    assert!(
        settled,
        "the started handler did not finish after its caller left"
    );
    let redelivered = idem_test_support::eventually(|| {
        let (c, fx) = (c.clone(), fx.clone());
        async move {
            // In flight until its completion lands, then replayed.
            let out = c.process(vec![msg("a", Act::Ok)], fx.handler()).await;
            names(&out) == ["replayed"]
        }
    })
    .await;
    assert!(redelivered, "the started handler's result was not stored");
    let b = c.process(vec![msg("b", Act::Ok)], fx.handler()).await;
    assert_eq!(names(&b), ["done"], "the message not started was");
    assert_eq!((fx.count("a"), fx.count("b")), (1, 1));
}

async fn unkeyed_messages_run_every_time_and_concurrency_is_bounded(store: Arc<dyn Store>) {
    let c = consumer(store).concurrency(3);
    let fx = Effects::default();
    let gate = Arc::new(Semaphore::new(0));
    let batch: Vec<_> = (0..10)
        .map(|_| {
            Message::unkeyed(Job {
                id: "u",
                act: Act::Wait(gate.clone()),
            })
        })
        .collect();
    let run = c.process(batch, fx.handler());
    let release = async {
        fx.started.acquire_many(3).await.unwrap().forget();
        gate.add_permits(10);
    };
    let (out, ()) = tokio::join!(run, release);
    assert!(out.iter().all(|o| o.as_str() == "done"));
    assert_eq!(fx.count("u"), 10);
    assert_eq!(
        fx.running.lock().unwrap().1,
        3,
        "most handlers running at once"
    );
}

/// A redelivery after the result's retention meets the key's tombstone: `closed`, acknowledged,
/// never run again; one whose fingerprint changed under another policy version (a deploy
/// changed what is fingerprinted) is poison (`PolicyChanged`), dead-lettered, never run.
async fn a_tombstone_closes_and_a_changed_policy_is_poison(store: Arc<dyn Store>) {
    let retention = Duration::from_millis(300);
    let engine = Idempotency::builder(store)
        .retention(retention)
        .build()
        .unwrap();
    let c = Consumer::new(engine, "orders").unwrap();
    let fx = Effects::default();
    let order = |id: &'static str, cents: u32, policy: u32| {
        Message::keyed(Job { id, act: Act::Ok }, id)
            .fingerprint(Fingerprint::of_json(&cents).unwrap().with_policy(policy))
    };
    let first = c
        .process(
            vec![order("old", 100, 1), order("v1", 100, 1)],
            fx.handler(),
        )
        .await;
    assert_eq!(names(&first), ["done", "done"]);
    let changed = c.process(vec![order("v1", 250, 2)], fx.handler()).await;
    assert_eq!(names(&changed), ["poison"]);
    assert!(matches!(
        &changed[0],
        MessageOutcome::Poison(Error::PolicyChanged {
            stored: 1,
            current: 2
        })
    ));
    assert_eq!(changed[0].disposition(), Disposition::DeadLetter);
    tokio::time::sleep(retention + Duration::from_millis(200)).await;
    let late = c.process(vec![order("old", 100, 1)], fx.handler()).await;
    assert_eq!(names(&late), ["closed"]);
    assert!(matches!(
        &late[0],
        MessageOutcome::Closed(Error::ResultExpired { .. })
    ));
    assert_eq!(late[0].disposition(), Disposition::Acknowledge);
    assert_eq!((fx.count("old"), fx.count("v1")), (1, 1));
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod memory_store {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() { super::$scenario(super::memory().await).await })*
        }
        mod sqlite_store {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() { super::$scenario(super::sqlite().await).await })*
        }
        mod postgres_store {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(store) = super::postgres().await else { return };
                super::$scenario(store).await
            })*
        }
    };
}

/// A message whose completion the store fails (it went away right after the handler ran) is
/// acknowledged with its result, its completion going on in the background. A redelivery
/// meanwhile is handed back (`InFlight`, to come again after the completion's next try: 2 s, at
/// most 2 s and a third of the 30 s lease), never run again; once the store is back, the
/// redelivery replays. One effect.
async fn a_redelivery_meeting_a_pending_completion_is_handed_back(store: Arc<dyn Store>) {
    let failing = idem_test_support::faults::CompletionsFail::new(store);
    let c = Consumer::new(Idempotency::from_arc(failing.clone()), "orders")
        .unwrap()
        .lease(Duration::from_secs(30));
    let fx = Effects::default();
    assert_eq!(
        names(&c.process(vec![msg("a", Act::Ok)], fx.handler()).await),
        ["done"]
    );
    let again = c.process(vec![msg("a", Act::Ok)], fx.handler()).await;
    assert!(
        matches!(again[0], MessageOutcome::InFlight { retry_after } if retry_after == Duration::from_secs(2)),
        "{again:?}"
    );
    failing.switch(false);
    // Bounded: the completion's next try is at most 2 s away.
    let mut replayed = false;
    for _ in 0..100 {
        let redelivered = c.process(vec![msg("a", Act::Ok)], fx.handler()).await;
        match names(&redelivered)[..] {
            ["replayed"] => {
                replayed = true;
                break;
            }
            ["in_flight"] => tokio::time::sleep(Duration::from_millis(100)).await,
            _ => panic!("{redelivered:?}"),
        }
    }
    assert!(replayed, "the completion never landed");
    assert_eq!(fx.count("a"), 1);
}

on_every_store!(
    a_redelivery_meeting_a_pending_completion_is_handed_back,
    duplicates_in_and_across_batches_apply_once,
    a_twin_in_flight_elsewhere_is_handed_back_not_dropped,
    failures_and_panics_free_the_key_for_the_redelivery,
    an_unkept_result_is_acknowledged_and_never_runs_again,
    a_reused_or_invalid_key_is_poison,
    fifo_groups_stop_at_their_first_unacknowledged_message,
    a_caller_gone_mid_batch_leaves_started_work_finished,
    unkeyed_messages_run_every_time_and_concurrency_is_bounded,
    a_tombstone_closes_and_a_changed_policy_is_poison,
);

/// At the deadline the batch answers: what finished is acknowledged, what did not is handed
/// back, and a handler still running goes on and stores its result for the redelivery.
#[tokio::test(start_paused = true)]
async fn at_the_deadline_unfinished_messages_are_handed_back() {
    let store = MemoryStore::with_clock(TokioClock::new());
    let c = consumer(Arc::new(store)).concurrency(1);
    let fx = Effects::default();
    let gate = Arc::new(Semaphore::new(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let out = c
        .clone()
        .deadline(deadline)
        .process(
            vec![
                msg("a", Act::Ok),
                msg("slow", Act::Wait(gate.clone())),
                msg("c", Act::Ok),
            ],
            fx.handler(),
        )
        .await;
    assert_eq!(names(&out), ["done", "not_processed", "not_processed"]);
    assert_eq!(tokio::time::Instant::now(), deadline);
    gate.add_permits(1);
    let again = idem_test_support::eventually(|| {
        let (c, fx) = (c.clone(), fx.clone());
        async move {
            let out = c.process(vec![msg("slow", Act::Ok)], fx.handler()).await;
            names(&out) == ["replayed"]
        }
    })
    .await;
    assert!(
        again,
        "the handler left running at the deadline stored no result"
    );
    let c_again = c.process(vec![msg("c", Act::Ok)], fx.handler()).await;
    assert_eq!(names(&c_again), ["done"]);
    assert_eq!((fx.count("a"), fx.count("slow"), fx.count("c")), (1, 1, 1));
}

/// Each message's outcome is counted in `idem_messages_total` and each keyed message's engine
/// call is seen by the observer.
#[cfg(feature = "metrics")]
#[test]
fn every_outcome_is_counted_and_observed() {
    use idem::Stage;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let seen: Arc<Mutex<Vec<Stage>>> = Arc::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let log = seen.clone();
            let engine = Idempotency::builder(MemoryStore::new())
                .observer(move |e: &idem::CallEvent<'_>| {
                    if e.stage() != Stage::Claimed {
                        log.lock().unwrap().push(e.stage())
                    }
                })
                .build()
                .unwrap();
            let c = Consumer::new(engine, "metered").unwrap().ordered(true);
            let fx = Effects::default();
            let out = c
                .process(
                    vec![
                        msg("a", Act::Ok),
                        msg("a", Act::Ok),
                        msg("f", Act::Fail).group("g"),
                        msg("later", Act::Ok).group("g"),
                    ],
                    fx.handler(),
                )
                .await;
            assert_eq!(names(&out), ["done", "replayed", "failed", "not_processed"]);
        })
    });
    let mut counted: Vec<(String, u64)> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "idem_messages_total")
        .map(|(k, _, _, v)| {
            let outcome = k
                .key()
                .labels()
                .find(|l| l.key() == "outcome")
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            let DebugValue::Counter(n) = v else {
                panic!("not a counter")
            };
            (outcome, n)
        })
        .collect();
    counted.sort();
    let expected: Vec<(String, u64)> = [
        ("done", 1),
        ("failed", 1),
        ("not_processed", 1),
        ("replayed", 1),
    ]
    .into_iter()
    .map(|(o, n)| (o.to_owned(), n))
    .collect();
    assert_eq!(counted, expected);
    assert_eq!(
        *seen.lock().unwrap(),
        [Stage::Completed, Stage::Replayed, Stage::Released]
    );
}
