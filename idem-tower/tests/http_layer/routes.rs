//! The layer and axum's `Router`: `.layer(…)` wraps the routes added before it, and a handler
//! on a route added after it that reads the key is told so.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use idem::http::{IdempotencyKey, IdempotencyLayer, Problem};
use idem::{Idempotency, MemoryStore};
use tower::ServiceExt;

#[tokio::test]
async fn a_route_added_after_the_layer_is_unguarded_and_its_key_extractor_says_why() {
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let runs = runs.clone();
        move |key: IdempotencyKey| async move {
            format!(
                "run {} under {key}",
                runs.fetch_add(1, Ordering::SeqCst) + 1
            )
        }
    };
    let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
        .shared_key_space()
        .build()
        .unwrap();
    let app = Router::new()
        .route("/before", post(handler.clone()))
        .layer(layer)
        .route("/after", post(handler));
    let send = |path: &'static str| {
        let request = Request::post(path)
            .header("idempotency-key", "\"k-1\"")
            .body(Body::empty())
            .unwrap();
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            let body = to_bytes(response.into_body(), 64 * 1024).await.unwrap();
            (status, body)
        }
    };

    // Behind the layer: runs once, then replays.
    assert_eq!(
        send("/before").await,
        (StatusCode::OK, "run 1 under k-1".into())
    );
    assert_eq!(
        send("/before").await,
        (StatusCode::OK, "run 1 under k-1".into())
    );

    // Added after `.layer`: no layer checked the key, and the 500 names the cause and the fix.
    let (status, body) = send("/after").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], Problem::KeyUnguarded.type_uri());
    assert_eq!(problem["status"], 500);
    let detail = problem["detail"].as_str().unwrap();
    for says in [
        "the route is not behind the idempotency layer",
        "a route added to the Router after .layer(…) is not wrapped by it",
        "add the route before calling .layer",
        "the layer does not guard this method",
    ] {
        assert!(detail.contains(says), "{says:?} not in {detail:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
