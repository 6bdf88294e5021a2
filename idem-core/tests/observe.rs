//! What operators see: the metrics, the observer's events and the tracing span of guarded calls,
//! checked against storms and failures whose outcomes are known exactly.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{
    CallEvent, Error, Idempotency, Key, MemoryStore, OnLocked, Stage, Store,
    DEFAULT_LATENCIES_ONE_IN,
};
use idem_sql::SqliteStore;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

const KEYS: usize = 20;
const CALLS: usize = 1_000;

/// Runs `body` on a current-thread runtime with `recorder` as this thread's metrics recorder, so
/// every metric of every task lands in it.
fn with_recorder<F: Future>(recorder: &DebuggingRecorder, body: impl FnOnce() -> F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(recorder, || runtime.block_on(body()))
}

/// The metrics recorded so far, by name and sorted labels; counters and gauges as their value,
/// histograms as how many samples they hold.
fn snapshot(recorder: &DebuggingRecorder) -> BTreeMap<String, f64> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let value = match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => n as f64,
                (MetricKind::Gauge, DebugValue::Gauge(g)) => g.into_inner(),
                (MetricKind::Histogram, DebugValue::Histogram(h)) => h.len() as f64,
                other => panic!("unexpected metric {name}: {other:?}"),
            };
            (name, value)
        })
        .collect()
}

/// An observer that keeps the stages it saw, in order.
fn stages() -> (
    Arc<Mutex<Vec<Stage>>>,
    impl Fn(&CallEvent<'_>) + Send + Sync + 'static,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    (seen, move |event: &CallEvent<'_>| {
        log.lock().unwrap().push(event.stage())
    })
}

fn count(seen: &Mutex<Vec<Stage>>, stage: Stage) -> usize {
    seen.lock().unwrap().iter().filter(|s| **s == stage).count()
}

/// The storm's lease and how long a duplicate waits for it.
const STORM_PATIENCE: Duration = Duration::from_secs(600);

/// 1,000 calls over 20 keys at once, every duplicate waiting for the first: exactly 20 run and
/// 980 replay, and every metric says so.
///
/// The lease and the wait are far longer than the storm takes on any machine: on a loaded one,
/// the DynamoDB server (moto, one Python process) once answered a completion more than the
/// default 30 s lease after its claim, behind the waiters' polls, so the lease ended, a waiter
/// took the key over and ran the work again (as it should), and the counts were not the ones
/// this test is about.
async fn storm(store: Arc<dyn Store>) -> Arc<Mutex<Vec<Stage>>> {
    let (seen, observer) = stages();
    // Every call's latencies, so the histograms' counts are exact too.
    let engine = Idempotency::builder(store)
        .observer(observer)
        .sample_latencies(1)
        .lease(STORM_PATIENCE)
        .build()
        .unwrap();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..CALLS {
        let engine = engine.clone();
        calls.spawn(async move {
            let key = Key::derive("storm", "", &format!("k{}", i % KEYS)).unwrap();
            engine
                .call(key)
                .scope("storm")
                .on_locked(OnLocked::Wait {
                    timeout: STORM_PATIENCE,
                })
                .run(async {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok::<_, Error>(i)
                })
                .await
                .unwrap();
        });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap();
    }
    seen
}

