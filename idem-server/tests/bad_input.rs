//! Bad input never gets a 5xx, never claims a key, and never panics: a million generated
//! request bodies for every route, Diom's and the fenced extension's (valid bodies with wrong
//! types, bad keys, zero and huge periods, unknown namespaces, bad tokens, fingerprints, digests,
//! step names, limits, `on_lapse` values and resolutions; then byte-level mutations of them, in JSON and
//! MessagePack; oversized bodies; missing, wrong and other callers' bearer tokens) through the
//! router in process. Each is answered with a 4xx and Diom's error body, or a 200 when it was a
//! valid request after all.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use common::{answer, ADMIN, ALICE, BOB};
use idem_core::{CallEvent, Idempotency, MemoryStore, Observer, Stage};
use idem_server::{auth::Tokens, router, App, Config};
use serde_json::{json, Map, Value};
use tower::ServiceExt;

/// Counts claims of callers' keys (not of the names the server keeps of keys claimed
/// uncertain on lapse, which it writes before it claims one: docs/server.md, "Past the lease").
#[derive(Default, Clone)]
struct Claims(Arc<AtomicUsize>);

impl Observer for Claims {
    fn observe(&self, event: &CallEvent<'_>) {
        if event.stage() == Stage::Claimed && event.scope() != idem_server::uncertain::SCOPE {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

const LIMIT: usize = 4096;
const ROUTES: [&str; 15] = [
    "start",
    "complete",
    "abort",
    "renew",
    "get",
    "evict",
    "prune",
    "steps.begin",
    "steps.write",
    "uncertain.take",
    "uncertain.find",
    "uncertain.list",
    "uncertain.resolve",
    "namespace.configure",
    "namespace.get",
];

fn pick<'a>(rng: &mut fastrand::Rng, from: &'a [Value]) -> &'a Value {
    &from[rng.usize(..from.len())]
}

/// The values each field takes, valid or not; built once.
struct Pools {
    keys: Vec<Value>,
    namespaces: Vec<Value>,
    periods: Vec<Value>,
    responses: Vec<Value>,
    tokens: Vec<Value>,
    fingerprints: Vec<Value>,
    contexts: Vec<Value>,
    flags: Vec<Value>,
    not_maps: Vec<Value>,
    digests: Vec<Value>,
    counts: Vec<Value>,
    step_names: Vec<Value>,
    on_lapses: Vec<Value>,
    resolutions: Vec<Value>,
    reasons: Vec<Value>,
}

impl Pools {
    fn new() -> Pools {
        Pools {
            keys: vec![
                json!("k1"),
                json!("k2"),
                json!("a/b:c=+"),
                json!(""),
                json!("foo bar"),
                json!("é"),
                json!("x".repeat(257)),
                json!("y".repeat(256)),
                json!(7),
                Value::Null,
            ],
            namespaces: vec![
                json!("default"),
                json!("orders"),
                json!("bad name"),
                json!("a:b"),
                json!(""),
                json!(3),
                Value::Null,
            ],
            periods: vec![
                json!(0),
                json!(1),
                json!(15_000),
                json!(-1),
                json!(1.5),
                json!("10"),
                json!(u64::MAX),
                json!(315_360_000_001u64),
                Value::Null,
            ],
            responses: vec![
                json!([104, 105]),
                json!([]),
                json!([300]),
                json!("text"),
                json!({"a": 1}),
                Value::Null,
            ],
            tokens: vec![
                json!("0123456789abcdef0123456789abcdef"),
                json!("zz"),
                json!("0123456789ABCDEF0123456789ABCDEZ"),
                json!(ADMIN),
                json!(5),
                Value::Null,
            ],
            fingerprints: vec![json!("a"), json!(""), json!("f".repeat(5000)), json!(1)],
            contexts: vec![
                json!({"status_code": "201"}),
                json!({"a": 1}),
                json!("x"),
                json!([]),
            ],
            flags: vec![json!(true), json!("yes"), json!(1)],
            not_maps: vec![json!([1, 2]), json!("body"), Value::Null, json!(1)],
            digests: vec![
                json!("ab".repeat(32)),
                json!("AB".repeat(32)),
                json!("zz".repeat(32)),
                json!("ab"),
                json!(""),
                json!(3),
            ],
            counts: vec![
                json!(0),
                json!(1),
                json!(100),
                json!(-1),
                json!(u64::MAX),
                json!("2"),
                Value::Null,
            ],
            on_lapses: vec![
                json!("release"),
                json!("uncertain"),
                json!("Uncertain"),
                json!(""),
                json!(1),
                Value::Null,
            ],
            resolutions: vec![
                json!("completed"),
                json!("failed"),
                json!("abandoned"),
                json!("done"),
                json!(0),
                Value::Null,
            ],
            reasons: vec![
                json!("refunded"),
                json!(""),
                json!("r".repeat(1025)),
                json!(3),
                Value::Null,
            ],
            step_names: vec![
                json!("charge"),
                json!(""),
                json!("n".repeat(256)),
                json!(2),
                Value::Null,
            ],
        }
    }

