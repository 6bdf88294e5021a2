//! Which task does what: the claim (and so a replay, a `409`, a refusal) runs in the request's
//! own task; only a request that won its claim spawns one, where the handler runs and its
//! response is stored, out of the connection's reach.

use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use idem_core::http::{IdempotencyLayer, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use idem_core::{Event, Idempotency, MemoryStore, Stage};
use tokio::task::Id;
use tower::{Layer, ServiceExt};

/// What happened, in which task: observer events by stage, and the handler's runs.
#[derive(Default)]
struct Seen {
    events: Vec<(Stage, Option<Id>)>,
    handler: Vec<Option<Id>>,
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_won_claim_gets_a_task_of_its_own() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    let engine = Idempotency::builder(MemoryStore::new())
        .observer(move |event: &Event<'_>| {
            lock(&log)
                .events
                .push((event.stage(), tokio::task::try_id()));
        })
        .build()
        .unwrap();
    let ran = seen.clone();
    let app = Router::new().route(
        "/payments",
        post(move || {
            let ran = ran.clone();
            async move {
                lock(&ran).handler.push(tokio::task::try_id());
                "paid"
            }
        }),
    );
    let service = IdempotencyLayer::builder(engine)
        .shared_key_space()
        .build()
        .unwrap()
        .layer(app);

    // Each request is sent from a task of its own, whose id is the request's task.
    let send = || {
        let service = service.clone();
        tokio::spawn(async move {
            let request = Request::post("/payments")
                .header(IDEMPOTENCY_KEY, "\"payment-1\"")
                .body(Body::empty())
                .unwrap();
            let response = service.oneshot(request).await.unwrap();
            let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
            (tokio::task::id(), response.status(), replayed)
        })
    };

    let (first, status, replayed) = send().await.unwrap();
    assert_eq!((status, replayed), (StatusCode::OK, false));
    let (claimed, completed, handler) = {
        let seen = lock(&seen);
        let [(Stage::Claimed, claimed), (Stage::Completed, completed)] = seen.events[..] else {
            panic!("expected claimed then completed, got {:?}", seen.events);
        };
        (claimed, completed, seen.handler[..].to_vec())
    };
    // The claim in the request's task; the handler and the completion in another, the same one.
    assert_eq!(claimed, Some(first));
    assert_eq!(handler, [completed]);
    assert!(completed.is_some() && completed != Some(first));

    let (second, status, replayed) = send().await.unwrap();
    assert_eq!((status, replayed), (StatusCode::OK, true));
    let seen = lock(&seen);
    // The replay was answered in the request's own task, and the handler did not run again.
    assert_eq!(seen.events[2..], [(Stage::Replayed, Some(second))]);
    assert_eq!(seen.handler.len(), 1);
}
