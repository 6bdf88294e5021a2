//! Which task does what: the whole call (the claim, the handler, the storing of its response, or a
//! replay, a `409`, a refusal) runs in the request's own task while the request is there; a
//! request dropped after it won its claim hands the rest to a task of its own, where the handler
//! runs on and its response is stored, out of the connection's reach.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use idem::http::{IdempotencyLayer, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use idem::{CallEvent, Idempotency, MemoryStore, Stage};
use tokio::sync::mpsc::unbounded_channel;
use tokio::sync::Semaphore;
use tokio::task::Id;
use tower::{Layer, ServiceExt};

/// What happened, in which task: observer events by stage, and the handler's runs.
#[derive(Default)]
struct Seen {
    events: Vec<(Stage, Option<Id>)>,
    handler: Vec<Option<Id>>,
}

/// How long any one awaited event may take before the test fails instead of hanging.
const BOUND: Duration = Duration::from_secs(30);

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_task_runs_the_call_until_it_is_dropped() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    let engine = Idempotency::builder(MemoryStore::new())
        .observer(move |event: &CallEvent<'_>| {
            lock(&log)
                .events
                .push((event.stage(), tokio::task::try_id()));
        })
        .build()
        .unwrap();
    let ran = seen.clone();
    let gate = Arc::new(Semaphore::new(0));
    let (entered_tx, mut entered) = unbounded_channel::<()>();
    let held = (seen.clone(), gate.clone());
    let app = Router::new()
        .route(
            "/payments",
            post(move || {
                let ran = ran.clone();
                async move {
                    lock(&ran).handler.push(tokio::task::try_id());
                    "paid"
                }
            }),
        )
        .route(
            "/held",
            post(move || {
                let (ran, gate, entered) = (held.0.clone(), held.1.clone(), entered_tx.clone());
                async move {
                    let _ = entered.send(());
                    gate.acquire().await.unwrap().forget();
                    lock(&ran).handler.push(tokio::task::try_id());
                    "held"
                }
            }),
        );
    let service = IdempotencyLayer::builder(engine)
        .shared_key_space()
        .build()
        .unwrap()
        .layer(app);

    // Each request is sent from a task of its own, whose id is the request's task.
    let send = |path: &'static str, key: &'static str| {
        let service = service.clone();
        tokio::spawn(async move {
            let request = Request::post(path)
                .header(IDEMPOTENCY_KEY, key)
                .body(Body::empty())
                .unwrap();
            let response = service.oneshot(request).await.unwrap();
            let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
            (tokio::task::id(), response.status(), replayed)
        })
    };

    let (first, status, replayed) = send("/payments", "\"payment-1\"").await.unwrap();
    assert_eq!((status, replayed), (StatusCode::OK, false));
    {
        let seen = lock(&seen);
        // The claim, the handler and the completion all in the request's task: no task spawned,
        // no other worker woken.
        assert_eq!(
            seen.events[..],
            [
                (Stage::Claimed, Some(first)),
                (Stage::Completed, Some(first))
            ]
        );
        assert_eq!(seen.handler, [Some(first)]);
    }

    let (second, status, replayed) = send("/payments", "\"payment-1\"").await.unwrap();
    assert_eq!((status, replayed), (StatusCode::OK, true));
    {
        let seen = lock(&seen);
        // The replay was answered in the request's own task, and the handler did not run again.
        assert_eq!(seen.events[2..], [(Stage::Replayed, Some(second))]);
        assert_eq!(seen.handler.len(), 1);
    }

    // A request dropped while its handler runs: the rest goes on in a task of its own.
    let dropped = send("/held", "\"payment-2\"");
    let dropped_id = dropped.id();
    tokio::time::timeout(BOUND, entered.recv())
        .await
        .expect("the held handler to start");
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    let completed = tokio::time::timeout(BOUND, async {
        loop {
            if let Some(&(_, task)) = lock(&seen).events[3..]
                .iter()
                .find(|(stage, _)| *stage == Stage::Completed)
            {
                return task;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the dropped request's response to be stored");
    let seen = lock(&seen);
    assert_eq!(seen.events[3], (Stage::Claimed, Some(dropped_id)));
    assert!(completed.is_some() && completed != Some(dropped_id));
    assert_eq!(seen.handler[1..], [completed], "the handler ran on, once");
}
