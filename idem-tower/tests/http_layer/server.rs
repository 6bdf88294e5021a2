//! A real axum server on 127.0.0.1:0 behind the idempotency layer, and a real HTTP client.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use idem::http::{IdempotencyKey, IdempotencyLayer, LayerBuilder};
use idem::{Idempotency, Key, Store};
use idem_test_support::hold::{Hold, Holds};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::task::JoinHandle;

pub use idem_test_support::layer::{kept_headers, Headers, LayerServer};
pub use idem_test_support::within;

/// What the handlers share with the test.
#[derive(Clone)]
struct App {
    runs: Arc<AtomicUsize>,
    serial: Arc<AtomicUsize>,
    hold: Hold,
    big_body: usize,
}

pub struct Server {
    pub base: String,
    pub client: reqwest::Client,
    pub store: Arc<dyn Store>,
    runs: Arc<AtomicUsize>,
    /// `/hold`'s gate: `entered` each time it starts, `dropped` each time it is dropped before
    /// it finished (its client went away); `release` lets held handlers finish.
    pub holds: Holds,
    /// One message each time a request reaches the server (outside the idempotency layer).
    pub arrivals: UnboundedReceiver<()>,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// Every header as (name, value) in arrival order, `date` left out: the server writes it
    /// per message.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Headers for Reply {
    fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }
}

impl Reply {
    /// Reads a response whole.
    async fn of(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = kept_headers(response.headers());
        let body = response.bytes().await.unwrap().to_vec();
        Reply {
            status,
            headers,
            body,
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// Checks an RFC 9457 problem response and returns its body.
    pub fn problem(&self, status: u16) -> serde_json::Value {
        assert_eq!(
            self.status,
            status,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let p = self.json();
        assert_eq!(p["status"], status);
        for member in ["type", "title", "detail"] {
            assert!(
                p[member].as_str().is_some_and(|s| !s.is_empty()),
                "{member} missing in {p}"
            );
        }
        p
    }
}

/// The caller identity [`Server::post`] sends in `x-caller`.
pub const CALLER: &str = "client-1";

/// `"key"` as an RFC 8941 string.
pub fn quoted(key: &str) -> String {
    format!("\"{key}\"")
}

/// The key the layer stores a request under (default scope `http`; caller `""` in a shared key
/// space).
pub fn record_key(caller: &str, client_key: &str) -> Key {
    Key::derive("http", caller, client_key).unwrap()
}

/// The test routes behind a layer that scopes keys by `x-caller`.
impl LayerServer for Server {
    type Builder = LayerBuilder;

    /// The builder of the test layer: keys scoped by the `x-caller` header.
    fn builder(engine: Idempotency) -> LayerBuilder {
        IdempotencyLayer::builder(engine)
            .caller(|parts| Some(parts.headers.get("x-caller")?.to_str().ok()?.to_owned()))
    }

    async fn build_and_serve(store: Arc<dyn Store>, builder: LayerBuilder) -> Server {
        Server::serve(store, builder.build().unwrap()).await
    }
}

impl Server {
    /// Serves the test routes behind `layer`, which keeps its records in `store`.
    pub async fn serve(store: Arc<dyn Store>, layer: IdempotencyLayer) -> Server {
        let (held, holds) = idem_test_support::hold::gate();
        let (arrival_tx, arrivals) = unbounded_channel();
        let app = App {
            runs: Arc::new(AtomicUsize::new(0)),
            serial: Arc::new(AtomicUsize::new(0)),
            hold: held,
            big_body: 4096,
        };
        let router = Router::new()
            .route("/payments", post(create).get(list))
            .route("/hold", post(hold))
            .route("/flaky", post(flaky))
            .route("/panics", post(panics))
            .route("/big", post(big))
            .route("/trailers", post(trailers))
            .route("/frames", post(frames))
            .route("/one-frame", post(one_frame))
            .route("/huge", post(huge))
            .route("/json", post(json_payment))
            .route("/keyed", post(keyed).get(keyed))
            .route("/maybe-keyed", post(maybe_keyed).get(maybe_keyed))
            .layer(layer)
            .layer(tower::util::MapRequestLayer::new(
                move |req: axum::http::Request<Body>| {
                    let _ = arrival_tx.send(());
                    req
                },
            ))
            .with_state(app.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Server {
            base: format!("http://{addr}"),
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
            store,
            runs: app.runs,
            holds,
            arrivals,
            task,
        }
    }

    /// How many times a handler started.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// A request with the given raw `Idempotency-Key` values and `x-caller`.
    pub fn request<B: Into<reqwest::Body>>(
        &self,
        method: reqwest::Method,
        path: &str,
        keys: &[&str],
        caller: Option<&str>,
        body: B,
    ) -> impl Future<Output = Reply> + Send + 'static + use<B> {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .body(body);
        for key in keys {
            req = req.header("idempotency-key", *key);
        }
        if let Some(caller) = caller {
            req = req.header("x-caller", caller);
        }
        async move { Reply::of(req.send().await.unwrap()).await }
    }

    /// `POST path` with one quoted key as [`CALLER`], asking for trailers (`TE: trailers`);
    /// the reply and the trailers that ended its body.
    pub fn post_reading_trailers(
        &self,
        path: &str,
        key: &str,
    ) -> impl Future<Output = (Reply, Option<HeaderMap>)> + Send + 'static + use<> {
        let req = self
            .client
            .post(format!("{}{path}", self.base))
            .header("te", "trailers")
            .header("idempotency-key", quoted(key))
            .header("x-caller", CALLER);
        async move {
            use http_body_util::BodyExt;
            let response: axum::http::Response<reqwest::Body> = req.send().await.unwrap().into();
            let (parts, body) = response.into_parts();
            let collected = body.collect().await.unwrap();
            let trailers = collected.trailers().cloned();
            let reply = Reply {
                status: parts.status.as_u16(),
                headers: kept_headers(&parts.headers),
                body: collected.to_bytes().to_vec(),
            };
            (reply, trailers)
        }
    }

    /// `POST path` with a JSON body (`Content-Type: application/json`) and one raw key, as
    /// [`CALLER`].
    pub fn post_json(
        &self,
        path: &str,
        key: &str,
        body: &str,
    ) -> impl Future<Output = Reply> + Send + 'static + use<> {
        let req = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .header("x-caller", CALLER)
            .body(body.to_owned());
        async move { Reply::of(req.send().await.unwrap()).await }
    }

    /// `POST path` with one quoted key (or none) as [`CALLER`].
    pub fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> impl Future<Output = Reply> + Send + 'static + use<> {
        let keys: Vec<String> = key.map(quoted).into_iter().collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.request(
            reqwest::Method::POST,
            path,
            &keys,
            Some(CALLER),
            body.to_owned(),
        )
    }
}

