//! A payments API whose `POST /payments` is safe to retry: the idempotency layer stores each
//! response under the client's `Idempotency-Key` and replays it to retries.
//!
//! ```text
//! cargo run --example http_server --features http,sqlite -- [--port 3000] [--sqlite PATH]
//! cargo run --example http_server --features http,sqlite,postgres -- --database-url postgres://…
//! ```
//!
//! Records go to SQLite (the file from `--sqlite` or env `IDEM_SQLITE`, default a file in the
//! temporary directory), or to PostgreSQL when a URL is given (`--database-url` or env
//! `DATABASE_URL`; needs the `postgres` feature). The port comes from `--port` or env `PORT`
//! (default 3000). Payments themselves live in memory to keep the example short; the idempotency
//! records survive a restart. The server prints a curl session to try.
//!
//! With the `metrics` feature (`--features http,sqlite,metrics`), `GET /metrics` serves idem's
//! metrics in the Prometheus text format: calls by outcome, claim/work/complete latency and the
//! claims in flight, labelled by scope (`payments`). docs/operations.md says what to alert on.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::{BodyFingerprint, IdempotencyKey, IdempotencyLayer};
use idem::{Idempotency, SqliteStore, Store};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
struct NewPayment {
    amount: u64,
    currency: String,
    #[serde(default)]
    description: String,
}

#[derive(Debug, Clone, Serialize)]
struct Payment {
    id: String,
    amount: u64,
    currency: String,
    description: String,
    status: &'static str,
    /// The request's `Idempotency-Key`, so the payment can be traced to the request (and its
    /// idempotency record looked up with the CLI).
    idempotency_key: String,
}

#[derive(Clone, Default)]
struct Payments {
    next: Arc<AtomicU64>,
    all: Arc<Mutex<HashMap<String, Payment>>>,
}

impl Payments {
    fn insert(&self, payment: Payment) {
        self.all
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(payment.id.clone(), payment);
    }

    fn get(&self, id: &str) -> Option<Payment> {
        self.all
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(id)
            .cloned()
    }
}

/// Creates a payment. Not idempotent by itself: every run makes a new id. The layer makes a
/// retry with the same key replay the first response instead of running this again. The key is
/// the one the layer checked, without its quotes.
async fn create_payment(
    State(payments): State<Payments>,
    key: IdempotencyKey,
    Json(new): Json<NewPayment>,
) -> Response {
    if new.amount == 0 {
        let problem = serde_json::json!({
            "type": "about:blank",
            "title": "Unprocessable Content",
            "status": 422,
            "detail": "amount must be at least 1",
        });
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            [(header::CONTENT_TYPE, "application/problem+json")],
            problem.to_string(),
        )
            .into_response();
    }
    let n = payments.next.fetch_add(1, Ordering::SeqCst) + 1;
    let payment = Payment {
        id: format!("pay_{n:06}"),
        amount: new.amount,
        currency: new.currency,
        description: new.description,
        status: "succeeded",
        idempotency_key: key.into_string(),
    };
    payments.insert(payment.clone());
    let location = format!("/payments/{}", payment.id);
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(payment),
    )
        .into_response()
}

async fn get_payment(State(payments): State<Payments>, Path(id): Path<String>) -> Response {
    match payments.get(&id) {
        Some(payment) => Json(payment).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The value after `--flag` on the command line, else the env variable, else `default`.
fn setting(flag: &str, env: &str, default: impl FnOnce() -> String) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(env).ok())
        .unwrap_or_else(default)
}

/// Where the records are, for people: what it is, and the `--url` the `idem` CLI takes.
struct Described {
    what: String,
    cli_url: String,
}

/// The store for idempotency records: PostgreSQL when a URL is given, else SQLite.
async fn open_store() -> Result<(Arc<dyn Store>, Described), Box<dyn std::error::Error>> {
    let url = setting("--database-url", "DATABASE_URL", String::new);
    if !url.is_empty() {
        return open_postgres(&url).await;
    }
    let path = setting("--sqlite", "IDEM_SQLITE", || {
        std::env::temp_dir()
            .join("idem-http-server.db")
            .display()
            .to_string()
    });
    let store = SqliteStore::open(&path).await?;
    let described = Described {
        what: format!("SQLite at {path}"),
        cli_url: format!("sqlite://{path}"),
    };
    Ok((Arc::new(store), described))
}

