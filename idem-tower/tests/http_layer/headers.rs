//! Which response headers the layer stores and replays (`replay_headers`): the default deny
//! list, an allow list, a deny list, names in any case, every header, and that the rule decides
//! what the store holds, not only what a replay shows. On the memory store, through the router
//! without a socket: the rule is applied before the store and after it, alike for every store
//! (`cases::retry_replays_identical_response` checks the default over a real connection on
//! each).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use idem::http::{IdempotencyLayer, LayerBuilder, ReplayHeaders, IDEMPOTENCY_KEY};
use idem::{Idempotency, Key, MemoryStore, RecordState, Store, StoredResponse};
use tower::ServiceExt;

use crate::server::Headers;

/// What the handler answers with, in this order: a header of each kind the rule tells apart.
/// Two values of `set-cookie` and of `x-custom`; `x-binary` is not UTF-8.
const SENT: [(&str, &[u8]); 10] = [
    ("content-type", b"application/json"),
    ("location", b"/payments/p-77"),
    ("set-cookie", b"session=s-first-client; HttpOnly; Secure"),
    ("set-cookie", b"theme=dark"),
    ("x-ratelimit-remaining", b"99"),
    ("ratelimit", b"limit=100, remaining=99, reset=30"),
    ("date", b"Sat, 28 Nov 2026 01:00:00 GMT"),
    ("x-custom", b"one"),
    ("x-custom", b"two"),
    ("x-binary", b"\xff\x80 raw"),
];

/// The response body, which names none of the headers' values.
const BODY: &str = r#"{"id":77}"#;

/// The headers of [`SENT`] whose names are in `names`, in [`SENT`]'s order.
fn sent(names: &[&str]) -> Vec<(String, Vec<u8>)> {
    SENT.iter()
        .filter(|(name, _)| names.contains(name))
        .map(|(name, value)| (name.to_string(), value.to_vec()))
        .collect()
}

/// Every header of [`SENT`].
fn all_sent() -> Vec<(String, Vec<u8>)> {
    sent(&SENT.map(|(name, _)| name))
}

/// `headers` without `content-length`, which axum's router writes for a body of known length
/// after the handler (stored with the handler's headers) and again on the way out (outside the
/// layer, on a replay whose rule dropped it): it comes from the body, not from the rule.
fn unframed(headers: impl IntoIterator<Item = (String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    headers
        .into_iter()
        .filter(|(name, _)| name != "content-length")
        .collect()
}

/// A response as the layer gave it: every header in order (but `content-length`: [`unframed`]),
/// and the body.
struct Reply {
    status: StatusCode,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl Headers for Reply {
    fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }
}

/// The test routes behind a layer, on a store the test can read.
struct App {
    router: Router,
    store: Arc<dyn Store>,
    runs: Arc<AtomicUsize>,
}

impl App {
    /// `POST /payments` behind a layer built by `configure` from a one-key-space builder over
    /// `store`; `runs` counts the handler's runs.
    fn new(
        store: Arc<dyn Store>,
        runs: Arc<AtomicUsize>,
        configure: impl FnOnce(LayerBuilder) -> LayerBuilder,
    ) -> App {
        let builder =
            IdempotencyLayer::builder(Idempotency::from_arc(store.clone())).shared_key_space();
        let layer = configure(builder).build().unwrap();
        let counter = runs.clone();
        let router = Router::new()
            .route(
                "/payments",
                post(move || {
                    let counter = counter.clone();
                    async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let mut response = Response::builder().status(StatusCode::CREATED);
                        for (name, value) in SENT {
                            response = response.header(name, value);
                        }
                        response.body(Body::from(BODY)).unwrap()
                    }
                }),
            )
            .layer(layer);
        App {
            router,
            store,
            runs,
        }
    }

    /// An app on a store of its own.
    fn on_memory(configure: impl FnOnce(LayerBuilder) -> LayerBuilder) -> App {
        App::new(
            Arc::new(MemoryStore::new()),
            Arc::new(AtomicUsize::new(0)),
            configure,
        )
    }

    /// `POST /payments` with the key `key`.
    async fn send(&self, key: &str) -> Reply {
        let request = Request::post("/payments")
            .header(IDEMPOTENCY_KEY, key)
            .body(Body::from("{}"))
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        Reply {
            status: parts.status,
            headers: unframed(
                parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())),
            ),
            body: body.collect().await.unwrap().to_bytes().to_vec(),
        }
    }

    /// The bytes the store holds for `key`: the response as the layer stored it.
    async fn stored(&self, key: &str) -> Vec<u8> {
        let key = Key::derive("http", "", key).unwrap();
        match self.store.get(&key).await.unwrap().map(|r| r.state) {
            Some(RecordState::Completed(result)) => result.result().unwrap().to_vec(),
            other => panic!("no completed record for the key: {other:?}"),
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// Whether `bytes` hold `part` anywhere.
fn holds(bytes: &[u8], part: &[u8]) -> bool {
    bytes.windows(part.len()).any(|w| w == part)
}

/// Sends `key` twice: the first response (every header, not a replay) and the replay, whose
/// status and body are the first's; the handler ran once.
async fn first_and_replay(app: &App, key: &str) -> Reply {
    let first = app.send(key).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    // The first client gets every header, whatever the rule.
    assert_eq!(first.headers, all_sent());
    let again = app.send(key).await;
    assert!(again.replayed());
    assert_eq!(again.status, first.status);
    assert_eq!(again.body, first.body);
    assert_eq!(app.runs(), 1);
    again
}

/// Checks that the headers `names` are not in the stored bytes at all, names nor values, and
/// that the stored headers are `kept`.
async fn stored_without(app: &App, key: &str, names: &[&str], kept: &[(String, Vec<u8>)]) {
    let bytes = app.stored(key).await;
    for (name, value) in SENT.iter().filter(|(name, _)| names.contains(name)) {
        assert!(!holds(&bytes, name.as_bytes()), "{name} is stored");
        assert!(!holds(&bytes, value), "the value of {name} is stored");
    }
    let stored = StoredResponse::decode(&bytes).unwrap();
    let headers = unframed(
        stored
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())),
    );
    assert_eq!(headers, kept);
    assert_eq!(stored.body, BODY);
}