/// Creates a payment: a new id per run, with headers a replay must repeat exactly, among them a
/// session cookie for the caller that asked.
async fn create(State(app): State<App>, headers: HeaderMap, body: String) -> Response<Body> {
    app.runs.fetch_add(1, Ordering::SeqCst);
    let id = app.serial.fetch_add(1, Ordering::SeqCst) + 1;
    let caller = headers
        .get("x-caller")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let json = serde_json::json!({ "id": id, "caller": caller, "request": body });
    Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .header("location", format!("/payments/{id}"))
        .header("set-cookie", "a=1")
        .header("set-cookie", format!("session={caller}.{id}"))
        .header("x-run", id.to_string())
        .body(Body::from(json.to_string()))
        .unwrap()
}

/// What `/json` takes: an amount, which axum's `Json` extractor checks before the handler runs
/// (a syntax error gets 400, a wrong type 422).
#[derive(serde::Deserialize)]
struct Amount {
    amount: u64,
}

/// Creates a payment from a JSON body; a new id per run.
async fn json_payment(State(app): State<App>, Json(new): Json<Amount>) -> (StatusCode, String) {
    app.runs.fetch_add(1, Ordering::SeqCst);
    let id = app.serial.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        format!("payment {id} of {}", new.amount),
    )
}

/// Answers with the key the layer checked; refused by the extractor without one.
async fn keyed(State(app): State<App>, key: IdempotencyKey) -> String {
    app.runs.fetch_add(1, Ordering::SeqCst);
    let id = app.serial.fetch_add(1, Ordering::SeqCst) + 1;
    format!("run {id} under {key}")
}

