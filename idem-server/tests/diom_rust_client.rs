//! Diom's published Rust client (crates.io `diom` 0.2.6, unchanged) against idem-server on
//! SQLite: start, locked, complete, replay with context, abort, expiry, namespaces, errors, and
//! the fenced extension's answers parsed by the client's own models.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use common::{call, json, serve, Server, ADMIN, ALICE, BOB};
use diom::models::{
    IdempotencyAbortIn, IdempotencyCompleteIn, IdempotencyConfigureNamespaceIn,
    IdempotencyConfigureNamespaceOut, IdempotencyGetNamespaceIn, IdempotencyGetNamespaceOut,
    IdempotencyStartIn, IdempotencyStartOut,
};
use diom::{DiomClient, DiomOptions, ErrorKind};
use idem_server::Config;
use serde_json::json as j;

fn client(server: &Server, token: &str) -> DiomClient {
    DiomClient::new(
        token.to_owned(),
        Some(DiomOptions {
            server_url: Some(server.url.clone()),
            num_retries: Some(0),
            ..DiomOptions::default()
        }),
    )
}

fn lock(ms: u64) -> IdempotencyStartIn {
    IdempotencyStartIn::new(Duration::from_millis(ms))
}

/// Configures the namespace `name` as `client`.
async fn configure(
    client: &DiomClient,
    name: &str,
) -> diom::Result<IdempotencyConfigureNamespaceOut> {
    let input = IdempotencyConfigureNamespaceIn::new(name.to_owned());
    client.idempotency().namespace().configure(input).await
}

/// The namespace `name`, as `client` reads it.
async fn namespace(client: &DiomClient, name: &str) -> diom::Result<IdempotencyGetNamespaceOut> {
    let input = IdempotencyGetNamespaceIn::new(name.to_owned());
    client.idempotency().namespace().get(input).await
}

/// What `start` answered, by its status.
fn status(answer: diom::Result<IdempotencyStartOut>) -> &'static str {
    match answer.unwrap() {
        IdempotencyStartOut::Started => "started",
        IdempotencyStartOut::Locked => "locked",
        IdempotencyStartOut::Completed(_) => "completed",
    }
}

/// The error's class and code, as the client sorts them.
fn class(e: &diom::Error) -> (&'static str, String) {
    match e.kind() {
        ErrorKind::InvalidInput(e) => ("invalid-input", e.code().to_owned()),
        ErrorKind::OperationError(e) => ("operation-error", e.code().to_owned()),
        ErrorKind::ServerError(e) => ("server-error", e.code().to_owned()),
        other => panic!("the client could not read the error: {other:?}"),
    }
}

