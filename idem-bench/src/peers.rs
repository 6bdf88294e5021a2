//! idem against the libraries a user would pick instead, in the same run and process.
//!
//! - HTTP: one axum app (a JSON `POST` handler returning a small receipt) served three times on
//!   loopback: bare, behind idem's `IdempotencyLayer` over `MemoryStore`, and behind
//!   `axum-idempotent` 0.6 over ruts' in-memory `MokaStore` (with the session and cookie layers
//!   it needs). One hyper client on keep-alive connections sends the same requests to each.
//!   Two calibration apps run beside them: the bare app whose handler burns 5 µs more CPU (what a
//!   fixed cost per request weighs here), and the bare app whose handler does not read the
//!   request body (what a replay that skips the body, as axum-idempotent's does, saves).
//! - HTTP on SQLite: the same app behind idem's layer over a `SqliteStore`, and the same app
//!   made idempotent by hand in its handler with the SQL rows' raw statements (`INSERT`, work,
//!   `UPDATE`; a replay's `INSERT` finds the key, and a `SELECT` reads its response), each on a
//!   database file of its own, against the bare app:
//!   what the layer costs over the app, and over the statements a team would write without it.
//! - Engine: `Idempotency` over `MemoryStore` against the `idempotent` 0.3 crate's memory store,
//!   each doing claim + trivial work + JSON + complete on a new key, and the replay of a
//!   completed key.
//! - Same key: 50 concurrent calls of one key per library, whose handler counts its runs and
//!   sleeps a little so the calls overlap; how many times it ran is printed beside the figures.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use idem::http::IdempotencyLayer;
use idem::{Error, Idempotency, Key, MemoryStore};
use idempotent::entry::ExistingEntry;
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::memory::MemoryStore as PeerStore;
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Barrier};
use tokio::task::JoinSet;

use crate::cpu::Cpu;
use crate::harness::{from_8_tasks, interleaved, op, replay_op, Hit, Op, Timing};
use crate::raw::{ByHand, Raw};
use crate::report::{Row, Workload};
use crate::workload::{work, Receipt, RETENTION};
use crate::{BenchError, Plan, CONCURRENCY};

/// The store column of the rows.
pub const HTTP: &str = "HTTP, memory";
pub const HTTP_SQLITE: &str = "HTTP, SQLite";
pub const ENGINE: &str = "engine, memory";
/// The variant column of the rows.
pub const IDEM_LAYER: &str = "idem layer";
pub const AXUM_IDEMPOTENT: &str = "axum-idempotent 0.6";
pub const BARE: &str = "bare app";
pub const BARE_SPIN: &str = "bare app, handler +5 µs CPU";
pub const BARE_UNREAD: &str = "bare app, body not read";
pub const BY_HAND: &str = "bare app, idempotent by hand (raw SQL)";
pub const IDEM_ENGINE: &str = "idem engine";
pub const IDEMPOTENT: &str = "idempotent 0.3";

/// The CPU the calibration app's handler burns on top of the bare app's: its row shows what a
/// fixed cost per request weighs on this host's loopback server, next to what the layers cost.
pub const SPIN: Duration = Duration::from_micros(5);
/// How many calls share one key in the same-key run.
pub const SAME_KEY_CALLS: usize = 50;
/// How long the same-key handler works, so that the 50 calls really overlap.
pub const SAME_KEY_WORK: Duration = Duration::from_millis(20);
/// Distinct sessions (callers) the client sends requests from; axum-idempotent keeps a
/// session's responses in one map, so this sets how many fields each session holds.
const SESSIONS: usize = 1_000;
const SCOPE: &str = "bench_peers";
/// The replay header of each layer, checked on every replay.
const IDEM_REPLAYED: &str = "idempotent-replayed";
const AXUM_REPLAYED: &str = "idempotency-replayed";
/// The header the app made idempotent by hand sets on a replay, so its replays are checked too.
const BY_HAND_REPLAYED: &str = "replayed-by-hand";

/// What the same-key run found for one library.
pub struct SameKey {
    pub library: &'static str,
    /// How many of the [`SAME_KEY_CALLS`] calls ran the handler.
    pub ran: u64,
    /// What the other calls got.
    pub others: String,
}

