//! A real tonic server on 127.0.0.1:0 behind the gRPC idempotency layer, a real tonic client
//! over TCP, and a raw client (the same HTTP/2 channel) that reads a response's headers, bytes
//! and trailers as they came.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use http_body_util::BodyExt;
use idem::grpc::{IdempotencyLayer, LayerBuilder, UnaryMethod};
use idem::{Idempotency, Store};
use idem_test_support::grpc::payments_client::PaymentsClient;
use idem_test_support::grpc::payments_server::{Payments, PaymentsServer};
use idem_test_support::grpc::prost::Message;
use idem_test_support::grpc::{
    path, CreatePaymentRequest, Payment, PaymentStream, TransferRequest, WatchRequest,
};
use idem_test_support::hold::{Hold, Holds};
use tokio::task::JoinHandle;
use tonic::body::Body;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Server as TonicServer};
use tonic::{Code, Request, Response, Status};
use tower::Service;

pub use idem_test_support::layer::{kept_headers, Headers, LayerServer};
pub use idem_test_support::{within, BOUND};

/// The caller identity the tests send in `x-caller`.
pub const CALLER: &str = "client-1";

/// What the service shares with the test.
#[derive(Clone)]
struct App {
    runs: Arc<AtomicUsize>,
    serial: Arc<AtomicUsize>,
    hold: Hold,
    /// The keys whose `fail-once` call already failed once.
    failed: Arc<Mutex<HashSet<String>>>,
    /// Each effect the service made, by its request's key: a payment booked.
    effects: Arc<Mutex<Vec<String>>>,
}

