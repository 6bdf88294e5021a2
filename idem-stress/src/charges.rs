//! A payment provider on loopback and the operation that charges through it, for the kill tests
//! of uncertain operations (`tests/uncertain_kill.rs`).
//!
//! The provider ([`Provider`]) is an HTTP server written for the tests, as a card network's API
//! behaves: `POST /charges` with an `Idempotency-Key` header charges once per key (a repeated
//! key gets the first charge back, as Stripe's API answers), and `GET /charges/{key}` answers
//! whether a charge with that key was made. It counts every `POST` per key, so a test can tell
//! that idem never sent the same operation's charge twice, whatever the provider's own
//! deduplication would have hidden.
//!
//! The operation ([`charge`]) is what a careful application writes: claimed with
//! `OnLapse::Uncertain` (a charge must not repeat), its input stored for a reconciler
//! (`run_steps_with`), the charge one step that passes the operation's provider key. The
//! reconciler ([`reconciler`]) asks the provider about that key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use idem_core::StoreErrorKind;
use idem_core::{Error, Idempotency, Key, OnLapse, Outcome, Reconciled, StoreError};

/// The scope the operations are stored under, and their reconciler's.
pub const SCOPE: &str = "charges";

/// What the provider holds: the charge made for each key, and how many `POST`s each key got.
#[derive(Debug, Default)]
struct Ledger {
    charges: HashMap<String, String>,
    posts: HashMap<String, u32>,
}

/// The provider, serving on `127.0.0.1` until dropped.
pub struct Provider {
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub base: String,
    ledger: Arc<Mutex<Ledger>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Provider {
    /// Starts the provider on a free loopback port.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound (a broken test machine).
    pub async fn start() -> Provider {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let router = Router::new()
            .route("/charges", post(create))
            .route("/charges/{key}", get(lookup))
            .with_state(ledger.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"));
        let base = match listener.local_addr() {
            Ok(addr) => format!("http://{addr}"),
            Err(e) => panic!("a bound listener has an address: {e}"),
        };
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Provider { base, ledger, task }
    }

    /// How many `POST /charges` each key got.
    pub fn posts(&self) -> HashMap<String, u32> {
        self.lock().posts.clone()
    }

    /// How many `POST /charges` it got in all.
    pub fn total_posts(&self) -> u32 {
        self.lock().posts.values().sum()
    }

    /// The keys charged.
    pub fn charged(&self) -> Vec<String> {
        self.lock().charges.keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

async fn create(
    State(ledger): State<Arc<Mutex<Ledger>>>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, String) {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return (StatusCode::BAD_REQUEST, "missing Idempotency-Key".into());
    };
    let mut ledger = ledger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *ledger.posts.entry(key.clone()).or_default() += 1;
    let next = ledger.charges.len() + 1;
    let id = ledger
        .charges
        .entry(key)
        .or_insert_with(|| format!("ch_{next}_{body}"))
        .clone();
    (StatusCode::CREATED, id)
}

async fn lookup(
    State(ledger): State<Arc<Mutex<Ledger>>>,
    Path(key): Path<String>,
) -> (StatusCode, String) {
    let ledger = ledger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match ledger.charges.get(&key) {
        Some(id) => (StatusCode::OK, id.clone()),
        None => (StatusCode::NOT_FOUND, String::new()),
    }
}

/// A client of the provider.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// A client of the provider at `base`.
    pub fn new(base: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap_or_default(),
        }
    }

    /// Charges `amount` under the provider key `key`; the charge's id.
    pub async fn charge(&self, key: &str, amount: &str) -> Result<String, Error> {
        let response = self
            .http
            .post(format!("{}/charges", self.base))
            .header("idempotency-key", key)
            .body(amount.to_owned())
            .send()
            .await
            .map_err(unavailable)?;
        if !response.status().is_success() {
            return Err(unavailable(format!(
                "the provider answered {}",
                response.status()
            )));
        }
        response.text().await.map_err(unavailable)
    }

    /// Whether a charge was made under `key`: its id, or `None`.
    pub async fn lookup(&self, key: &str) -> Result<Option<String>, Error> {
        let response = self
            .http
            .get(format!("{}/charges/{key}", self.base))
            .send()
            .await
            .map_err(unavailable)?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            status if status.is_success() => response.text().await.map(Some).map_err(unavailable),
            status => Err(unavailable(format!("the provider answered {status}"))),
        }
    }
}

/// A provider failure as the engine reports a store it cannot reach: it passes.
fn unavailable(e: impl Into<idem_core::BoxError>) -> Error {
    Error::Store(StoreError::new(StoreErrorKind::Unavailable, e))
}

/// The client key of the `i`-th charge.
pub fn charge_key(i: usize) -> Key {
    Key::derive(SCOPE, "", &format!("order-{i}"))
        .unwrap_or_else(|e| unreachable!("order keys are valid: {e}"))
}

/// Charges order `i` once through `provider`: claimed with `OnLapse::Uncertain` for `lease`,
/// its input (the order's number) stored for a reconciler, the charge one step that passes the
/// operation's provider key. The charge's id, fresh or replayed.
pub async fn charge(
    engine: &Idempotency,
    provider: &Client,
    i: usize,
    lease: Duration,
) -> Result<Outcome<String>, Error> {
    let provider = provider.clone();
    engine
        .call(charge_key(i))
        .lease(lease)
        .on_lapse(OnLapse::Uncertain)
        .run_steps_with(SCOPE, i.to_string().into_bytes(), move |steps| async move {
            let key = steps
                .provider_key("charge")
                .unwrap_or_else(|| unreachable!("the call has a key"));
            let amount = i.to_string();
            steps
                .run("charge", || async { provider.charge(&key, &amount).await })
                .await
        })
        .await
}

/// What [`reconciler`] answers for one operation.
pub type Asked =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Reconciled<String>, Error>> + Send>>;

/// The reconciler of [`charge`]'s operations: asks the provider whether the charge with the
/// operation's provider key went through.
pub fn reconciler(provider: Client) -> impl Fn(Key, Vec<u8>) -> Asked + Send + Sync + 'static {
    move |key: Key, _input: Vec<u8>| {
        let provider = provider.clone();
        Box::pin(async move {
            Ok(
                match provider.lookup(&key.provider_key(Some("charge"))).await? {
                    Some(id) => Reconciled::Completed(id),
                    None => Reconciled::Failed,
                },
            )
        })
    }
}
