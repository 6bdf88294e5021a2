//! What `LayerBuilder::build` refuses, before any request: no store or server needed.

use axum::http::{HeaderValue, StatusCode};
use idem::http::{IdempotencyLayer, LayerBuilder, ReplayHeaders};
use idem::{Error, Idempotency, MemoryStore};

use crate::server::{LayerServer, Server};

fn engine() -> Idempotency {
    Idempotency::new(MemoryStore::new())
}

/// The message of the `InvalidConfig` error that `builder` must build to.
fn refused(builder: LayerBuilder) -> String {
    match builder.build() {
        Err(Error::InvalidConfig(message)) => message,
        other => panic!("expected Error::InvalidConfig, got {other:?}"),
    }
}

#[test]
fn a_layer_must_choose_how_keys_are_scoped() {
    // Neither a caller extractor nor the opt-in: refused, naming both ways out.
    let message = refused(IdempotencyLayer::builder(engine()).require_key(true));
    assert!(message.contains(".caller("), "{message}");
    assert!(message.contains(".shared_key_space()"), "{message}");
    // Both: refused too, since one of them would be ignored.
    let message = refused(Server::builder(engine()).shared_key_space());
    assert!(message.contains("both"), "{message}");
    // Either one alone builds.
    assert!(Server::builder(engine()).build().is_ok());
    assert!(IdempotencyLayer::builder(engine())
        .shared_key_space()
        .build()
        .is_ok());
}

#[test]
fn caller_missing_status_is_401_or_400() {
    for status in [StatusCode::UNAUTHORIZED, StatusCode::BAD_REQUEST] {
        assert!(Server::builder(engine())
            .caller_missing_status(status)
            .build()
            .is_ok());
    }
    let message = refused(Server::builder(engine()).caller_missing_status(StatusCode::FORBIDDEN));
    assert!(message.contains("403"), "{message}");
    let challenge = HeaderValue::from_static("Bearer realm=\"api\"");
    assert!(Server::builder(engine())
        .www_authenticate(challenge.clone())
        .build()
        .is_ok());
    let message = refused(
        Server::builder(engine())
            .caller_missing_status(StatusCode::BAD_REQUEST)
            .www_authenticate(challenge),
    );
    assert!(message.contains("www_authenticate"), "{message}");
}

#[test]
fn problem_base_is_an_absolute_web_address() {
    for good in [
        "https://api.example.com/docs/idempotency",
        "http://localhost:8080/idempotency.html",
        "https://api.example.com/docs?page=idempotency",
    ] {
        let built = Server::builder(engine()).problem_base(good).build();
        assert!(built.is_ok(), "{good}: {built:?}");
    }
    for bad in [
        "",
        "/docs/idempotency",
        "docs/idempotency",
        "urn:example:idempotency",
        "ftp://example.com/idempotency",
        "https://api.example.com/docs#idempotency",
        "https://api.example.com/docs idempotency",
        "https://api.example.com/docs>; rel=\"next\"",
        "https://api.example.com/é",
    ] {
        let message = refused(Server::builder(engine()).problem_base(bad));
        assert!(message.contains("problem_base"), "{bad}: {message}");
    }
}

#[test]
fn replay_headers_are_header_names() {
    for good in [
        ReplayHeaders::default(),
        ReplayHeaders::all(),
        ReplayHeaders::allow(Vec::<String>::new()),
        ReplayHeaders::allow(["Content-Type", "location", "X-Payment-Status"]),
        // A hop-by-hop header in a deny list says what the layer does anyway.
        ReplayHeaders::deny(["set-cookie", "Connection"]),
    ] {
        let built = Server::builder(engine())
            .replay_headers(good.clone())
            .build();
        assert!(built.is_ok(), "{good:?}: {built:?}");
    }
    for bad in ["", "x custom", "Set-Cookie: a=1", "x-ünicode", "x-a,x-b"] {
        for rule in [ReplayHeaders::allow([bad]), ReplayHeaders::deny([bad])] {
            let message = refused(Server::builder(engine()).replay_headers(rule));
            assert!(message.contains("replay_headers"), "{bad:?}: {message}");
            assert!(message.contains(&format!("{bad:?}")), "{bad:?}: {message}");
        }
    }
    // An allow list cannot keep a header that is never stored.
    let message = refused(
        Server::builder(engine()).replay_headers(ReplayHeaders::allow(["Transfer-Encoding"])),
    );
    assert!(message.contains("hop-by-hop"), "{message}");
}
