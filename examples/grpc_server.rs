//! A gRPC payments service whose unary calls are safe to retry: the idempotency layer stores
//! each response (headers, message, trailers) under the call's key and replays it to retries.
//!
//! ```text
//! cargo run --example grpc_server --features grpc,sqlite -- [--port 50051] [--sqlite PATH] [--once]
//! ```
//!
//! Records go to SQLite (the file from `--sqlite` or env `IDEM_SQLITE`, default a file in the
//! temporary directory). The service is `idem.test.payments.Payments`
//! (`idem-test-support/proto/payments.proto`): `Create` is keyed by the `idempotency-key`
//! metadata entry, `Transfer` by its message's `request_id` (AIP-155), and `Watch` streams,
//! so it passes the layer untouched. Keys are scoped by the caller's `x-api-key`.
//!
//! The example serves on 127.0.0.1 (port from `--port` or env `PORT`, default 50051), calls
//! itself with a tonic client and prints that session (docs/grpc.md shows it), then serves on
//! until stopped; `--once` stops after the session.
//!
//! The protobuf code comes from the workspace's test-support crate, whose `build.rs` generates
//! it with `tonic-prost-build` on `protox` (no `protoc`): the build script a service of your own
//! would have.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::grpc::{IdempotencyLayer, UnaryMethod};
use idem::{Idempotency, SqliteStore};
use idem_test_support::grpc::payments_client::PaymentsClient;
use idem_test_support::grpc::payments_server::{Payments, PaymentsServer};
use idem_test_support::grpc::{
    CreatePaymentRequest, Payment, PaymentStream, TransferRequest, WatchRequest,
};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// The payments themselves, in memory to keep the example short; the idempotency records are
/// in SQLite and survive a restart.
#[derive(Clone, Default)]
struct Service {
    next: Arc<AtomicU64>,
}

impl Service {
    fn book(&self, amount: i64, currency: String, caller: String, note: String) -> Payment {
        let n = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        println!("    (server: booking payment pay_{n:06})");
        Payment {
            id: format!("pay_{n:06}"),
            amount,
            currency,
            caller,
            note,
        }
    }
}