impl SameKey {
    /// The run of `library` whose handler ran `ran` times and whose calls got `answers`
    /// (how many got each answer).
    pub(crate) fn answered(
        library: &'static str,
        ran: u64,
        answers: &std::collections::BTreeMap<String, u64>,
    ) -> SameKey {
        SameKey {
            library,
            ran,
            others: format!(
                "answers: {}",
                answers
                    .iter()
                    .map(|(what, n)| format!("{n} × {what}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// The note of `library`'s run among `found`; empty when it has none.
    pub(crate) fn note_of(found: &[SameKey], library: &str) -> String {
        found
            .iter()
            .find(|s| s.library == library)
            .map_or_else(String::new, SameKey::note)
    }

    pub(crate) fn note(&self) -> String {
        format!(
            "{SAME_KEY_CALLS} same-key calls: handler ran {}× ({})",
            self.ran, self.others
        )
    }
}

/// The request body of the app's handler.
#[derive(Debug, Serialize, Deserialize)]
struct Deposit {
    account: u64,
    cents: u64,
}

async fn deposit(Json(d): Json<Deposit>) -> Json<Receipt> {
    Json(work(d.cents ^ d.account))
}

/// `deposit` without reading the request body: the answer a replay that skips the body (as
/// axum-idempotent's does) is measured against. hyper wakes the connection's task when a
/// handler takes the body, which tokio runs as a yield that also wakes an idle worker: at one
/// client task this doubles the bare app's latency on a multi-thread runtime (docs/performance.md,
/// "What reading the request body costs").
async fn unread_deposit() -> Json<Receipt> {
    Json(work(7))
}

/// `deposit` after spinning for [`SPIN`] (a busy loop on the clock, no sleep).
async fn spinning_deposit(Json(d): Json<Deposit>) -> Json<Receipt> {
    let start = std::time::Instant::now();
    while start.elapsed() < SPIN {
        std::hint::spin_loop();
    }
    Json(work(d.cents ^ d.account))
}

async fn slow_deposit(State(ran): State<Arc<AtomicU64>>, Json(d): Json<Deposit>) -> Json<Receipt> {
    ran.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(SAME_KEY_WORK).await;
    Json(work(d.cents ^ d.account))
}

/// `deposit` made idempotent by hand on SQLite, as a team without idem would write it: the key
/// from the `Idempotency-Key` header and the session (SHA-256, as idem's), one `INSERT` to
/// claim it, the work, one `UPDATE` with the response; a key already there is read (one
/// `SELECT`) and its response sent again, or `409` while it runs. No fingerprint, no lease
/// renewal, nothing finished for a caller that goes away: the raw baseline's statements only.
async fn deposit_by_hand(
    State(raw): State<Arc<Raw>>,
    headers: HeaderMap,
    Json(d): Json<Deposit>,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"'))
        .unwrap_or_default();
    let session = session_of(&headers).unwrap_or_default();
    let Ok(key) = Key::derive(SCOPE, &session, key) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let respond = || Ok(serde_json::to_vec(&work(d.cents ^ d.account))?);
    let json = [(header::CONTENT_TYPE, "application/json")];
    match raw.claim_or_read(key.as_bytes(), respond).await {
        Ok(ByHand::Fresh(body)) => (json, body).into_response(),
        Ok(ByHand::Replayed(body)) => (json, [(BY_HAND_REPLAYED, "true")], body).into_response(),
        Ok(ByHand::Locked) => StatusCode::CONFLICT.into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The one app every server runs: `/deposits` for the timed rows, `/slow-deposits` (counts its
/// runs into `ran`) for the same-key run.
fn app(ran: Arc<AtomicU64>) -> Router {
    Router::new()
        .route("/deposits", post(deposit))
        .route("/slow-deposits", post(slow_deposit))
        .with_state(ran)
}

/// The session cookie's value, which idem's layer takes as the caller (axum-idempotent keys
/// its responses by the same session).
fn session_of(headers: &HeaderMap) -> Option<String> {
    let cookies = headers.get(header::COOKIE)?.to_str().ok()?;
    cookies
        .split(';')
        .find_map(|c| c.trim().strip_prefix("session="))
        .map(str::to_owned)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Bare,
    /// The bare app whose `/deposits` handler also spins for [`SPIN`].
    BareSpin,
    /// The bare app whose `/deposits` handler does not read the request body.
    BareUnread,
    Idem,
    AxumIdempotent,
    /// idem's layer over a SQLite store ([`sqlite_server`]).
    IdemSqlite,
    /// The app made idempotent by hand on SQLite ([`sqlite_server`]).
    ByHand,
}

impl Flavor {
    /// The header a replay carries, if the server replays.
    fn replay_header(self) -> Option<&'static str> {
        match self {
            Flavor::Bare | Flavor::BareSpin | Flavor::BareUnread => None,
            Flavor::Idem | Flavor::IdemSqlite => Some(IDEM_REPLAYED),
            Flavor::AxumIdempotent => Some(AXUM_REPLAYED),
            Flavor::ByHand => Some(BY_HAND_REPLAYED),
        }
    }
}

/// The memory store's apps; the SQLite ones are [`sqlite_server`]'s.
fn router(flavor: Flavor, ran: Arc<AtomicU64>) -> Result<Router, BenchError> {
    let app = app(ran);
    Ok(match flavor {
        Flavor::Bare => app,
        Flavor::BareSpin => Router::new().route("/deposits", post(spinning_deposit)),
        Flavor::BareUnread => Router::new().route("/deposits", post(unread_deposit)),
        Flavor::Idem => app.layer(
            IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
                .require_key(true)
                .caller(|parts| session_of(&parts.headers))
                .build()?,
        ),
        Flavor::AxumIdempotent => {
            use ruts::store::moka::MokaStore;
            let options = axum_idempotent::IdempotentOptions::default()
                .use_idempotency_key_header(Some("Idempotency-Key"), true)
                .expire_after(RETENTION.as_secs() as i64);
            let sessions = ruts::SessionLayer::new(Arc::new(MokaStore::builder().build()))
                .with_cookie_options(ruts::CookieOptions::build().name("session").path("/"));
            app.layer(axum_idempotent::IdempotentLayer::<MokaStore>::new(options))
                .layer(sessions)
                .layer(tower_cookies::CookieManagerLayer::new())
        }
        Flavor::IdemSqlite | Flavor::ByHand => {
            return Err(BenchError::Unexpected(
                "the SQLite apps are served by `sqlite_server`".into(),
            ))
        }
    })
}

/// The app on SQLite, in a database file of its own at `path` (the store every SQLite row
/// takes: `synchronous = NORMAL`, no pruner): behind idem's layer, or idempotent by hand on a
/// table of the store's schema at version 1, as the SQL rows' raw baseline.
async fn sqlite_server(flavor: Flavor, path: &std::path::Path) -> Result<Server, BenchError> {
    let store = crate::sqlite_store(path).await?;
    let app = match flavor {
        Flavor::IdemSqlite => Router::new().route("/deposits", post(deposit)).layer(
            IdempotencyLayer::builder(Idempotency::new(store))
                .require_key(true)
                .caller(|parts| session_of(&parts.headers))
                .build()?,
        ),
        _ => {
            let raw = crate::sqlite_raw(store.pool().clone()).await?;
            Router::new()
                .route("/deposits", post(deposit_by_hand))
                .with_state(Arc::new(raw))
        }
    };
    Server::serve(flavor, Arc::new(AtomicU64::new(0)), app).await
}

/// One app served on a loopback port of this runtime, and the client's connections to it.
struct Server {
    flavor: Flavor,
    ran: Arc<AtomicU64>,
    client: Arc<Client>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(flavor: Flavor) -> Result<Server, BenchError> {
        let ran = Arc::new(AtomicU64::new(0));
        let app = router(flavor, ran.clone())?;
        Server::serve(flavor, ran, app).await
    }

    /// Serves `app`, whose same-key handler counts its runs in `ran`.
    async fn serve(flavor: Flavor, ran: Arc<AtomicU64>, app: Router) -> Result<Server, BenchError> {
        use axum::serve::ListenerExt;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopped.await;
        });
        let task = tokio::spawn(async move { serve.await });
        Ok(Server {
            flavor,
            ran,
            client: Arc::new(Client {
                addr,
                idle: Mutex::new(Vec::new()),
            }),
            stop: Some(stop),
            task,
        })
    }

    /// Closes the client's connections and stops the server.
    async fn shut_down(mut self) -> Result<(), BenchError> {
        self.client.close();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(Duration::from_secs(5), &mut self.task).await {
            Ok(done) => done??,
            Err(_) => self.task.abort(),
        }
        Ok(())
    }
}

/// The one HTTP client: HTTP/1.1 keep-alive connections, one per task in flight, reused.
struct Client {
    addr: SocketAddr,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

/// A request as the client sends it.
#[derive(Clone)]
struct Call {
    key: String,
    session: Arc<str>,
    body: Bytes,
}

impl Call {
    fn new(sessions: &[Arc<str>]) -> Result<Call, BenchError> {
        let deposit = Deposit {
            account: fastrand::u64(..1000),
            cents: fastrand::u64(..1_000_000),
        };
        Ok(Call {
            key: format!("\"{:032x}\"", fastrand::u128(..)),
            session: sessions[fastrand::usize(..sessions.len())].clone(),
            body: Bytes::from(serde_json::to_vec(&deposit)?),
        })
    }
}

/// A response as the client got it.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
}

impl Client {
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, BenchError> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(http_error)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn post(&self, path: &str, call: &Call) -> Result<Answer, BenchError> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut conn = match idle {
            Some(conn) if !conn.is_closed() => conn,
            _ => self.connect().await?,
        };
        let request = Request::post(path)
            .header(header::HOST, "127.0.0.1")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::COOKIE, format!("session={}", call.session))
            .header("idempotency-key", call.key.as_str())
            .body(Full::new(call.body.clone()))
            .map_err(http_error)?;
        conn.ready().await.map_err(http_error)?;
        let response = conn.send_request(request).await.map_err(http_error)?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(http_error)?.to_bytes();
        if parts.status.is_success() {
            serde_json::from_slice::<Receipt>(&body)?;
        }
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
        })
    }

    fn close(&self) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

fn http_error(e: impl std::fmt::Display) -> BenchError {
    BenchError::Unexpected(format!("HTTP client: {e}"))
}

/// A new key every request.
fn http_fresh(server: &Server, sessions: &Arc<Vec<Arc<str>>>) -> Op {
    let (client, flavor, sessions) = (server.client.clone(), server.flavor, sessions.clone());
    op(move || {
        let (client, sessions) = (client.clone(), sessions.clone());
        async move {
            let call = Call::new(&sessions)?;
            let answer = client.post("/deposits", &call).await?;
            if answer.status != StatusCode::OK {
                return Err(BenchError::Unexpected(format!(
                    "a fresh request got {}",
                    answer.status
                )));
            }
            Hit::fresh(
                flavor
                    .replay_header()
                    .map(|h| answer.headers.contains_key(h)),
            )
        }
    })
}

/// One of the requests completed ahead, sent again exactly as it was.
fn http_replay(server: &Server, completed: &Arc<Vec<Call>>) -> Op {
    let (client, flavor, completed) = (server.client.clone(), server.flavor, completed.clone());
    replay_op(completed.len(), move |i| {
        let (client, completed) = (client.clone(), completed.clone());
        async move {
            let answer = client.post("/deposits", &completed[i]).await?;
            if answer.status != StatusCode::OK {
                return Err(BenchError::Unexpected(format!(
                    "a replayed request got {}",
                    answer.status
                )));
            }
            // The bare app has nothing to replay: its "replay" runs the handler again.
            Hit::replay(
                flavor
                    .replay_header()
                    .map(|h| answer.headers.contains_key(h)),
                "handler",
            )
        }
    })
}

/// Sends every call once, from 8 tasks.
async fn complete_ahead(server: &Server, calls: &Arc<Vec<Call>>) -> Result<(), BenchError> {
    let (client, calls) = (server.client.clone(), calls.clone());
    from_8_tasks(calls.len(), move |i| {
        let (client, calls) = (client.clone(), calls.clone());
        async move {
            let answer = client.post("/deposits", &calls[i]).await?;
            if answer.status != StatusCode::OK {
                return Err(BenchError::Unexpected(format!(
                    "completing a key got {}",
                    answer.status
                )));
            }
            Ok(())
        }
    })
    .await
}

/// [`SAME_KEY_CALLS`] requests with one key, one session and one body, at once.
async fn http_same_key(server: &Server, library: &'static str) -> Result<SameKey, BenchError> {
    let sessions = [Arc::<str>::from(session_id())];
    let call = Call::new(&sessions)?;
    let before = server.ran.load(Ordering::SeqCst);
    let mut tasks = at_once(|barrier| {
        let (client, call) = (server.client.clone(), call.clone());
        async move {
            // Connect first, so the requests leave together.
            let conn = client.connect().await?;
            client
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
            barrier.wait().await;
            client.post("/slow-deposits", &call).await
        }
    });
    let mut statuses = std::collections::BTreeMap::<String, u64>::new();
    while let Some(done) = tasks.join_next().await {
        let answer = done??;
        let replayed = server
            .flavor
            .replay_header()
            .is_some_and(|h| answer.headers.contains_key(h));
        let what = if replayed {
            format!("{} replayed", answer.status.as_u16())
        } else {
            answer.status.as_u16().to_string()
        };
        *statuses.entry(what).or_default() += 1;
    }
    let ran = server.ran.load(Ordering::SeqCst) - before;
    Ok(SameKey::answered(library, ran, &statuses))
}

/// A session id as ruts writes them: 16 random bytes in unpadded base64url (22 characters).
fn session_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    // 21 free characters and a last one carrying 2 bits (its low 4 bits zero).
    let mut id: String = (0..21)
        .map(|_| char::from(ALPHABET[fastrand::usize(..64)]))
        .collect();
    id.push(char::from(ALPHABET[fastrand::usize(..4) * 16]));
    id
}

/// Idem's engine on the same work as the peer: the client's key string, derived into a key.
fn engine_fresh(engine: &Idempotency) -> Op {
    let engine = engine.clone();
    op(move || {
        let engine = engine.clone();
        async move {
            let client_key = format!("{:032x}", fastrand::u128(..));
            let seed = fastrand::u64(..);
            let key = Key::derive(SCOPE, "", &client_key).map_err(Error::from)?;
            let out = engine
                .call(key)
                .run(async move { Ok::<_, Error>(work(seed)) })
                .await?;
            if out.is_replayed() {
                return Err(BenchError::Unexpected("a new key replayed".into()));
            }
            Ok(Hit::Fresh)
        }
    })
}

fn engine_replay(engine: &Idempotency, keys: &Arc<Vec<String>>) -> Op {
    let (engine, keys) = (engine.clone(), keys.clone());
    replay_op(keys.len(), move |i| {
        let (engine, keys) = (engine.clone(), keys.clone());
        async move {
            let client_key = &keys[i];
            let key = Key::derive(SCOPE, "", client_key).map_err(Error::from)?;
            let out = engine
                .call(key)
                .run(async {
                    Err::<Receipt, _>(BenchError::Unexpected("a replay ran its work".into()))
                })
                .await?;
            std::hint::black_box(out.value());
            if out.is_replayed() {
                Ok(Hit::Replayed)
            } else {
                Err(BenchError::Unexpected("a replay ran its work".into()))
            }
        }
    })
}

/// The peer's entry for a call: its API requires a fingerprint; the cheapest one it offers
/// (xxh3 of the scope, no body).
fn peer_entry() -> IdempotencyEntry<idempotent::entry::Processing> {
    IdempotencyEntry::new(DefaultFingerprintStrategy.compute(SCOPE, &[]), RETENTION)
}

fn peer_key(client_key: &str) -> Result<IdempotencyKey, BenchError> {
    IdempotencyKey::new(client_key).map_err(|e| BenchError::Unexpected(e.to_string()))
}

/// Claim, work, JSON, complete on the peer's store, as its README does it; `working` is awaited
/// between the claim and the completion (only when the call claimed).
async fn peer_run(
    store: &PeerStore,
    client_key: &str,
    seed: u64,
    working: impl Future<Output = ()>,
) -> Result<Option<ExistingEntry>, BenchError> {
    let key = peer_key(client_key)?;
    let entry = peer_entry();
    let inserted = store
        .try_insert(&key, entry.clone())
        .await
        .unwrap_or_else(|never| match never {});
    match inserted {
        InsertResult::Claimed { fencing_token } => {
            working.await;
            let body = Bytes::from(serde_json::to_vec(&work(seed))?);
            let done = entry.complete(CachedResponse {
                status_code: 200,
                metadata: Metadata::default(),
                body,
            });
            store
                .complete(&key, done, fencing_token)
                .await
                .unwrap_or_else(|never| match never {});
            Ok(None)
        }
        InsertResult::Exists(existing) => Ok(Some(existing)),
    }
}

fn peer_fresh(store: &Arc<PeerStore>) -> Op {
    let store = store.clone();
    op(move || {
        let store = store.clone();
        async move {
            let client_key = format!("{:032x}", fastrand::u128(..));
            match peer_run(&store, &client_key, fastrand::u64(..), async {}).await? {
                None => Ok(Hit::Fresh),
                Some(_) => Err(BenchError::Unexpected("a new key existed".into())),
            }
        }
    })
}

fn peer_replay(store: &Arc<PeerStore>, keys: &Arc<Vec<String>>) -> Op {
    let (store, keys) = (store.clone(), keys.clone());
    replay_op(keys.len(), move |i| {
        let (store, keys) = (store.clone(), keys.clone());
        async move {
            let client_key = &keys[i];
            let key = peer_key(client_key)?;
            let entry = peer_entry();
            let fingerprint = entry.fingerprint;
            let found = store
                .try_insert(&key, entry)
                .await
                .unwrap_or_else(|never| match never {});
            match found {
                InsertResult::Exists(ExistingEntry::Completed(done))
                    if done.fingerprint_matches(fingerprint) =>
                {
                    let receipt: Receipt = serde_json::from_slice(&done.response().body)?;
                    std::hint::black_box(receipt);
                    Ok(Hit::Replayed)
                }
                _ => Err(BenchError::Unexpected(
                    "a completed key was not found completed".into(),
                )),
            }
        }
    })
}

/// [`SAME_KEY_CALLS`] engine calls with one key, at once.
async fn engine_same_key(engine: &Idempotency) -> Result<SameKey, BenchError> {
    let key =
        Key::derive(SCOPE, "", &format!("{:032x}", fastrand::u128(..))).map_err(Error::from)?;
    let ran = Arc::new(AtomicU64::new(0));
    let tasks = at_once(|barrier| {
        let (engine, ran) = (engine.clone(), ran.clone());
        async move {
            barrier.wait().await;
            let out = engine
                .call(key)
                .run(async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(SAME_KEY_WORK).await;
                    Ok::<_, Error>(work(1))
                })
                .await;
            match out {
                Ok(out) if out.is_replayed() => Ok("replayed"),
                Ok(_) => Ok("ran"),
                Err(Error::Locked { .. }) => Ok("Locked"),
                Err(e) => Err(BenchError::from(e)),
            }
        }
    });
    same_key_counts(IDEM_ENGINE, &ran, tasks).await
}

