//! Diom's error bodies, field by field: every invalid input Diom's clients can send (wrong
//! types, missing fields, zero periods, empty, too long and badly spelled keys and namespace
//! names, unknown namespaces, bad or missing tokens, bad content types, bodies that do not
//! parse or are too large), in JSON and in MessagePack, is answered with the status and the
//! body `{type, code, detail, location}` Diom answers it with.
//!
//! Each expected body is written from Diom's source (github.com/svix/diom, the snapshot of
//! 0.2.3 beside the published 0.2.6 clients), cited at each case:
//!
//! - `crates/diom-proto/src/msgpack_or_json.rs` (`MsgPackOrJson::from_request` and
//!   `MsgPackOrJsonRejection::into_response`): the content type, the body's size, and the
//!   decoding through `serde_path_to_error`, whose path is the `location` and whose serde
//!   message (with serde_json's line and column) is the `detail`; serde data errors are `422
//!   invalid_data`, bytes that do not parse `400 invalid_encoding`.
//! - `crates/diom-core/src/types/mod.rs` (`string_wrapper!`): `EntityKey` and `NamespaceName`,
//!   1 to 256 bytes of a pattern, refused with "String too short", "String too long", or
//!   "<Type> must match the following pattern: ^[a-zA-Z0-9\-/_.=+:]+$." (the key's pattern,
//!   for both types).
//! - `crates/diom-core/src/types/non_zero_duration_ms.rs`: periods are serde's `NonZeroU64`.
//! - `src/v1/endpoints/idempotency.rs`: the request types, their fields in this order, and
//!   `ok_or_not_found()` for an unknown namespace (`crates/diom-error/src/lib.rs`,
//!   `Error::entity_not_found`: `400 not_found`, "Entity not found").
//! - `src/core/auth.rs`: `401 auth_required` "`Authorization` header required" and `401
//!   invalid_token` "Invalid token.", before the body is read.
//! - `crates/diom-authorization/src/lib.rs` (`resource_str`) and `src/v1/endpoints/mod.rs`:
//!   `403 forbidden` "You do not have permission to perform `ACTION` on `admin/namespace::NAME`".
//! - `type`: `crates/diom-error/src/lib.rs`, `ErrorType` (invalid input for a missing content
//!   type, a decode error, a value out of range; operation error for a token, an unknown
//!   namespace), which the 0.2.6 clients read (`diom::error::ErrorBody`, Python's
//!   `diom.internal.errors.ErrorBody`, both requiring `type`; Python's `location` too).
//!
//! One departure, measured rather than read: Diom 0.2.6, which both clients speak, answers a
//! MessagePack value serde refuses `422 invalid_data` at its field (issue 40: Diom's Python
//! client got `invalid_data` at `lock_period_ms` for a zero period), where the 0.2.3 source
//! made it `400 invalid_encoding`; MessagePack has no line and column.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use common::{call, tokens, ADMIN, ALICE};
use idem_core::MemoryStore;
use idem_server::{App, Config};
use serde_json::{json, Value};

/// The key's pattern as Diom's messages show it.
const PATTERN: &str = r"must match the following pattern: ^[a-zA-Z0-9\-/_.=+:]+$.";

const CONTENT_TYPE: &str =
    "Expected request with `content-type: application/msgpack` or `content-type: application/json`";

fn app() -> App {
    App::new(
        Arc::new(MemoryStore::new()),
        tokens(),
        Config::default(),
        None,
    )
    .expect("a server over memory")
}