/// Polls `start` until it answers `started`, for at most five seconds.
async fn started_within(client: &DiomClient, key: &str) -> bool {
    for _ in 0..250 {
        if let IdempotencyStartOut::Started = client
            .idempotency()
            .start(key.to_owned(), lock(10_000))
            .await
            .unwrap()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_locked_complete_and_replay_with_context() {
    let server = serve(Config::default()).await;
    let diom = client(&server, ALICE);
    assert!(diom.health().ping().await.unwrap().ok);
    let idem = diom.idempotency();
    let key = "order-1001".to_owned();
    assert_eq!(
        status(idem.start(key.clone(), lock(15_000)).await),
        "started"
    );
    assert_eq!(
        status(idem.start(key.clone(), lock(15_000)).await),
        "locked"
    );
    let context = HashMap::from([("status_code".to_owned(), "201".to_owned())]);
    idem.complete(
        key.clone(),
        IdempotencyCompleteIn::new(b"\x00charged\xff".to_vec(), Duration::from_secs(3600))
            .with_context(Some(context.clone())),
    )
    .await
    .unwrap();
    for _ in 0..2 {
        let IdempotencyStartOut::Completed(done) =
            idem.start(key.clone(), lock(15_000)).await.unwrap()
        else {
            panic!("not replayed");
        };
        assert_eq!(done.response, b"\x00charged\xff");
        assert_eq!(done.context, Some(context.clone()));
    }
    // A second complete keeps the first response (Diom would overwrite it: docs/server.md).
    idem.complete(
        key.clone(),
        IdempotencyCompleteIn::new(b"other".to_vec(), Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let IdempotencyStartOut::Completed(done) = idem.start(key, lock(15_000)).await.unwrap() else {
        panic!("not replayed");
    };
    assert_eq!(done.response, b"\x00charged\xff");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_frees_the_key_and_keeps_a_completed_response() {
    let server = serve(Config::default()).await;
    let diom = client(&server, ALICE);
    let idem = diom.idempotency();
    let key = "refund-7".to_owned();
    assert_eq!(
        status(idem.start(key.clone(), lock(15_000)).await),
        "started"
    );
    idem.abort(key.clone(), IdempotencyAbortIn::new())
        .await
        .unwrap();
    assert_eq!(
        status(idem.start(key.clone(), lock(15_000)).await),
        "started"
    );
    idem.complete(
        key.clone(),
        IdempotencyCompleteIn::new(b"ok".to_vec(), Duration::from_secs(60)),
    )
    .await
    .unwrap();
    // Diom's abort is documented as releasing the lock; it never deletes a stored response here.
    idem.abort(key.clone(), IdempotencyAbortIn::new())
        .await
        .unwrap();
    assert!(matches!(
        idem.start(key.clone(), lock(15_000)).await.unwrap(),
        IdempotencyStartOut::Completed(_)
    ));
    // Abort of a key nobody holds is accepted, as Diom accepts it.
    idem.abort("never-started".to_owned(), IdempotencyAbortIn::new())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_response_expire() {
    let server = serve(Config::default()).await;
    let diom = client(&server, ALICE);
    let idem = diom.idempotency();
    assert_eq!(
        status(idem.start("crashed".into(), lock(150)).await),
        "started"
    );
    assert_eq!(
        status(idem.start("crashed".into(), lock(150)).await),
        "locked"
    );
    assert!(
        started_within(&diom, "crashed").await,
        "the lock never expired"
    );

    assert_eq!(
        status(idem.start("short".into(), lock(15_000)).await),
        "started"
    );
    idem.complete(
        "short".into(),
        IdempotencyCompleteIn::new(b"r".to_vec(), Duration::from_millis(150)),
    )
    .await
    .unwrap();
    assert!(matches!(
        idem.start("short".into(), lock(15_000)).await.unwrap(),
        IdempotencyStartOut::Completed(_)
    ));
    assert!(
        started_within(&diom, "short").await,
        "the response never expired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_configured_by_the_admin_and_separate_keys() {
    let server = serve(Config::default()).await;
    let admin = client(&server, ADMIN);
    let alice = client(&server, ALICE);
    let in_orders = || lock(15_000).with_namespace(Some("orders".to_owned()));
    let unknown = alice
        .idempotency()
        .start("k".into(), in_orders())
        .await
        .unwrap_err();
    assert_eq!(class(&unknown), ("operation-error", "not_found".to_owned()));

    let made = configure(&admin, "orders").await.unwrap();
    assert_eq!(made.name, "orders");
    let read = namespace(&admin, "orders").await.unwrap();
    assert_eq!(
        (read.name, read.created),
        ("orders".to_owned(), made.created)
    );
    let missing = namespace(&admin, "nope").await.unwrap_err();
    assert_eq!(class(&missing), ("operation-error", "not_found".to_owned()));
    let refused = configure(&alice, "mine").await.unwrap_err();
    assert_eq!(class(&refused), ("operation-error", "forbidden".to_owned()));

    assert_eq!(
        status(alice.idempotency().start("k".into(), in_orders()).await),
        "started"
    );
    // The same key in the default namespace is another key.
    assert_eq!(
        status(alice.idempotency().start("k".into(), lock(15_000)).await),
        "started"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_never_meet_each_others_keys() {
    let server = serve(Config::default()).await;
    let (alice, bob) = (client(&server, ALICE), client(&server, BOB));
    let (alice, bob) = (alice.idempotency(), bob.idempotency());
    assert_eq!(
        status(alice.start("shared".into(), lock(15_000)).await),
        "started"
    );
    assert_eq!(
        status(bob.start("shared".into(), lock(15_000)).await),
        "started"
    );
    bob.complete(
        "shared".into(),
        IdempotencyCompleteIn::new(b"bob's".to_vec(), Duration::from_secs(60)),
    )
    .await
    .unwrap();
    bob.abort("shared".into(), IdempotencyAbortIn::new())
        .await
        .unwrap();
    // Alice's claim is untouched by Bob's complete and abort.
    assert_eq!(
        status(alice.start("shared".into(), lock(15_000)).await),
        "locked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_bad_tokens_are_typed_errors() {
    let server = serve(Config::default()).await;
    let alice = client(&server, ALICE);
    let idem = alice.idempotency();
    let bad_key = idem.start("foo bar".into(), lock(1_000)).await.unwrap_err();
    assert_eq!(
        class(&bad_key),
        ("invalid-input", "invalid_data".to_owned())
    );
    assert!(bad_key.to_string().contains("location=key"), "{bad_key}");
    let zero = idem.start("k".into(), lock(0)).await.unwrap_err();
    assert_eq!(class(&zero), ("invalid-input", "invalid_data".to_owned()));
    assert!(
        zero.to_string().contains("location=lock_period_ms"),
        "{zero}"
    );
    let zero_ttl = idem
        .complete(
            "k".into(),
            IdempotencyCompleteIn::new(vec![], Duration::ZERO),
        )
        .await
        .unwrap_err();
    assert_eq!(
        class(&zero_ttl),
        ("invalid-input", "invalid_data".to_owned())
    );
    assert!(
        zero_ttl.to_string().contains("location=ttl_ms"),
        "{zero_ttl}"
    );
    let stranger = client(&server, "not-a-known-token-at-all");
    let denied = stranger
        .idempotency()
        .start("k".into(), lock(1_000))
        .await
        .unwrap_err();
    assert_eq!(
        class(&denied),
        ("operation-error", "invalid_token".to_owned())
    );
    // Nothing was claimed by any of them.
    assert_eq!(status(idem.start("k".into(), lock(1_000)).await), "started");
}

/// The fenced extension's answers, read by the Diom client's own models in both encodings:
/// its extra fields never stop them from parsing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_answers_parse_with_diom_models() {
    let server = serve(Config::default()).await;
    let start = |key: &str| {
        json(
            "/api/v1.idempotency.start",
            Some(ALICE),
            j!({"key": key, "lock_period_ms": 15000, "fenced": true, "fingerprint": "POST /charge {\"amount\":42}"}),
        )
    };
    let (status, _, body) = call(&server.app, start("fenced")).await;
    assert_eq!(status, 200);
    let started: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(started["status"], "started");
    assert_eq!(started["token"].as_str().unwrap().len(), 32);
    let parsed: IdempotencyStartOut = serde_json::from_slice(&body).unwrap();
    assert!(matches!(parsed, IdempotencyStartOut::Started));

    let (_, _, body) = call(&server.app, start("fenced")).await;
    let locked: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(locked["status"], "locked");
    assert!(locked["retry_after_ms"].as_u64().unwrap() >= 1);
    assert!(matches!(
        serde_json::from_slice::<IdempotencyStartOut>(&body).unwrap(),
        IdempotencyStartOut::Locked
    ));

    // The same in MessagePack, as the client asks for it.
    let msgpack = Request::post("/api/v1.idempotency.start")
        .header("content-type", "application/msgpack")
        .header("accept", "application/msgpack")
        .header("authorization", format!("Bearer {ALICE}"))
        .body(Body::from(
            rmp_serde::to_vec_named(
                &j!({"key": "fenced-mp", "lock_period_ms": 15000, "fenced": true}),
            )
            .unwrap(),
        ))
        .unwrap();
    let (status, content_type, body) = call(&server.app, msgpack).await;
    assert_eq!(
        (status, content_type.as_str()),
        (200, "application/msgpack")
    );
    assert!(matches!(
        rmp_serde::from_slice::<IdempotencyStartOut>(&body).unwrap(),
        IdempotencyStartOut::Started
    ));

    // A namespace with the fenced flag reads as a Diom namespace.
    let (status, _, body) = call(
        &server.app,
        json(
            "/api/v1.idempotency.namespace.configure",
            Some(ADMIN),
            j!({"name": "strict", "require_token": true}),
        ),
    )
    .await;
    assert_eq!(status, 200);
    let ns: diom::models::IdempotencyConfigureNamespaceOut = serde_json::from_slice(&body).unwrap();
    assert_eq!(ns.name, "strict");
}