async fn peer_same_key(store: &Arc<PeerStore>) -> Result<SameKey, BenchError> {
    let client_key = format!("{:032x}", fastrand::u128(..));
    let ran = Arc::new(AtomicU64::new(0));
    let tasks = at_once(|barrier| {
        let (store, ran, client_key) = (store.clone(), ran.clone(), client_key.clone());
        async move {
            barrier.wait().await;
            let working = async {
                ran.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(SAME_KEY_WORK).await;
            };
            match peer_run(&store, &client_key, 1, working).await? {
                None => Ok("ran"),
                Some(ExistingEntry::Processing(_)) => Ok("found in progress"),
                Some(ExistingEntry::Completed(_)) => Ok("replayed"),
            }
        }
    });
    same_key_counts(IDEMPOTENT, &ran, tasks).await
}

/// Spawns [`SAME_KEY_CALLS`] calls that leave together: each future `send` makes waits on the
/// barrier it is given once it is ready to send.
pub(crate) fn at_once<Fut>(send: impl Fn(Arc<Barrier>) -> Fut) -> JoinSet<Fut::Output>
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(SAME_KEY_CALLS));
    let mut tasks = JoinSet::new();
    for _ in 0..SAME_KEY_CALLS {
        tasks.spawn(send(barrier.clone()));
    }
    tasks
}