/// A request to `route` with `token`, `content_type` and `body`, answered in the request's
/// encoding (`Accept` set to the content type when it is one of Diom's).
fn request(
    route: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Request<Body> {
    let mut r = Request::post(format!("/api/v1.idempotency.{route}"));
    if let Some(t) = token {
        r = r.header("authorization", format!("Bearer {t}"));
    }
    if let Some(ct) = content_type {
        r = r.header("content-type", ct);
        if ct == "application/msgpack" || ct == "application/json" {
            r = r.header("accept", ct);
        }
    }
    r.body(Body::from(body)).expect("a request")
}

fn json_body(route: &str, body: &str) -> Request<Body> {
    request(
        route,
        Some(ALICE),
        Some("application/json"),
        body.as_bytes().to_vec(),
    )
}

fn msgpack_body(route: &str, body: Value) -> Request<Body> {
    let bytes = rmp_serde::to_vec_named(&body).expect("MessagePack");
    request(route, Some(ALICE), Some("application/msgpack"), bytes)
}

/// Sends `req` and compares the answer with Diom's: the status, and the body's every field
/// (no field more or less), decoded from the encoding the answer says it is in.
async fn diom_answers(
    app: &App,
    req: Request<Body>,
    status: u16,
    kind: &str,
    code: &str,
    detail: &str,
    location: Option<&str>,
) {
    let accept = req
        .headers()
        .get("accept")
        .map(|v| v.to_str().unwrap_or("").to_owned());
    let (got_status, content_type, body) = call(app, req).await;
    let got: Value = match content_type.as_str() {
        "application/msgpack" => rmp_serde::from_slice(&body).expect("a MessagePack body"),
        "application/json" => serde_json::from_slice(&body).expect("a JSON body"),
        other => panic!("an error body in {other:?}"),
    };
    if let Some(accept) = accept {
        assert_eq!(content_type, accept, "the answer's encoding");
    }
    let want = json!({"type": kind, "code": code, "detail": detail, "location": location});
    assert_eq!((got_status, &got), (status, &want), "for {code}: {detail}");
}

/// Diom's own refusals, in JSON: serde_json's words, line and column.
#[tokio::test]
async fn json_bodies_are_refused_as_diom_refuses_them() {
    let app = app();
    // Periods: NonZeroU64 (non_zero_duration_ms.rs), decoded by serde_json (msgpack_or_json.rs:
    // Category::Data is 422 invalid_data at the path).
    for (route, body, detail, location) in [
        (
            "start",
            r#"{"key":"k","lock_period_ms":0}"#,
            "invalid value: integer `0`, expected a nonzero u64 at line 1 column 29",
            "lock_period_ms",
        ),
        (
            "start",
            r#"{"key":"k","lock_period_ms":-1}"#,
            "invalid value: integer `-1`, expected a nonzero u64 at line 1 column 30",
            "lock_period_ms",
        ),
        (
            "start",
            r#"{"key":"k","lock_period_ms":"x"}"#,
            "invalid type: string \"x\", expected a nonzero u64 at line 1 column 31",
            "lock_period_ms",
        ),
        (
            "start",
            r#"{"key":"k","lock_period_ms":1.5}"#,
            "invalid type: floating point `1.5`, expected a nonzero u64 at line 1 column 31",
            "lock_period_ms",
        ),
        (
            "complete",
            r#"{"key":"k","response":[1],"ttl_ms":0}"#,
            "invalid value: integer `0`, expected a nonzero u64 at line 1 column 36",
            "ttl_ms",
        ),
        // Keys and names: string_wrapper! (types/mod.rs); the error is placed where the
        // object's reader stands once the field failed (after the string, or after the `}`
        // when the field was the last).
        (
            "start",
            r#"{"key":"","lock_period_ms":1000}"#,
            "String too short at line 1 column 9",
            "key",
        ),
        (
            "start",
            r#"{"key":"foo bar","lock_period_ms":1000}"#,
            &format!("EntityKey {PATTERN} at line 1 column 16"),
            "key",
        ),
        (
            "abort",
            r#"{"key":"é"}"#,
            &format!("EntityKey {PATTERN} at line 1 column 12"),
            "key",
        ),
        (
            "start",
            r#"{"key":5,"lock_period_ms":1000}"#,
            "invalid type: integer `5`, expected a string at line 1 column 8",
            "key",
        ),
        (
            "start",
            r#"{"namespace":"a:b","key":"k","lock_period_ms":1000}"#,
            &format!("NamespaceName {PATTERN} at line 1 column 18"),
            "namespace",
        ),
        (
            "namespace.configure",
            r#"{"name":""}"#,
            "String too short at line 1 column 11",
            "name",
        ),
        // The response is serde_bytes' byte array; the context a map of strings.
        (
            "complete",
            r#"{"key":"k","response":5,"ttl_ms":1}"#,
            "invalid type: integer `5`, expected byte array at line 1 column 23",
            "response",
        ),
        (
            "complete",
            r#"{"key":"k","response":[1],"context":{"a":1},"ttl_ms":1}"#,
            "invalid type: integer `1`, expected a string at line 1 column 42",
            "context.a",
        ),
        // A missing field: serde's, at the body itself (serde_path_to_error's `.`), in Diom's
        // field order.
        (
            "start",
            r#"{"key":"k"}"#,
            "missing field `lock_period_ms` at line 1 column 11",
            ".",
        ),
        (
            "complete",
            r#"{"key":"k","response":[1]}"#,
            "missing field `ttl_ms` at line 1 column 26",
            ".",
        ),
        ("abort", "{}", "missing field `key` at line 1 column 2", "."),
    ] {
        let req = json_body(route, body);
        diom_answers(
            &app,
            req,
            422,
            "invalid-input",
            "invalid_data",
            detail,
            Some(location),
        )
        .await;
    }
    let long = format!(r#"{{"key":"{}","lock_period_ms":1000}}"#, "k".repeat(257));
    let req = json_body("start", &long);
    let detail = "String too long at line 1 column 266";
    diom_answers(
        &app,
        req,
        422,
        "invalid-input",
        "invalid_data",
        detail,
        Some("key"),
    )
    .await;

    // Bytes that are not JSON (Category::Syntax or Eof): 400 invalid_encoding, no location.
    for (body, detail) in [
        (r#"{"key":"#, "EOF while parsing a value at line 1 column 7"),
        ("key=k", "expected value at line 1 column 1"),
        ("", "EOF while parsing a value at line 1 column 0"),
    ] {
        let req = json_body("start", body);
        diom_answers(
            &app,
            req,
            400,
            "invalid-input",
            "invalid_encoding",
            detail,
            None,
        )
        .await;
    }
}

/// The same refusals in MessagePack, as Diom's clients send every request: serde's words
/// without a line and column.
#[tokio::test]
async fn msgpack_bodies_are_refused_as_diom_refuses_them() {
    let app = app();
    for (route, body, detail, location) in [
        (
            "start",
            json!({"key": "k", "lock_period_ms": 0}),
            "invalid value: integer `0`, expected a nonzero u64".to_owned(),
            "lock_period_ms",
        ),
        (
            "complete",
            json!({"key": "k", "response": [], "ttl_ms": 0}),
            "invalid value: integer `0`, expected a nonzero u64".to_owned(),
            "ttl_ms",
        ),
        (
            "start",
            json!({"key": "foo bar", "lock_period_ms": 1000}),
            format!("EntityKey {PATTERN}"),
            "key",
        ),
        (
            "start",
            json!({"key": "", "lock_period_ms": 1000}),
            "String too short".to_owned(),
            "key",
        ),
        (
            "start",
            json!({"key": "k".repeat(257), "lock_period_ms": 1000}),
            "String too long".to_owned(),
            "key",
        ),
        (
            "start",
            json!({"namespace": "a b", "key": "k", "lock_period_ms": 1000}),
            format!("NamespaceName {PATTERN}"),
            "namespace",
        ),
        (
            "start",
            json!({"key": 5, "lock_period_ms": 1000}),
            "invalid type: integer `5`, expected a string".to_owned(),
            "key",
        ),
        (
            "start",
            json!({"key": "k"}),
            "missing field `lock_period_ms`".to_owned(),
            ".",
        ),
    ] {
        let req = msgpack_body(route, body);
        diom_answers(
            &app,
            req,
            422,
            "invalid-input",
            "invalid_data",
            &detail,
            Some(location),
        )
        .await;
    }
    // Bytes that are not MessagePack: rmp_serde's read errors, 400 invalid_encoding.
    let empty = request(
        "start",
        Some(ALICE),
        Some("application/msgpack"),
        Vec::new(),
    );
    let detail = "IO error while reading marker: failed to fill whole buffer";
    diom_answers(
        &app,
        empty,
        400,
        "invalid-input",
        "invalid_encoding",
        detail,
        None,
    )
    .await;
    // Without `Accept`, a MessagePack request is answered in MessagePack (capture_accept_hdr).
    let no_accept = Request::post("/api/v1.idempotency.start")
        .header("authorization", format!("Bearer {ALICE}"))
        .header("content-type", "application/msgpack")
        .body(Body::from(
            rmp_serde::to_vec_named(&json!({"key": "k", "lock_period_ms": 0})).expect("bytes"),
        ))
        .expect("a request");
    let (status, content_type, _) = call(&app, no_accept).await;
    assert_eq!(
        (status, content_type.as_str()),
        (422, "application/msgpack")
    );
}

/// What Diom refuses before the body: the token (auth.rs), the content type and the size
/// (msgpack_or_json.rs); and after it, an unknown namespace and the admin's routes.
#[tokio::test]
async fn tokens_content_types_sizes_and_namespaces_are_refused_as_diom_refuses_them() {
    let app = app();
    let start = br#"{"key":"k","lock_period_ms":1000}"#.to_vec();
    let json = Some("application/json");
    // No bearer token (none, another scheme): before the content type is looked at.
    for req in [
        request("start", None, None, start.clone()),
        Request::post("/api/v1.idempotency.start")
            .header("authorization", format!("Basic {ALICE}"))
            .header("content-type", "application/json")
            .body(Body::from(start.clone()))
            .expect("a request"),
    ] {
        let detail = "`Authorization` header required";
        diom_answers(
            &app,
            req,
            401,
            "operation-error",
            "auth_required",
            detail,
            None,
        )
        .await;
    }
    let stranger = request(
        "start",
        Some("not-a-token-we-know-0000"),
        json,
        start.clone(),
    );
    diom_answers(
        &app,
        stranger,
        401,
        "operation-error",
        "invalid_token",
        "Invalid token.",
        None,
    )
    .await;
    // The content type, before the body is read.
    let none = request("start", Some(ALICE), None, start.clone());
    diom_answers(
        &app,
        none,
        400,
        "invalid-input",
        "missing_content_type",
        CONTENT_TYPE,
        None,
    )
    .await;
    for other in [
        "text/plain",
        "application/x-msgpack",
        "application/xml",
        "nonsense",
    ] {
        let req = request("start", Some(ALICE), Some(other), start.clone());
        let code = "invalid_content_type";
        diom_answers(&app, req, 400, "invalid-input", code, CONTENT_TYPE, None).await;
    }
    // A parameter is no other type.
    let charset = request(
        "start",
        Some(ALICE),
        Some("application/json; charset=utf-8"),
        start,
    );
    assert_eq!(call(&app, charset).await.0, 200);
    // Over the body limit.
    let small = App::new(
        Arc::new(MemoryStore::new()),
        tokens(),
        Config {
            max_body_bytes: 64,
            ..Config::default()
        },
        None,
    )
    .expect("a server");
    let big = format!(r#"{{"key":"{}","lock_period_ms":1000}}"#, "k".repeat(100));
    let req = json_body("start", &big);
    let detail = "Request payload is too large.";
    diom_answers(
        &small,
        req,
        413,
        "invalid-input",
        "payload_too_large",
        detail,
        None,
    )
    .await;

    // An unknown namespace, on every route that names one, and on namespace.get.
    for (route, body, token) in [
        (
            "start",
            r#"{"namespace":"nope","key":"k","lock_period_ms":1000}"#,
            ALICE,
        ),
        (
            "complete",
            r#"{"namespace":"nope","key":"k","response":[],"ttl_ms":1}"#,
            ALICE,
        ),
        ("abort", r#"{"namespace":"nope","key":"k"}"#, ALICE),
        ("namespace.get", r#"{"name":"nope"}"#, ADMIN),
    ] {
        let req = request(route, Some(token), json, body.as_bytes().to_vec());
        diom_answers(
            &app,
            req,
            400,
            "operation-error",
            "not_found",
            "Entity not found",
            None,
        )
        .await;
    }
    // A caller token on the admin's routes.
    for (route, action) in [
        ("namespace.configure", "configure"),
        ("namespace.get", "get"),
    ] {
        let req = json_body(route, r#"{"name":"orders"}"#);
        let detail = format!(
            "You do not have permission to perform `{action}` on `admin/namespace::orders`"
        );
        diom_answers(
            &app,
            req,
            403,
            "operation-error",
            "forbidden",
            &detail,
            None,
        )
        .await;
    }
}

/// Where Diom has no equivalent, idem-server's own answers keep Diom's body: idem's bound on
/// periods, and the fenced extension's fields, at their field.
#[tokio::test]
async fn idems_own_refusals_keep_diom_body() {
    let app = app();
    let over = r#"{"key":"k","lock_period_ms":315360000001}"#;
    let detail = "must be between 1 and 315360000000 milliseconds, got 315360000001";
    let req = json_body("start", over);
    diom_answers(
        &app,
        req,
        422,
        "invalid-input",
        "invalid_data",
        detail,
        Some("lock_period_ms"),
    )
    .await;
    let req = json_body("abort", r#"{"key":"k","token":"zz"}"#);
    let detail = "a token is the 32 hexadecimal digits `start` returned";
    diom_answers(
        &app,
        req,
        422,
        "invalid-input",
        "invalid_data",
        detail,
        Some("token"),
    )
    .await;
    // Nothing was claimed by any refusal of this file's kind.
    let (status, _, body) = call(
        &app,
        json_body("start", r#"{"key":"k","lock_period_ms":1000}"#),
    )
    .await;
    assert_eq!(
        (status, body.as_slice()),
        (200, &br#"{"status":"started"}"#[..])
    );
}
