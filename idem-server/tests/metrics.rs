//! `/metrics`: what the server and its engine count. A test binary of its own, because the
//! Prometheus recorder is process-wide: beside other tests it would count their requests too.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use common::{call, json, tokens, ALICE};
use idem_core::MemoryStore;
use idem_server::{App, Config};
use serde_json::json as j;

#[tokio::test]
async fn metrics_count_requests_and_the_engines_calls() {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let app = App::new(
        Arc::new(MemoryStore::new()),
        tokens(),
        Config::default(),
        Some(handle),
    )
    .unwrap();
    let (status, _, _) = call(
        &app,
        json(
            "/api/v1.idempotency.start",
            Some(ALICE),
            j!({"key": "m", "lock_period_ms": 1000}),
        ),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, body) = call(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains("idem_server_requests_total{route=\"start\",status=\"200\"} 1"),
        "{text}"
    );
    // A split call is in flight from its claim until its complete or abort.
    assert!(
        text.contains("idem_claims_in_flight{scope=\"default\"} 1"),
        "{text}"
    );
}