fn caller_of<T>(req: &Request<T>) -> String {
    req.metadata()
        .get("x-caller")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

fn key_of<T>(req: &Request<T>) -> String {
    req.metadata()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

#[tonic::async_trait]
impl Payments for App {
    async fn create(
        &self,
        req: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let id = self.serial.fetch_add(1, Ordering::SeqCst) + 1;
        let (caller, key) = (caller_of(&req), key_of(&req));
        let new = req.into_inner();
        match new.behaviour.as_str() {
            "hold" => {
                self.hold.hold().await;
            }
            "fail-once" if self.failed.lock().unwrap().insert(key.clone()) => {
                return Err(Status::unavailable(format!("run {id}: not now")));
            }
            "not-found" => {
                let mut status = Status::with_details(
                    Code::NotFound,
                    format!("run {id}: no such account"),
                    Bytes::from(format!("details of run {id}")),
                );
                status
                    .metadata_mut()
                    .insert("x-run", MetadataValue::from(id as u64));
                return Err(status);
            }
            "internal" => return Err(Status::internal(format!("run {id}: broke"))),
            _ => {}
        }
        self.effects.lock().unwrap().push(key);
        let note = if new.behaviour == "big" {
            "x".repeat(8192)
        } else {
            String::new()
        };
        let mut response = Response::new(Payment {
            id: format!("pay_{id}"),
            amount: new.amount,
            currency: new.currency,
            caller,
            note,
        });
        response
            .metadata_mut()
            .insert("x-run", MetadataValue::from(id as u64));
        Ok(response)
    }

    async fn transfer(&self, req: Request<TransferRequest>) -> Result<Response<Payment>, Status> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let id = self.serial.fetch_add(1, Ordering::SeqCst) + 1;
        let caller = caller_of(&req);
        let new = req.into_inner();
        Ok(Response::new(Payment {
            id: format!("tr_{id}"),
            amount: new.amount,
            currency: String::new(),
            caller,
            note: new.request_id,
        }))
    }

    type WatchStream = PaymentStream;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let first = self
            .serial
            .fetch_add(req.get_ref().count as usize, Ordering::SeqCst);
        let items: Vec<_> = (1..=req.get_ref().count as usize)
            .map(|n| {
                Ok(Payment {
                    id: format!("w_{}", first + n),
                    ..Payment::default()
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

pub struct Server {
    pub store: Arc<dyn Store>,
    pub channel: Channel,
    /// How many responses of each key the network loses (see [`LostResponses`]).
    lose: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
    effects: Arc<Mutex<Vec<String>>>,
    /// The gate of held calls: `entered` each time one starts, `dropped` each time one is
    /// dropped before it finished; `release` lets held calls finish.
    pub holds: Holds,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The test service behind a layer that keys `Create` by metadata and `Transfer` by a field.
impl LayerServer for Server {
    type Builder = LayerBuilder;

    /// The test layer's builder: `Create` keyed by metadata, `Transfer` by its `request_id` (field
    /// 3), keys scoped by `x-caller`. `Watch` (server streaming) is not named: it passes.
    fn builder(engine: Idempotency) -> LayerBuilder {
        IdempotencyLayer::builder(engine)
            .unary(path("Create"))
            .unary(UnaryMethod::new(path("Transfer")).key_field(3))
            .caller(|parts| Some(parts.headers.get("x-caller")?.to_str().ok()?.to_owned()))
    }

    async fn build_and_serve(store: Arc<dyn Store>, builder: LayerBuilder) -> Server {
        let layer = builder.build().unwrap();
        let (held, holds) = idem_test_support::hold::gate();
        let app = App {
            runs: Arc::new(AtomicUsize::new(0)),
            serial: Arc::new(AtomicUsize::new(0)),
            hold: held,
            failed: Arc::default(),
            effects: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let lose = Arc::new(AtomicUsize::new(0));
        let mut builder = TonicServer::builder()
            .layer(tower::layer::layer_fn({
                let lose = lose.clone();
                move |inner| Mapped {
                    inner,
                    map: LostResponses {
                        lose: lose.clone(),
                        seen: Arc::default(),
                    },
                }
            }))
            .layer(layer)
            .layer(tower::layer::layer_fn(|inner| Mapped {
                inner,
                map: LedgerTrailer::default(),
            }));
        let router = builder.add_service(PaymentsServer::new(app.clone()));
        let task = tokio::spawn(async move {
            router.serve_with_incoming(incoming).await.unwrap();
        });
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Server {
            store,
            channel,
            lose,
            runs: app.runs,
            effects: app.effects,
            holds,
            task,
        }
    }
}

impl Server {
    /// How many times a method started.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// The keys of the payments booked, one entry per booking.
    pub fn effects(&self) -> Vec<String> {
        self.effects.lock().unwrap().clone()
    }

    /// From now on the network loses the first `n` responses of each key, after the server
    /// made them.
    pub fn lose_first_responses(&self, n: usize) {
        self.lose.store(n, Ordering::SeqCst);
    }

    pub fn client(&self) -> PaymentsClient<Channel> {
        PaymentsClient::new(self.channel.clone())
    }

    /// `Create` through the tonic client, with `key` (if any) and `caller` (if any).
    pub fn create(
        &self,
        key: Option<&str>,
        caller: Option<&str>,
        new: CreatePaymentRequest,
    ) -> impl Future<Output = Result<Response<Payment>, Status>> + Send + 'static + use<> {
        let mut client = self.client();
        let mut req = Request::new(new);
        if let Some(key) = key {
            req.metadata_mut()
                .insert("idempotency-key", key.parse().unwrap());
        }
        if let Some(caller) = caller {
            req.metadata_mut()
                .insert("x-caller", caller.parse().unwrap());
        }
        async move { client.create(req).await }
    }

    /// A raw unary call: `message` framed at `method`, with these metadata entries.
    pub fn raw(
        &self,
        method: &str,
        message: &impl Message,
        metadata: &[(&str, &str)],
    ) -> impl Future<Output = Raw> + Send + 'static {
        let bytes = message.encode_to_vec();
        let mut framed = vec![0];
        framed.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        framed.extend_from_slice(&bytes);
        let mut req = http::Request::post(format!("http://test{}", path(method)))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (name, value) in metadata {
            req = req.header(*name, *value);
        }
        let req = req
            .body(Body::new(http_body_util::Full::new(Bytes::from(framed))))
            .unwrap();
        let mut channel = self.channel.clone();
        async move {
            use tower::ServiceExt;
            let response = channel.ready().await.unwrap().call(req).await.unwrap();
            let (parts, body) = response.into_parts();
            let collected = body.collect().await.unwrap();
            let trailers = collected.trailers().cloned();
            Raw {
                status: parts.status.as_u16(),
                headers: kept_headers(&parts.headers),
                body: collected.to_bytes().to_vec(),
                trailers: trailers.map(|t| {
                    t.iter()
                        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                        .collect()
                }),
            }
        }
    }
}

/// A response as it came over the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    pub status: u16,
    /// Every header as (name, value) in arrival order, `date` left out.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body's bytes: the length-prefixed response message(s).
    pub body: Vec<u8>,
    pub trailers: Option<Vec<(String, Vec<u8>)>>,
}

impl Headers for Raw {
    fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }
}

impl Raw {
    pub fn trailer(&self, name: &str) -> Option<&str> {
        let (_, v) = self.trailers.as_ref()?.iter().find(|(n, _)| n == name)?;
        Some(std::str::from_utf8(v).unwrap())
    }

    /// The one response message.
    pub fn message<M: Message + Default>(&self) -> M {
        assert_eq!(self.body[0], 0, "compressed");
        M::decode(&self.body[5..]).unwrap()
    }
}

/// A middleware that changes responses on their way back: what `see` takes of a request decides
/// what `respond` makes of its response.
trait OnResponse {
    /// What the middleware keeps of a request until its response comes.
    type Seen: Send + 'static;

    fn see<B>(&self, req: &http::Request<B>) -> Self::Seen;

    fn respond(seen: Self::Seen, response: http::Response<Body>) -> http::Response<Body>;
}

/// The service of an [`OnResponse`] middleware `map` around `inner`.
#[derive(Clone)]
struct Mapped<S, M> {
    inner: S,
    map: M,
}

impl<S, M, ReqBody> Service<http::Request<ReqBody>> for Mapped<S, M>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    M: OnResponse,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let seen = self.map.see(&req);
        let fut = self.inner.call(req);
        Box::pin(async move { Ok(M::respond(seen, fut.await?)) })
    }
}

/// A network that loses responses, outside the idempotency layer: the first `lose` responses
/// to each key are made by the server (and stored by the layer), then replaced on the way back
/// by `UNAVAILABLE`, as a client sees a connection that broke before the answer came.
#[derive(Clone)]
struct LostResponses {
    lose: Arc<AtomicUsize>,
    seen: Arc<Mutex<std::collections::HashMap<String, usize>>>,
}

impl OnResponse for LostResponses {
    /// Whether this response is lost.
    type Seen = bool;

    fn see<B>(&self, req: &http::Request<B>) -> bool {
        let key = req
            .headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let mut seen = self.seen.lock().unwrap();
        let n = seen.entry(key).or_insert(0);
        *n += 1;
        *n <= self.lose.load(Ordering::SeqCst)
    }

    fn respond(lost: bool, response: http::Response<Body>) -> http::Response<Body> {
        if lost {
            return Status::unavailable("the connection broke").into_http();
        }
        response
    }
}

/// Adds custom trailing metadata to every response that ends with trailers, as a service's
/// middleware would: `x-ledger-seq`, a number that grows with each response.
#[derive(Clone, Default)]
struct LedgerTrailer {
    seq: Arc<AtomicUsize>,
}

impl OnResponse for LedgerTrailer {
    type Seen = Arc<AtomicUsize>;

    fn see<B>(&self, _: &http::Request<B>) -> Arc<AtomicUsize> {
        self.seq.clone()
    }

    fn respond(seq: Arc<AtomicUsize>, response: http::Response<Body>) -> http::Response<Body> {
        response.map(|body| {
            Body::new(
                body.map_frame(move |frame: Frame<Bytes>| match frame.into_trailers() {
                    Ok(mut trailers) => {
                        let n = seq.fetch_add(1, Ordering::SeqCst) + 1;
                        trailers.insert("x-ledger-seq", n.to_string().parse().unwrap());
                        Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                }),
            )
        })
    }
}

/// The headers of a trailers-only response, or the trailers of another: where its status is.
pub fn status_fields(raw: &Raw) -> HeaderMap {
    let mut map = HeaderMap::new();
    let fields = raw.trailers.as_ref().unwrap_or(&raw.headers);
    for (n, v) in fields {
        map.append(
            http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(v).unwrap(),
        );
    }
    map
}