async fn same_key_counts(
    library: &'static str,
    ran: &AtomicU64,
    mut tasks: JoinSet<Result<&'static str, BenchError>>,
) -> Result<SameKey, BenchError> {
    let mut counts = std::collections::BTreeMap::<&str, u64>::new();
    while let Some(done) = tasks.join_next().await {
        *counts.entry(done??).or_default() += 1;
    }
    Ok(SameKey {
        library,
        ran: ran.load(Ordering::SeqCst),
        others: counts
            .iter()
            .filter(|(what, _)| **what != "ran")
            .map(|(what, n)| format!("{n} × {what}"))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Runs `variants` and the baseline interleaved and adds their rows, each with its library's
/// same-key note (and, for idem, its ratio to the peer measured in the same slices).
pub(crate) async fn compare(
    store: &'static str,
    workload: Workload,
    variants: &[(&'static str, Op, String)],
    baseline: (&'static str, Op, String),
    concurrency: usize,
    timing: Timing,
    rows: &mut Vec<Row>,
) -> Result<(), BenchError> {
    let mut ops: Vec<&Op> = variants.iter().map(|(_, op, _)| op).collect();
    ops.push(&baseline.1);
    let mut samples = interleaved(&ops, concurrency, timing, Cpu::default()).await?;
    let Some(mut base) = samples.pop() else {
        return Err(BenchError::Unexpected("no baseline sample".into()));
    };
    for ((variant, _, note), sample) in variants.iter().zip(&mut samples) {
        let mut row = Row::new(store, workload, variant, concurrency, sample, Some(&base));
        row.note = note.clone();
        rows.push(row);
    }
    let mut row = Row::new(store, workload, baseline.0, concurrency, &mut base, None);
    row.note = baseline.2;
    rows.push(row);
    Ok(())
}

/// The requests of one concurrency's HTTP rows: the keys completed ahead (replays) and the
/// sessions new keys are sent from.
struct Requests<'a> {
    completed: &'a Arc<Vec<Call>>,
    sessions: &'a Arc<Vec<Arc<str>>>,
    concurrency: usize,
    timing: Timing,
}

/// The fresh and replay rows of `variants` (each its row's name, its server and its note)
/// against the bare app `bare` (its server and note), under `store`; `after` runs on the rows
/// once each workload's are added.
async fn http_rows(
    store: &'static str,
    variants: &[(&'static str, &Server, String)],
    bare: (&Server, &str),
    requests: &Requests<'_>,
    rows: &mut Vec<Row>,
    after: impl Fn(&mut [Row]),
) -> Result<(), BenchError> {
    for workload in [Workload::Fresh, Workload::Replay] {
        let op = |server: &Server| match workload {
            Workload::Replay => http_replay(server, requests.completed),
            _ => http_fresh(server, requests.sessions),
        };
        let ops: Vec<_> = variants
            .iter()
            .map(|(name, server, note)| (*name, op(server), note.clone()))
            .collect();
        let baseline = (BARE, op(bare.0), bare.1.to_owned());
        let (c, timing) = (requests.concurrency, requests.timing);
        compare(store, workload, &ops, baseline, c, timing, rows).await?;
        after(rows);
    }
    Ok(())
}

/// Prefixes the note of the idem layer's row, among the last three (idem, axum-idempotent,
/// bare), with its throughput over axum-idempotent's, measured in the same slices.
fn note_idem_over_peer(rows: &mut [Row]) {
    let [.., idem, peer, _bare] = rows else {
        return;
    };
    note_over(idem, peer, "axum-idempotent");
}

/// Prefixes `idem`'s note with its throughput over `other`'s, measured in the same slices.
fn note_over(idem: &mut Row, other: &Row, what: &str) {
    if other.ops_per_sec > 0.0 {
        let x = idem.ops_per_sec / other.ops_per_sec;
        idem.note = match idem.note.as_str() {
            "" => format!("÷ {what} {x:.2}"),
            note => format!("÷ {what} {x:.2}; {note}"),
        };
    }
}

/// The peers' rows: the same-key runs, then the HTTP rows and the engine rows at 1, 8 and 32
/// tasks; the same-key results are also returned for the report's own table.
pub(crate) async fn run(plan: &Plan, rows: &mut Vec<Row>) -> Result<Vec<SameKey>, BenchError> {
    let timing = plan.timing;
    let sessions: Arc<Vec<Arc<str>>> =
        Arc::new((0..SESSIONS).map(|_| Arc::from(session_id())).collect());

    // Same key, on servers and stores of their own.
    eprintln!("peers: {SAME_KEY_CALLS} concurrent calls with one key");
    let mut same_key = Vec::new();
    for (flavor, library) in [
        (Flavor::Idem, IDEM_LAYER),
        (Flavor::AxumIdempotent, AXUM_IDEMPOTENT),
        (Flavor::Bare, BARE),
    ] {
        let server = Server::start(flavor).await?;
        let found = http_same_key(&server, library).await;
        server.shut_down().await?;
        same_key.push(found?);
    }
    same_key.push(engine_same_key(&Idempotency::new(MemoryStore::new())).await?);
    same_key.push(peer_same_key(&Arc::new(PeerStore::new(1024, Duration::from_secs(60)))).await?);
    let note = |library: &str| SameKey::note_of(&same_key, library);

    for c in CONCURRENCY {
        // New servers and stores at each concurrency, so the keys stored by the runs before do
        // not weigh on these.
        eprintln!("peers: HTTP fresh and replay, {c} tasks");
        let bare = Server::start(Flavor::Bare).await?;
        let spin = Server::start(Flavor::BareSpin).await?;
        let unread = Server::start(Flavor::BareUnread).await?;
        let idem = Server::start(Flavor::Idem).await?;
        let axum = Server::start(Flavor::AxumIdempotent).await?;
        let completed: Arc<Vec<Call>> = Arc::new(
            (0..plan.replay_keys)
                .map(|_| Call::new(&sessions))
                .collect::<Result<_, _>>()?,
        );
        complete_ahead(&idem, &completed).await?;
        complete_ahead(&axum, &completed).await?;
        let requests = Requests {
            completed: &completed,
            sessions: &sessions,
            concurrency: c,
            timing,
        };
        // The calibration rows first: `note_idem_over_peer` reads the last three.
        let variants = [
            (BARE_SPIN, &spin, String::new()),
            (BARE_UNREAD, &unread, String::new()),
            (IDEM_LAYER, &idem, note(IDEM_LAYER)),
            (AXUM_IDEMPOTENT, &axum, note(AXUM_IDEMPOTENT)),
        ];
        let bare_note = note(BARE);
        let outcome = http_rows(
            HTTP,
            &variants,
            (&bare, &bare_note),
            &requests,
            rows,
            note_idem_over_peer,
        )
        .await;
        for server in [spin, unread, idem, axum] {
            server.shut_down().await?;
        }
        outcome?;

        // The same app on SQLite: behind idem's layer and idempotent by hand, each on a database
        // file of its own, against the bare app.
        eprintln!("peers: HTTP on SQLite, fresh and replay, {c} tasks");
        let dir = tempfile::tempdir()?;
        let idem = sqlite_server(Flavor::IdemSqlite, &dir.path().join("idem.db")).await?;
        let by_hand = sqlite_server(Flavor::ByHand, &dir.path().join("by-hand.db")).await?;
        complete_ahead(&idem, &completed).await?;
        complete_ahead(&by_hand, &completed).await?;
        let variants = [
            (IDEM_LAYER, &idem, String::new()),
            (BY_HAND, &by_hand, String::new()),
        ];
        let outcome = http_rows(
            HTTP_SQLITE,
            &variants,
            (&bare, ""),
            &requests,
            rows,
            |rows| {
                if let [.., idem, by_hand, _bare] = rows {
                    note_over(idem, by_hand, "by hand");
                }
            },
        )
        .await;
        for server in [bare, idem, by_hand] {
            server.shut_down().await?;
        }
        outcome?;

        eprintln!("peers: engine fresh and replay, {c} tasks");
        let engine = Idempotency::new(MemoryStore::new());
        let peer = Arc::new(PeerStore::new(1024, Duration::from_secs(60)));
        let keys: Arc<Vec<String>> = Arc::new(
            (0..plan.replay_keys)
                .map(|_| format!("{:032x}", fastrand::u128(..)))
                .collect(),
        );
        for (i, client_key) in keys.iter().enumerate() {
            let key = Key::derive(SCOPE, "", client_key).map_err(Error::from)?;
            let seed = i as u64;
            engine
                .call(key)
                .run(async move { Ok::<_, Error>(work(seed)) })
                .await?;
            peer_run(&peer, client_key, seed, async {}).await?;
        }
        let fresh = [(IDEM_ENGINE, engine_fresh(&engine), note(IDEM_ENGINE))];
        let baseline = (IDEMPOTENT, peer_fresh(&peer), note(IDEMPOTENT));
        compare(ENGINE, Workload::Fresh, &fresh, baseline, c, timing, rows).await?;
        let replay = [(
            IDEM_ENGINE,
            engine_replay(&engine, &keys),
            note(IDEM_ENGINE),
        )];
        let baseline = (IDEMPOTENT, peer_replay(&peer, &keys), note(IDEMPOTENT));
        compare(ENGINE, Workload::Replay, &replay, baseline, c, timing, rows).await?;
    }
    Ok(same_key)
}