fn assert_storm(recorder: &DebuggingRecorder, seen: &Mutex<Vec<Stage>>) {
    let metrics = snapshot(recorder);
    let expected: BTreeMap<String, f64> = [
        (
            "idem_calls_total{outcome=completed,scope=storm}",
            KEYS as f64,
        ),
        (
            "idem_calls_total{outcome=replayed,scope=storm}",
            (CALLS - KEYS) as f64,
        ),
        ("idem_claim_seconds{scope=storm}", CALLS as f64),
        ("idem_work_seconds{scope=storm}", KEYS as f64),
        ("idem_complete_seconds{scope=storm}", KEYS as f64),
        ("idem_claims_in_flight{scope=storm}", 0.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(metrics, expected);
    assert_eq!(count(seen, Stage::Claimed), KEYS);
    assert_eq!(count(seen, Stage::Completed), KEYS);
    assert_eq!(count(seen, Stage::Replayed), CALLS - KEYS);
    assert_eq!(seen.lock().unwrap().len(), CALLS + KEYS);
}

#[test]
fn memory_storm_metrics_are_exact() {
    let recorder = DebuggingRecorder::new();
    let seen = with_recorder(&recorder, || storm(Arc::new(MemoryStore::new())));
    assert_storm(&recorder, &seen);
}

#[test]
fn sqlite_storm_metrics_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = DebuggingRecorder::new();
    let seen = with_recorder(&recorder, || async {
        let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
        storm(Arc::new(store)).await
    });
    assert_storm(&recorder, &seen);
}

#[test]
fn postgres_storm_metrics_are_exact() {
    let Some(url) = idem_test_support::postgres::pg_url("postgres_storm_metrics_are_exact") else {
        return;
    };
    let recorder = DebuggingRecorder::new();
    let seen = with_recorder(&recorder, || async {
        let store = idem_test_support::postgres::fresh_store(&url, |b| b).await;
        let seen = storm(Arc::new(store.clone())).await;
        idem_test_support::postgres::drop_store_tables(&store).await;
        seen
    });
    assert_storm(&recorder, &seen);
}

/// The same storm on one Redis server and on the 3-master cluster, as `scripts/test` starts
/// them (skipped unless idem-test-support has its feature `redis`: --workspace --all-features).
#[test]
fn redis_storm_metrics_are_exact() {
    for cluster in [false, true] {
        let recorder = DebuggingRecorder::new();
        let seen = with_recorder(&recorder, || async {
            let (store, _nothing_left) = if cluster {
                idem_test_support::stores::redis_cluster().await?
            } else {
                idem_test_support::stores::redis_single().await?
            };
            Some(storm(store).await)
        });
        let Some(seen) = seen else { return };
        assert_storm(&recorder, &seen);
    }
}

/// The same storm on the DynamoDB-compatible server `scripts/test` starts (skipped unless
/// idem-test-support has its feature `dynamodb`: --workspace --all-features).
#[test]
fn dynamodb_storm_metrics_are_exact() {
    let recorder = DebuggingRecorder::new();
    let seen = with_recorder(&recorder, || async {
        let (store, leftover) = idem_test_support::stores::dynamodb().await?;
        let seen = storm(store).await;
        leftover.remove().await;
        Some(seen)
    });
    let Some(seen) = seen else { return };
    assert_storm(&recorder, &seen);
}

/// Each outcome once, on purpose: locked, key reused, released, not retained (and its retry),
/// lease lost, cancelled. Each is counted under its own label and reported to the observer.
#[test]
fn every_outcome_is_counted_once() {
    let recorder = DebuggingRecorder::new();
    let (seen, observer) = stages();
    with_recorder(&recorder, || async {
        let store = Arc::new(MemoryStore::new());
        let engine = Idempotency::builder(store.clone())
            .observer(observer)
            .max_response_bytes(64)
            .build()
            .unwrap();
        let key = |k: &str| Key::derive("outcomes", "", k).unwrap();
        let call = |k: &str| engine.call(key(k)).scope("outcomes");

        // locked: a call holds the key while another fails fast.
        let (hold, release) = tokio::sync::oneshot::channel::<()>();
        let holder = call("held").run(async {
            let _ = release.await;
            Ok::<_, Error>(1)
        });
        let locked = async {
            tokio::task::yield_now().await;
            let out = call("held").run(async { Ok::<_, Error>(2) }).await;
            assert!(matches!(out, Err(Error::Locked { .. })));
            hold.send(()).unwrap();
        };
        let (held, ()) = tokio::join!(holder, locked);
        held.unwrap();

        // key reused: same key, another fingerprint.
        let fp = |v: u32| idem_core::Fingerprint::of_json(&v).unwrap();
        call("fp")
            .fingerprint(fp(1))
            .run(async { Ok::<_, Error>(1) })
            .await
            .unwrap();
        let reused = call("fp")
            .fingerprint(fp(2))
            .run(async { Ok::<_, Error>(2) });
        assert!(matches!(reused.await, Err(Error::KeyReused)));

        // released: the work fails.
        let failed = call("fails").run(async { Err::<u32, _>(Error::InvalidConfig("no".into())) });
        assert!(failed.await.is_err());

        // not retained, then its retry.
        call("big")
            .run(async { Ok::<_, Error>("x".repeat(100)) })
            .await
            .unwrap();
        let retry = call("big").run(async { Ok::<_, Error>(String::new()) });
        assert!(matches!(retry.await, Err(Error::ResultNotRetained { .. })));

        // lease lost: the record is evicted while the work runs.
        let evicting = store.clone();
        let lost = call("evicted").run(async move {
            evicting.evict(&key("evicted")).await.unwrap();
            Ok::<_, Error>(1)
        });
        assert!(matches!(lost.await, Err(Error::LeaseLost)));

        // cancelled: the caller goes away while the work runs.
        let cancelled = tokio::time::timeout(
            Duration::from_millis(10),
            call("cancelled").run(std::future::pending::<Result<u32, Error>>()),
        );
        assert!(cancelled.await.is_err());
    });
    let metrics = snapshot(&recorder);
    let calls: BTreeMap<&str, f64> = metrics
        .iter()
        .filter_map(|(k, v)| {
            let outcome = k.strip_prefix("idem_calls_total{outcome=")?;
            Some((outcome.strip_suffix(",scope=outcomes}")?, *v))
        })
        .collect();
    let expected: BTreeMap<&str, f64> = [
        ("cancelled", 1.0),
        ("completed", 2.0), // "held" and the first "fp"
        ("key_reused", 1.0),
        ("lease_lost", 1.0),
        ("locked", 1.0),
        ("not_retained", 2.0), // the oversized result and its retry
        ("released", 1.0),
    ]
    .into_iter()
    .collect();
    assert_eq!(calls, expected);
    assert_eq!(metrics["idem_claims_in_flight{scope=outcomes}"], 0.0);
    for (stage, n) in [
        (Stage::Claimed, 6),
        (Stage::Completed, 2),
        (Stage::Locked, 1),
        (Stage::KeyReused, 1),
        (Stage::Released, 1),
        (Stage::NotRetained, 2),
        (Stage::LeaseLost, 1),
        (Stage::Cancelled, 1),
    ] {
        assert_eq!(count(&seen, stage), n, "{stage}");
    }
}

/// By default one call in [`DEFAULT_LATENCIES_ONE_IN`] records its latencies, drawn at random:
/// the counters still count every call, a fresh call records its work and its completion
/// together or not at all, and the histograms hold about one call's samples in sixteen. (The draw comes
/// from this thread's generator, seeded here, and every call runs on this thread: the counts are
/// the same on every run.)
#[test]
fn latencies_are_sampled_by_default_and_counts_are_not() {
    const N: usize = 800;
    let recorder = DebuggingRecorder::new();
    with_recorder(&recorder, || async {
        fastrand::seed(7);
        let engine = Idempotency::new(MemoryStore::new());
        for i in 0..N {
            let key = Key::derive("sampled", "", &i.to_string()).unwrap();
            for _ in 0..2 {
                engine
                    .call(key)
                    .scope("sampled")
                    .run(async { Ok::<_, Error>(i) })
                    .await
                    .unwrap();
            }
        }
    });
    let metrics = snapshot(&recorder);
    assert_eq!(
        metrics["idem_calls_total{outcome=completed,scope=sampled}"],
        N as f64
    );
    assert_eq!(
        metrics["idem_calls_total{outcome=replayed,scope=sampled}"],
        N as f64
    );
    assert_eq!(metrics["idem_claims_in_flight{scope=sampled}"], 0.0);
    let (claim, work, complete) = (
        metrics["idem_claim_seconds{scope=sampled}"],
        metrics["idem_work_seconds{scope=sampled}"],
        metrics["idem_complete_seconds{scope=sampled}"],
    );
    assert_eq!(work, complete, "a fresh call records both or neither");
    let expected = (2 * N) as f64 / f64::from(DEFAULT_LATENCIES_ONE_IN);
    // About one call in eight: 200 of 1,600 expected, σ ≈ 13; the bounds are 5 σ wide.
    assert!(
        (claim - expected).abs() < 70.0,
        "{claim} claim samples, expected about {expected}"
    );
    assert!(work > 0.0 && work < claim, "{work} work samples of {claim}");
}

/// Each call's metrics land in the instruments its own engine registered for its scope, whatever
/// the thread ran before. A thread keeps the instruments it used last (four pairs of engine and
/// scope), so that a call touches no lock or count shared with other threads; two engines taking
/// turns over six scopes on one thread go through that cache's hits, misses and evictions. Each
/// engine registered its scopes under a recorder of its own, so a count that went to the other
/// engine's instruments (or to another scope's) shows in the wrong recorder or label.
#[test]
fn each_engine_and_scope_count_into_their_own_instruments() {
    const SCOPES: [&str; 6] = ["s0", "s1", "s2", "s3", "s4", "s5"];
    const ROUNDS: usize = 5;
    let recorders = [DebuggingRecorder::new(), DebuggingRecorder::new()];
    let engines = [
        Idempotency::new(MemoryStore::new()),
        Idempotency::new(MemoryStore::new()),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let call = |engine: usize, scope: &'static str, n: usize| {
        let engine = &engines[engine];
        async move {
            let key = Key::derive(scope, "", &format!("{n}")).unwrap();
            engine
                .call(key)
                .scope(scope)
                .run(async { Ok::<_, Error>(n) })
                .await
                .unwrap();
        }
    };
    // Each engine's first call of each scope, under its own recorder, registers its instruments.
    for (e, recorder) in recorders.iter().enumerate() {
        metrics::with_local_recorder(recorder, || {
            runtime.block_on(async {
                for scope in SCOPES {
                    call(e, scope, 0).await;
                }
            })
        });
    }
    // Then, with no recorder installed, the two engines take turns over every scope.
    runtime.block_on(async {
        for round in 1..=ROUNDS {
            for scope in SCOPES {
                for e in 0..2 {
                    call(e, scope, round * 10 + e).await;
                }
            }
        }
    });
    for recorder in &recorders {
        let metrics = snapshot(recorder);
        for scope in SCOPES {
            assert_eq!(
                metrics[&format!("idem_calls_total{{outcome=completed,scope={scope}}}")],
                (1 + ROUNDS) as f64,
                "{metrics:?}"
            );
            assert_eq!(
                metrics[&format!("idem_claims_in_flight{{scope={scope}}}")],
                0.0
            );
        }
    }
}

/// `sample_latencies(1)` times every call; `0` is refused before anything is recorded.
#[test]
fn sampling_every_call_and_refusing_zero() {
    let refused = Idempotency::builder(MemoryStore::new())
        .sample_latencies(0)
        .build();
    match refused {
        Err(Error::InvalidConfig(why)) => assert!(why.contains("sample_latencies"), "{why}"),
        other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
    }
    let recorder = DebuggingRecorder::new();
    with_recorder(&recorder, || async {
        let engine = Idempotency::builder(MemoryStore::new())
            .sample_latencies(1)
            .build()
            .unwrap();
        for i in 0..10 {
            let key = Key::derive("every", "", &i.to_string()).unwrap();
            engine
                .call(key)
                .scope("every")
                .run(async { Ok::<_, Error>(i) })
                .await
                .unwrap();
        }
    });
    let metrics = snapshot(&recorder);
    assert_eq!(metrics["idem_claim_seconds{scope=every}"], 10.0);
    assert_eq!(metrics["idem_work_seconds{scope=every}"], 10.0);
    assert_eq!(metrics["idem_complete_seconds{scope=every}"], 10.0);
}

/// The pruner counts what it deletes under `idem_pruned_total{target="records"}`.
#[test]
fn pruner_deletions_are_counted() {
    let recorder = DebuggingRecorder::new();
    let report = with_recorder(&recorder, || async {
        let clock = idem_core::ManualClock::new();
        let store = Arc::new(MemoryStore::with_clock(clock.clone()));
        let engine = Idempotency::builder(store.clone())
            .retention(Duration::from_secs(1))
            .build()
            .unwrap();
        for i in 0..25 {
            let key = Key::derive("prune", "", &i.to_string()).unwrap();
            engine
                .call(key)
                .run(async { Ok::<_, Error>(i) })
                .await
                .unwrap();
        }
        clock.advance(Duration::from_secs(2));
        let config = idem_core::PrunerConfig::new()
            .batch_size(10)
            .pause(Duration::ZERO)
            .without_lease();
        idem_core::Pruner::records(store, config)
            .unwrap()
            .run_once()
            .await
            .unwrap()
    });
    assert_eq!(report.deleted, 25);
    assert_eq!(
        snapshot(&recorder)["idem_pruned_total{target=records}"],
        25.0
    );
}

/// The dispatcher counts what it publishes and what fails under its lease name, and sets its
/// lag gauge.
#[test]
fn dispatcher_runs_are_counted() {
    use idem_core::{
        ChannelPublisher, Dispatcher, DispatcherConfig, MemoryOutbox, MessageId, OutboxMessage,
    };
    let recorder = DebuggingRecorder::new();
    let report = with_recorder(&recorder, || async {
        let outbox = Arc::new(MemoryOutbox::new());
        for i in 0..7 {
            let key = Key::derive("orders", "", &i.to_string()).unwrap();
            let id = MessageId::derive(&key, "placed");
            outbox.add(OutboxMessage::new(id, "order", i.to_string(), "placed", vec![]).unwrap());
        }
        let (publisher, _received) = ChannelPublisher::new(16);
        let dispatcher = Dispatcher::new(
            Arc::new(MemoryStore::new()),
            outbox,
            Arc::new(publisher),
            DispatcherConfig::new().name("orders"),
        )
        .unwrap();
        dispatcher.run_once().await.unwrap()
    });
    assert_eq!(report.published, 7);
    let metrics = snapshot(&recorder);
    assert_eq!(metrics["idem_outbox_published_total{outbox=orders}"], 7.0);
    assert_eq!(metrics["idem_outbox_failed_total{outbox=orders}"], 0.0);
    assert!(metrics.contains_key("idem_outbox_lag_seconds{outbox=orders}"));
}

/// `idem_claims_in_flight` counts a claim whose work is awaiting something, from its first
/// pending poll until the call ends (stored, or dropped by its caller); work done in its first
/// poll never moves it. Whatever happens, it is back at 0 when the calls are over.
#[test]
fn the_in_flight_gauge_counts_work_that_awaits() {
    let recorder = DebuggingRecorder::new();
    // A snapshot takes the gauge's value and leaves 0 in its place: the gauge is the sum of
    // what the snapshots took.
    let taken = std::cell::Cell::new(0.0);
    let gauge = |recorder: &DebuggingRecorder| {
        let now = snapshot(recorder)
            .get("idem_claims_in_flight{scope=gauge}")
            .copied()
            .unwrap_or(0.0);
        taken.set(taken.get() + now);
        taken.get()
    };
    with_recorder(&recorder, || async {
        let engine = Idempotency::new(MemoryStore::new());
        let key = |k: &str| Key::derive("gauge", "", k).unwrap();
        // Work done in its first poll: the gauge never moves, not even while it runs.
        let seen_inside = engine
            .call(key("instant"))
            .scope("gauge")
            .run(async { Ok::<_, Error>(gauge(&recorder)) })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(seen_inside, 0.0, "work done in one poll is not counted");
        assert_eq!(gauge(&recorder), 0.0);

        // Work that awaits: 1 while it waits, 0 once it is stored.
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let call = engine.call(key("awaits")).scope("gauge").run(async {
            wait.await.unwrap();
            Ok::<_, Error>(2)
        });
        let mut call = std::pin::pin!(call);
        assert!(futures_poll_once(call.as_mut()).await.is_none());
        assert_eq!(gauge(&recorder), 1.0, "pending work is in flight");
        release.send(()).unwrap();
        assert_eq!(call.await.unwrap().into_inner(), 2);
        assert_eq!(gauge(&recorder), 0.0);

        // Work whose caller goes away while it waits: the call ends cancelled, the gauge
        // comes back down.
        let call = engine
            .call(key("dropped"))
            .scope("gauge")
            .run(std::future::pending::<Result<u32, Error>>());
        let mut call = Box::pin(call);
        assert!(futures_poll_once(call.as_mut()).await.is_none());
        assert_eq!(gauge(&recorder), 1.0);
        drop(call);
        assert_eq!(gauge(&recorder), 0.0, "a dropped call lowers it");
    });
    assert_eq!(gauge(&recorder), 0.0);
}

/// Polls `fut` once: its output if it is ready.
async fn futures_poll_once<F: Future + ?Sized>(fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
    let mut fut = fut;
    match std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await {
        std::task::Poll::Ready(out) => Some(out),
        std::task::Poll::Pending => None,
    }
}