/// Answers with the key the layer checked, or says there is none.
async fn maybe_keyed(State(app): State<App>, key: Option<IdempotencyKey>) -> String {
    app.runs.fetch_add(1, Ordering::SeqCst);
    match key {
        Some(key) => format!("key {}", key.as_str()),
        None => "no key".to_owned(),
    }
}

async fn list() -> &'static str {
    "[]"
}

/// Runs until the test releases it through the gate.
async fn hold(State(app): State<App>) -> Response<Body> {
    app.runs.fetch_add(1, Ordering::SeqCst);
    let id = app.serial.fetch_add(1, Ordering::SeqCst) + 1;
    app.hold.hold().await;
    Response::builder()
        .status(StatusCode::CREATED)
        .body(Body::from(format!("held payment {id}")))
        .unwrap()
}

/// Fails with 500 on its first run, succeeds afterwards.
async fn flaky(State(app): State<App>) -> Response<Body> {
    let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let status = if run == 1 {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::CREATED
    };
    Response::builder()
        .status(status)
        .body(Body::from(format!("run {run}")))
        .unwrap()
}

/// Panics on its first run, succeeds afterwards.
async fn panics(State(app): State<App>) -> Response<Body> {
    let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(run > 1, "the handler panics on its first run");
    Response::builder()
        .status(StatusCode::CREATED)
        .body(Body::from(format!("run {run}")))
        .unwrap()
}

/// A response body larger than the test engines store.
async fn big(State(app): State<App>) -> Response<Body> {
    let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let mut body = format!("run {run} ").into_bytes();
    body.resize(app.big_body, b'x');
    Response::new(Body::from(body))
}

/// A 5 MB response body: over the default 1 MiB `max_response_bytes`.
async fn huge(State(app): State<App>) -> Response<Body> {
    let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let mut body = format!("run {run} ").into_bytes();
    body.resize(5 << 20, b'x');
    Response::new(Body::from(body))
}

/// A body followed by trailers, announced in a `Trailer` header (HTTP/1.1 sends only the
/// trailers it names, and only to a client that sent `TE: trailers`); they differ per run.
async fn trailers(State(app): State<App>) -> Response<Body> {
    let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", format!("sum-{run}").parse().unwrap());
    trailers.insert("x-rows", "2".parse().unwrap());
    Response::builder()
        .header("trailer", "x-checksum, x-rows")
        .header("content-type", "text/csv")
        .body(Body::new(Frames(
            [
                http_body::Frame::data(bytes::Bytes::from(format!("run,{run}\n"))),
                http_body::Frame::data(bytes::Bytes::from_static(b"ok,1\n")),
                http_body::Frame::trailers(trailers),
            ]
            .into(),
        )))
        .unwrap()
}

/// A body in three data frames (a streamed response), which the layer stores as one.
async fn frames(State(app): State<App>) -> Response<Body> {
    let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    Response::new(Body::new(Frames(
        [format!("run {run}"), " in three".into(), " frames".into()]
            .map(|part| http_body::Frame::data(bytes::Bytes::from(part)))
            .into(),
    )))
}

/// A streamed body of one frame, whose end shows only when the next is asked for.
async fn one_frame(State(app): State<App>) -> Response<Body> {
    let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    Response::new(Body::new(Frames(
        [http_body::Frame::data(bytes::Bytes::from(format!(
            "run {run} streamed"
        )))]
        .into(),
    )))
}

/// A body that yields these frames.
struct Frames(std::collections::VecDeque<http_body::Frame<bytes::Bytes>>);

impl http_body::Body for Frames {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// Sends `n` copies of a request at once; returns them as tasks to collect.
pub fn spawn_many(
    n: usize,
    request: impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Reply> + Send>>,
) -> tokio::task::JoinSet<Reply> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        set.spawn(request());
    }
    set
}