#[cfg(feature = "postgres")]
async fn open_postgres(
    url: &str,
) -> Result<(Arc<dyn Store>, Described), Box<dyn std::error::Error>> {
    let store = idem::PostgresStore::connect(url).await?;
    let described = Described {
        what: format!("PostgreSQL table {}", store.table()),
        // Not the URL itself: it may hold a password.
        cli_url: "\"$DATABASE_URL\"".to_owned(),
    };
    Ok((Arc::new(store), described))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_: &str) -> Result<(Arc<dyn Store>, Described), Box<dyn std::error::Error>> {
    Err(
        "a database URL was given, but this build has no PostgreSQL store: \
         run with --features http,sqlite,postgres"
            .into(),
    )
}

/// Prints the curl session from docs/http.md, pointed at this server, and how to look at a
/// record with the `idem` CLI.
fn print_session(base: &str, cli_url: &str) {
    let post = format!(
        "curl -i -X POST {base}/payments -H 'Content-Type: application/json' -H 'X-Api-Key: team-a'"
    );
    println!(
        "Try it (each command's expected status is in the comment):\n\n\
         # 201 Created: a new payment\n\
         {post} -H 'Idempotency-Key: \"order-1001\"' -d '{{\"amount\": 4200, \"currency\": \"EUR\"}}'\n\n\
         # 201 again, same payment id, plus Idempotent-Replayed: true (the handler did not run)\n\
         {post} -H 'Idempotency-Key: \"order-1001\"' -d '{{\"currency\": \"EUR\", \"amount\": 4200}}'\n\n\
         # 422: the same key for a different request\n\
         {post} -H 'Idempotency-Key: \"order-1001\"' -d '{{\"amount\": 9900, \"currency\": \"EUR\"}}'\n\n\
         # 201, a different payment: another caller's keys are separate\n\
         curl -i -X POST {base}/payments -H 'Content-Type: application/json' -H 'X-Api-Key: team-b' \
         -H 'Idempotency-Key: \"order-1001\"' -d '{{\"amount\": 4200, \"currency\": \"EUR\"}}'\n\n\
         # 401: no X-Api-Key, so no telling whose key this is\n\
         curl -i -X POST {base}/payments -H 'Content-Type: application/json' \
         -H 'Idempotency-Key: \"order-1001\"' -d '{{\"amount\": 4200, \"currency\": \"EUR\"}}'\n\n\
         # 400: no key (keys are required here)\n\
         {post} -d '{{\"amount\": 4200, \"currency\": \"EUR\"}}'\n\n\
         # 422 from axum's Json (amount is a string), not stored: the corrected retry with the\n\
         # same key, unquoted as most clients send it, makes the payment (201)\n\
         {post} -H 'Idempotency-Key: order-1002' -d '{{\"amount\": \"4200\", \"currency\": \"EUR\"}}'\n\
         {post} -H 'Idempotency-Key: order-1002' -d '{{\"amount\": 4200, \"currency\": \"EUR\"}}'\n\n\
         # 200: read the payment back\n\
         curl -i {base}/payments/pay_000001\n\n\
         # The idempotency record of the first request: scope payments, the caller, the key\n\
         # without its quotes (the response is shown in hex: the layer's own format)\n\
         cargo run -p idem-cli -- --url {cli_url} inspect --scope payments --caller team-a order-1001\n"
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = setting("--port", "PORT", || "3000".into()).parse()?;
    // The recorder goes in before the first request: the engine registers its metric handles
    // once per scope, with the recorder installed at that moment.
    #[cfg(feature = "metrics")]
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let (store, described) = open_store().await?;
    let engine = Idempotency::from_arc(store);
    let idempotency = IdempotencyLayer::builder(engine)
        .require_key(true)
        // Each API key has its own key space: two clients never see each other's responses.
        // A request without one gets 401 with this challenge, never a shared key space.
        .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
        .www_authenticate(HeaderValue::from_static(r#"ApiKey realm="payments""#))
        // JSON key order and whitespace do not make a retry "different".
        .fingerprint(BodyFingerprint::Json)
        .lease(Duration::from_secs(10))
        .retention(Duration::from_secs(24 * 3600))
        .scope("payments")
        .build()?;
    let app = Router::new()
        .route("/payments", post(create_payment))
        .route("/payments/{id}", get(get_payment))
        .layer(idempotency)
        .with_state(Payments::default());
    #[cfg(feature = "metrics")]
    let app = app.route(
        "/metrics",
        get(move || std::future::ready(metrics.render())),
    );

    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let base = format!("http://{}", listener.local_addr()?);
    println!(
        "payments API on {base}, idempotency records in {}\n",
        described.what
    );
    print_session(&base, &described.cli_url);
    axum::serve(listener, app).await?;
    Ok(())
}