/// The default rule: the cookies, the rate-limit figures and the date of the first exchange
/// are neither stored nor replayed; everything else is, in order, byte for byte, both values of
/// a repeated header included.
#[tokio::test]
async fn the_default_keeps_all_but_the_first_exchanges_headers() {
    let app = App::on_memory(|b| b);
    let again = first_and_replay(&app, "k-default").await;
    let kept = sent(&["content-type", "location", "x-custom", "x-binary"]);
    assert_eq!(again.headers_unmarked(), kept);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let dropped = ["set-cookie", "x-ratelimit-remaining", "ratelimit", "date"];
    stored_without(&app, "k-default", &dropped, &kept).await;
}

/// An allow list, its names in any case: only those headers are stored and replayed.
#[tokio::test]
async fn an_allow_list_keeps_only_what_it_names() {
    let rule = ReplayHeaders::allow(["Content-Type", "SET-COOKIE", "X-Custom"]);
    let app = App::on_memory(|b| b.replay_headers(rule));
    let again = first_and_replay(&app, "k-allow").await;
    let kept = sent(&["content-type", "set-cookie", "x-custom"]);
    assert_eq!(again.headers_unmarked(), kept);
    let dropped = [
        "location",
        "x-ratelimit-remaining",
        "ratelimit",
        "date",
        "x-binary",
    ];
    stored_without(&app, "k-allow", &dropped, &kept).await;
}

/// A deny list, its names in any case, takes the place of the default one: what it names is
/// dropped, and the default's headers are kept.
#[tokio::test]
async fn a_deny_list_drops_what_it_names() {
    let rule = ReplayHeaders::deny(["LOCATION", "x-Custom"]);
    let app = App::on_memory(|b| b.replay_headers(rule));
    let again = first_and_replay(&app, "k-deny").await;
    let kept = sent(&[
        "content-type",
        "set-cookie",
        "x-ratelimit-remaining",
        "ratelimit",
        "date",
        "x-binary",
    ]);
    assert_eq!(again.headers_unmarked(), kept);
    stored_without(&app, "k-deny", &["location", "x-custom"], &kept).await;
}

/// `ReplayHeaders::all()`: every header, as the layer stored them before the rule.
#[tokio::test]
async fn all_keeps_every_header() {
    let app = App::on_memory(|b| b.replay_headers(ReplayHeaders::all()));
    let again = first_and_replay(&app, "k-all").await;
    assert_eq!(again.headers_unmarked(), all_sent());
    stored_without(&app, "k-all", &[], &all_sent()).await;
}

/// A rule applies to the responses stored before it too: a response stored with every header
/// (by a wider rule, or a release before the rule) is replayed under the default without the
/// headers it denies. The store still holds them until the record goes.
#[tokio::test]
async fn a_narrower_rule_applies_to_responses_stored_before_it() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let before = App::new(store.clone(), runs.clone(), |b| {
        b.replay_headers(ReplayHeaders::all())
    });
    assert_eq!(before.send("k-upgrade").await.headers, all_sent());
    let after = App::new(store, runs, |b| b);
    let again = after.send("k-upgrade").await;
    assert!(again.replayed());
    assert_eq!(
        again.headers_unmarked(),
        sent(&["content-type", "location", "x-custom", "x-binary"])
    );
    assert_eq!(after.runs(), 1);
}