fn caller<T>(req: &Request<T>) -> String {
    req.metadata()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

#[tonic::async_trait]
impl Payments for Service {
    async fn create(
        &self,
        req: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        let caller = caller(&req);
        let new = req.into_inner();
        if new.amount <= 0 {
            // A final answer: stored and replayed like a success (INVALID_ARGUMENT).
            return Err(Status::invalid_argument("amount must be positive"));
        }
        let payment = self.book(new.amount, new.currency, caller, String::new());
        let mut response = Response::new(payment);
        response
            .metadata_mut()
            .insert("x-ledger", MetadataValue::from_static("eu-1"));
        Ok(response)
    }

    async fn transfer(&self, req: Request<TransferRequest>) -> Result<Response<Payment>, Status> {
        let caller = caller(&req);
        let t = req.into_inner();
        Ok(Response::new(self.book(
            t.amount,
            "EUR".into(),
            caller,
            format!("to {} (request_id {})", t.to, t.request_id),
        )))
    }

    type WatchStream = PaymentStream;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let items: Vec<_> = (0..req.get_ref().count)
            .map(|n| {
                Ok(Payment {
                    id: format!("watch_{n}"),
                    ..Payment::default()
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

fn arg(flag: &str, env: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(env).ok())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = arg("--port", "PORT").map_or(Ok(50051), |p| p.parse())?;
    let path = arg("--sqlite", "IDEM_SQLITE").unwrap_or_else(|| {
        let dir = std::env::temp_dir().join("idem-grpc-server.db");
        dir.to_string_lossy().into_owned()
    });
    let store = SqliteStore::open(&path).await?;
    let layer = IdempotencyLayer::builder(Idempotency::new(store))
        .scope("payments-grpc")
        .unary(UnaryMethod::of::<PaymentsServer<Service>>("Create"))
        // message TransferRequest { …; string request_id = 3; }
        .unary(UnaryMethod::of::<PaymentsServer<Service>>("Transfer").key_field(3))
        .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
        .lease(Duration::from_secs(10))
        .build()?;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("idempotency records in sqlite://{path}; serving on {addr}\n");
    // Accepted without Nagle's algorithm, as `Server::serve` would: a small answer is not held
    // back for the client's delayed ACK (a 40 ms stall).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut server = Server::builder().layer(layer);
    let router = server.add_service(PaymentsServer::new(Service::default()));
    let serving = tokio::spawn(router.serve_with_incoming(incoming));

    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    session(PaymentsClient::new(channel)).await?;

    if std::env::args().any(|a| a == "--once") {
        serving.abort();
        return Ok(());
    }
    println!("\nserving on {addr} until stopped (Ctrl-C)");
    serving.await??;
    Ok(())
}

/// A call with `x-api-key` and, if given, an `idempotency-key`.
fn call<T>(message: T, api_key: Option<&'static str>, key: Option<&'static str>) -> Request<T> {
    let mut req = Request::new(message);
    if let Some(api_key) = api_key {
        req.metadata_mut()
            .insert("x-api-key", MetadataValue::from_static(api_key));
    }
    if let Some(key) = key {
        req.metadata_mut()
            .insert("idempotency-key", MetadataValue::from_static(key));
    }
    req
}

fn show(answer: Result<Response<Payment>, Status>) {
    match answer {
        Ok(response) => {
            let replayed = response.metadata().get("idempotent-replayed").is_some();
            let p = response.get_ref();
            let note = if p.note.is_empty() {
                String::new()
            } else {
                format!(" {}", p.note)
            };
            let mark = if replayed {
                " [idempotent-replayed: true]"
            } else {
                ""
            };
            println!(
                "  OK {} {} {} caller={}{note}{mark}",
                p.id, p.amount, p.currency, p.caller
            );
        }
        Err(status) => {
            let pushback = status
                .metadata()
                .get("grpc-retry-pushback-ms")
                .map(|v| format!(" [grpc-retry-pushback-ms: {}]", v.to_str().unwrap_or("?")))
                .unwrap_or_default();
            let replayed = status
                .metadata()
                .get("idempotent-replayed")
                .map_or("", |_| " [idempotent-replayed: true]");
            println!(
                "  {:?}: {}{pushback}{replayed}",
                status.code(),
                status.message()
            );
        }
    }
}

async fn session(mut client: PaymentsClient<Channel>) -> Result<(), Box<dyn std::error::Error>> {
    let eur = |amount| CreatePaymentRequest {
        amount,
        currency: "EUR".into(),
        behaviour: String::new(),
    };
    let team_a = Some("team-a");
    println!(
        "$ Create {{amount: 4200, currency: EUR}} idempotency-key=order-1001 x-api-key=team-a"
    );
    show(
        client
            .create(call(eur(4200), team_a, Some("order-1001")))
            .await,
    );
    println!("# the retry: the stored response, replayed (the service does not run)");
    show(
        client
            .create(call(eur(4200), team_a, Some("order-1001")))
            .await,
    );
    println!("# the same key for another message");
    show(
        client
            .create(call(eur(9900), team_a, Some("order-1001")))
            .await,
    );
    println!("# another caller, the same key: its own payment");
    show(
        client
            .create(call(eur(4200), Some("team-b"), Some("order-1001")))
            .await,
    );
    println!("# no x-api-key: the layer cannot tell whose key this is");
    show(
        client
            .create(call(eur(4200), None, Some("order-1001")))
            .await,
    );
    println!("# a final error (INVALID_ARGUMENT) is stored too");
    show(
        client
            .create(call(eur(0), team_a, Some("order-1002")))
            .await,
    );
    println!("# ...and replayed");
    show(
        client
            .create(call(eur(0), team_a, Some("order-1002")))
            .await,
    );
    let transfer = || TransferRequest {
        amount: 500,
        to: "bob".into(),
        request_id: "8e03978e-40d5-43e8-bc93-6894a57f9324".into(),
    };
    println!("$ Transfer {{amount: 500, to: bob, request_id: 8e03978e-…}} x-api-key=team-a");
    show(client.transfer(call(transfer(), team_a, None)).await);
    println!("# the retry, keyed by request_id (AIP-155)");
    show(client.transfer(call(transfer(), team_a, None)).await);
    let mut watch = client
        .watch(call(WatchRequest { count: 2 }, team_a, Some("order-1001")))
        .await?
        .into_inner();
    println!("$ Watch {{count: 2}} (server streaming: passes the layer untouched)");
    while let Some(p) = watch.message().await? {
        println!("  {}", p.id);
    }
    Ok(())
}