    /// A body for `route`: each field present or not, valid or not.
    fn body(&self, rng: &mut fastrand::Rng, route: &str) -> Value {
        if rng.u8(..16) == 0 {
            return pick(rng, &self.not_maps).clone();
        }
        let fields: &[(&str, &[Value])] = match route {
            "start" => &[
                ("key", &self.keys),
                ("namespace", &self.namespaces),
                ("lock_period_ms", &self.periods),
                ("fingerprint", &self.fingerprints),
                ("fingerprint_sha256", &self.digests),
                ("fenced", &self.flags),
                ("on_lapse", &self.on_lapses),
            ],
            "complete" => &[
                ("key", &self.keys),
                ("namespace", &self.namespaces),
                ("response", &self.responses),
                ("context", &self.contexts),
                ("ttl_ms", &self.periods),
                ("token", &self.tokens),
                ("is_error", &self.flags),
                ("absent", &self.flags),
                ("key_retention_ms", &self.periods),
            ],
            "abort" => &[
                ("key", &self.keys),
                ("namespace", &self.namespaces),
                ("token", &self.tokens),
            ],
            "renew" => &[
                ("key", &self.keys),
                ("namespace", &self.namespaces),
                ("token", &self.tokens),
                ("lock_period_ms", &self.periods),
            ],
            "get" | "evict" => &[("key", &self.keys), ("namespace", &self.namespaces)],
            "prune" => &[("limit", &self.counts)],
            "steps.begin" => &[
                ("key", &self.keys),
                ("namespace", &self.namespaces),
                ("token", &self.tokens),
                ("ttl_ms", &self.periods),
            ],
            "steps.write" => &[
                ("key", &self.keys),
                ("namespace", &self.namespaces),
                ("token", &self.tokens),
                ("name", &self.step_names),
                ("position", &self.counts),
                ("result", &self.responses),
                ("ttl_ms", &self.periods),
                ("on_lapse", &self.on_lapses),
            ],
            "uncertain.take" => &[
                ("key", &self.keys),
                ("namespace", &self.namespaces),
                ("token", &self.tokens),
                ("lock_period_ms", &self.periods),
            ],
            "uncertain.find" => &[
                ("namespace", &self.namespaces),
                ("after", &self.keys),
                ("limit", &self.counts),
            ],
            "uncertain.list" => &[("after", &self.digests), ("limit", &self.counts)],
            "uncertain.resolve" => &[
                ("key", &self.digests),
                ("resolution", &self.resolutions),
                ("response", &self.responses),
                ("context", &self.contexts),
                ("reason", &self.reasons),
            ],
            _ => &[("name", &self.namespaces), ("require_token", &self.flags)],
        };
        let mut map = Map::new();
        for (name, values) in fields {
            if rng.u8(..4) != 0 {
                map.insert((*name).to_owned(), pick(rng, values).clone());
            }
        }
        Value::Object(map)
    }
}

/// Flips, drops, inserts or cuts a few bytes.
fn mutate(rng: &mut fastrand::Rng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.usize(1..4) {
        if bytes.is_empty() {
            bytes.push(rng.u8(..));
            continue;
        }
        let at = rng.usize(..bytes.len());
        match rng.u8(..4) {
            0 => bytes[at] ^= 1 << rng.u8(..8),
            1 => {
                bytes.remove(at);
            }
            2 => bytes.insert(at, rng.u8(..)),
            _ => bytes.truncate(at),
        }
    }
}

fn request(rng: &mut fastrand::Rng, pools: &Pools) -> Request<Body> {
    let route = ROUTES[rng.usize(..ROUTES.len())];
    let msgpack = rng.bool();
    let value = pools.body(rng, route);
    let mut bytes = if msgpack {
        rmp_serde::to_vec_named(&value).unwrap()
    } else {
        serde_json::to_vec(&value).unwrap()
    };
    match rng.u8(..20) {
        0 => {
            bytes = vec![0; rng.usize(LIMIT + 1..2 * LIMIT)];
            rng.fill(&mut bytes);
        }
        1..=10 => mutate(rng, &mut bytes),
        _ => {}
    }
    let mut r = Request::post(format!("/api/v1.idempotency.{route}"));
    let content_type = match rng.u8(..8) {
        0 => None,
        1 => Some("text/plain"),
        2 => Some(if msgpack {
            "application/json"
        } else {
            "application/msgpack"
        }),
        _ => Some(if msgpack {
            "application/msgpack"
        } else {
            "application/json"
        }),
    };
    if let Some(ct) = content_type {
        r = r.header("content-type", ct);
    }
    if rng.bool() {
        r = r.header(
            "accept",
            if rng.bool() {
                "application/msgpack"
            } else {
                "application/json"
            },
        );
    }
    let auth = match rng.u8(..20) {
        0 => None,
        1 => Some("Bearer not-a-token-we-know".to_owned()),
        2 => Some(format!("Basic {ALICE}")),
        3 => Some("Bearer".to_owned()),
        4 => Some(format!("Bearer {BOB}")),
        5 => Some(format!("Bearer {ADMIN}")),
        _ => Some(format!("Bearer {ALICE}")),
    };
    if let Some(a) = auth {
        r = r.header("authorization", a);
    }
    r.body(Body::from(bytes)).unwrap()
}

/// A 4xx body is Diom's error body, in the encoding the response says.
fn check_error_body(content_type: &str, body: &[u8]) {
    let value: Value = if content_type == "application/msgpack" {
        rmp_serde::from_slice(body).unwrap()
    } else {
        assert_eq!(content_type, "application/json");
        serde_json::from_slice(body).unwrap()
    };
    let kind = value["type"].as_str().unwrap();
    assert!(
        kind == "invalid-input" || kind == "operation-error",
        "{value}"
    );
    assert!(
        value["code"].is_string() && value["detail"].is_string(),
        "{value}"
    );
    assert!(
        value.as_object().unwrap().contains_key("location"),
        "{value}"
    );
}

/// Runs `count` generated bodies from `seed` through a server of its own, checking each answer;
/// returns how many were answered 200 and how many refused.
async fn storm(seed: u64, count: usize) -> (usize, usize) {
    let claims = Claims::default();
    let engine = Idempotency::builder(MemoryStore::new())
        .observer(claims.clone())
        .max_response_bytes(LIMIT)
        .build()
        .unwrap();
    let tokens = Tokens::new(ADMIN, &[format!("alice={ALICE}"), format!("bob={BOB}")]).unwrap();
    let config = Config {
        max_body_bytes: LIMIT,
        ..Config::default()
    };
    let routes = router(App::from_engine(engine, tokens, config, None));
    let mut rng = fastrand::Rng::with_seed(seed);
    let pools = Pools::new();
    let (mut ok, mut refused) = (0usize, 0usize);
    for i in 0..count {
        let req = request(&mut rng, &pools);
        let before = claims.0.load(Ordering::SeqCst);
        let (status, content_type, body) = answer(routes.clone().oneshot(req).await.unwrap()).await;
        assert!(status < 500, "seed {seed} body {i}: {status} {body:?}");
        if status == 200 {
            ok += 1;
            continue;
        }
        assert!(
            (400..500).contains(&status),
            "seed {seed} body {i}: {status}"
        );
        refused += 1;
        check_error_body(&content_type, &body);
        assert_eq!(
            claims.0.load(Ordering::SeqCst),
            before,
            "seed {seed} body {i} was refused with {status} after it claimed a key"
        );
    }
    (ok, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_generated_bodies_get_4xx_or_200_and_bad_ones_never_claim() {
    let total: usize = std::env::var("IDEM_FUZZ_BODIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    // Four servers of their own, so that each can tell which request claimed.
    let storms: Vec<_> = (0..4u64)
        .map(|seed| tokio::spawn(storm(seed, total / 4)))
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for storm in storms {
        let (o, r) = storm.await.unwrap();
        ok += o;
        refused += r;
    }
    eprintln!(
        "{} bodies: {ok} answered 200, {refused} refused with a 4xx",
        ok + refused
    );
    assert_eq!(ok + refused, total / 4 * 4);
    assert!(
        ok > 0 && refused > total / 2,
        "the generator made too few bad or good bodies"
    );
}
