//! The conformance suite through the network: `idem::RemoteStore` pointed at a real
//! idem-server, in process on a loopback port (`axum::serve`), over a memory store, over SQLite
//! (a fresh file per rule) and over PostgreSQL (a fresh table per rule in the server `IDEM_TEST_PG_URL` names;
//! without it the PostgreSQL rules skip, saying why, unless `IDEM_REQUIRE_PG=1`, set by
//! `scripts/test`, makes that a failure). Every rule of the suite runs: the store rules through
//! the `Store` trait over HTTP, the engine's promises with the server as the store, and the
//! steps. No server process is mocked: each request crosses a TCP connection to the server's
//! routes, which run the server's engine over the real store.

use std::sync::Arc;

use async_trait::async_trait;
use std::time::Duration;

use idem::{RemoteStore, RemoteStoreBuilder};
use idem_core::conformance::{suite, Harness};
use idem_core::{ClaimOutcome, ClaimRequest, Error, Key, Store, StoreErrorKind};
use idem_server::{auth::Tokens, router, App, Config};

/// The admin token: the only one that may prune, which the suite's prune rules do.
const ADMIN: &str = "admin-token-0123456789";

/// A caller's token.
const ALICE: &str = "alice-token-0123456789";

/// An idem-server over `store` on a free loopback port, and a `RemoteStore` on it; the server
/// stops when this is dropped.
struct Served {
    remote: RemoteStore,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn over(store: Arc<dyn Store>) -> Served {
        Served::with(store, Config::default(), |b| b).await
    }

    /// The server over `store` with `config`, and a `RemoteStore` on it made by `remote`.
    async fn with(
        store: Arc<dyn Store>,
        config: Config,
        remote: impl FnOnce(RemoteStoreBuilder) -> RemoteStoreBuilder,
    ) -> Served {
        let tokens = Tokens::new(ADMIN, &[format!("alice={ALICE}")]).expect("tokens long enough");
        let app = App::new(store, tokens, config, None).expect("the server's engine");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let address = listener.local_addr().expect("the bound address");
        let task = tokio::spawn(async move {
            axum::serve(listener, router(app))
                .await
                .expect("the server runs until the test ends");
        });
        let remote = remote(RemoteStore::builder(format!("http://{address}"), ADMIN))
            .build()
            .expect("a loopback address builds");
        Served { remote, task }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The server over a SQLite store on a fresh file, without the store's background pruner (the
/// suite counts what `prune_expired` deletes).
pub struct SqliteRemote {
    served: Served,
    _dir: tempfile::TempDir,
}

#[async_trait]
impl Harness for SqliteRemote {
    async fn new() -> Option<Self> {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let store = idem_sql::SqliteStore::builder()
            .pruner(None)
            .open(dir.path().join("idem.db"))
            .await
            .expect("open a SQLite store on a fresh file");
        let served = Served::over(Arc::new(store)).await;
        Some(SqliteRemote { served, _dir: dir })
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.served.remote.clone())
    }

    /// RemoteStore does not carry the completer's query (docs/steps.md, "Completer").
    fn finds_abandoned(&self) -> bool {
        false
    }
}

suite!(
    over_sqlite,
    crate::SqliteRemote,
    (flavor = "multi_thread", worker_threads = 2)
);

/// The server over a memory store: the whole suite through the network on the store that
/// defines the rules, so what fails over SQLite or PostgreSQL and not here is theirs, not the
/// protocol's.
pub struct MemoryRemote {
    served: Served,
}

#[async_trait]
impl Harness for MemoryRemote {
    async fn new() -> Option<Self> {
        let served = Served::over(Arc::new(idem_core::MemoryStore::new())).await;
        Some(MemoryRemote { served })
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.served.remote.clone())
    }

    /// RemoteStore does not carry the completer's query (docs/steps.md, "Completer").
    fn finds_abandoned(&self) -> bool {
        false
    }
}

suite!(
    over_memory,
    crate::MemoryRemote,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use idem_test_support::postgres::{drop_store_tables_now, fresh_store, pg_url};

    /// The server over a PostgreSQL store on a table of its own, without the background
    /// pruner; the tables are dropped with the harness.
    pub struct PgRemote {
        served: Served,
        url: String,
        table: String,
    }

    #[async_trait]
    impl Harness for PgRemote {
        async fn new() -> Option<Self> {
            let url = pg_url(&idem_test_support::current_test())?;
            let store = fresh_store(&url, |b| b.pruner(None)).await;
            let table = store.table().to_owned();
            let served = Served::over(Arc::new(store)).await;
            Some(PgRemote { served, url, table })
        }

        fn store(&self) -> Arc<dyn Store> {
            Arc::new(self.served.remote.clone())
        }

        /// RemoteStore does not carry the completer's query (docs/steps.md, "Completer").
        fn finds_abandoned(&self) -> bool {
            false
        }
    }

    impl Drop for PgRemote {
        fn drop(&mut self) {
            self.served.task.abort();
            drop_store_tables_now(&self.url, &self.table);
        }
    }
}

#[cfg(feature = "postgres")]
suite!(
    over_postgres,
    crate::postgres::PgRemote,
    (flavor = "multi_thread", worker_threads = 2)
);

/// The kind of a store error, and its message.
fn store_error<T: std::fmt::Debug>(result: Result<T, Error>) -> (StoreErrorKind, String) {
    match result {
        Err(Error::Store(e)) => (e.kind(), e.to_string()),
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// What is not a rule of the suite but of the network: a server that cannot be reached, or
/// does not answer in time, is `Unavailable`; a token it does not know and a caller's prune
/// are `Unauthorized`, naming the server, and not retried; an unknown namespace is a `Query`
/// refusal with the server's words; callers' key spaces stay apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_network_and_the_servers_refusals_come_back_typed() {
    let harness = SqliteRemote::new().await.expect("a SQLite server");
    let server = harness.served.remote.server().to_owned();
    let key = Key::derive("remote", "", "k").expect("a valid key");
    let remote = |token: &str| {
        RemoteStore::builder(server.clone(), token)
            .build()
            .expect("a loopback address builds")
    };

    // Nothing listens on a port just released; a listener that never answers times out.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let down = RemoteStore::builder(format!("http://{closed}"), ADMIN)
        .build()
        .expect("builds");
    assert_eq!(
        store_error(down.get(&key).await).0,
        StoreErrorKind::Unavailable
    );
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let stalled = RemoteStore::builder(
        format!("http://{}", silent.local_addr().expect("address")),
        ADMIN,
    )
    .timeout(Duration::from_millis(200))
    .build()
    .expect("builds");
    let (kind, message) = store_error(
        stalled
            .claim(ClaimRequest::new(&key, Duration::from_secs(30)))
            .await,
    );
    assert_eq!(kind, StoreErrorKind::Unavailable);
    assert!(message.contains("no answer within"), "{message}");

    let (kind, message) = store_error(remote("not-a-token-we-know-0000").get(&key).await);
    assert_eq!(kind, StoreErrorKind::Unauthorized, "{message}");
    assert!(
        message.contains(&server) && message.contains("401 Unauthorized invalid_token"),
        "{message}"
    );
    assert!(!kind.is_transient(), "a wrong token is not retried");
    // Through the engine: the refusal reaches the caller at once, typed, and the work never
    // runs.
    let engine = idem_core::Idempotency::new(remote("not-a-token-we-know-0000"));
    let ran = std::sync::atomic::AtomicBool::new(false);
    let outcome = engine
        .call(key)
        .run(async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, idem_core::Error>(1)
        })
        .await;
    assert!(
        matches!(&outcome, Err(idem_core::Error::Store(e)) if e.kind() == StoreErrorKind::Unauthorized),
        "{outcome:?}"
    );
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    let alice = remote(ALICE);
    let (kind, message) = store_error(alice.prune_expired(10).await);
    assert_eq!(kind, StoreErrorKind::Unauthorized, "{message}");
    assert!(
        message.contains("403") && message.contains("admin token"),
        "{message}"
    );
    let nowhere = RemoteStore::builder(server.clone(), ALICE)
        .namespace("nowhere")
        .build()
        .expect("builds");
    let (kind, message) = store_error(nowhere.get(&key).await);
    assert_eq!(kind, StoreErrorKind::Query);
    assert!(message.contains("not_found"), "{message}");

    // The builder refuses a token no server takes; idem-server's minimum is the builder's.
    assert_eq!(
        RemoteStoreBuilder::MIN_TOKEN_LEN,
        idem_server::auth::MIN_TOKEN_LEN
    );
    let short = RemoteStore::builder(server.clone(), "abc").build();
    assert!(
        matches!(&short, Err(idem_core::Error::InvalidConfig(m)) if m.contains("at least 16")),
        "{short:?}"
    );

    // Alice's key is hers: the admin's same key is another record.
    let started = alice
        .claim(ClaimRequest::new(&key, Duration::from_secs(30)))
        .await;
    assert!(
        matches!(started, Ok(ClaimOutcome::Claimed(_))),
        "{started:?}"
    );
    assert!(harness
        .served
        .remote
        .get(&key)
        .await
        .expect("get")
        .is_none());
    assert!(alice.get(&key).await.expect("get").is_some());
    let admin_start = harness
        .served
        .remote
        .claim(ClaimRequest::new(&key, Duration::from_secs(30)))
        .await;
    assert!(
        matches!(admin_start, Ok(ClaimOutcome::Claimed(_))),
        "{admin_start:?}"
    );
}

/// A memory store whose completions fail for a passing reason while `down` is set.
struct Flaky {
    records: idem_core::MemoryStore,
    down: std::sync::atomic::AtomicBool,
}

impl idem_core::store::Forward for Flaky {
    fn inner(&self) -> &dyn Store {
        &self.records
    }

    fn gate(&self, op: idem_core::store::Operation) -> Result<(), Error> {
        let down = self.down.load(std::sync::atomic::Ordering::SeqCst);
        if down && op == idem_core::store::Operation::Complete {
            return Err(Error::Store(idem_core::StoreError::new(
                StoreErrorKind::Unavailable,
                "injected: the store is down",
            )));
        }
        Ok(())
    }
}

/// **Observed commits** through the network: a completion the server's store refuses for a
/// passing reason is `Unavailable` to `RemoteStore`, nothing is stored and the claim stays
/// held, and the same completion once the store is back lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_is_reported_only_once_it_committed() {
    let flaky = Arc::new(idem_core::store::Forwarding(Flaky {
        records: idem_core::MemoryStore::new(),
        down: std::sync::atomic::AtomicBool::new(false),
    }));
    let served = Served::over(flaky.clone()).await;
    let store = &served.remote;
    let key = Key::derive("remote", "", "observed").expect("a valid key");
    let Ok(ClaimOutcome::Claimed(claim)) = store
        .claim(ClaimRequest::new(&key, Duration::from_secs(30)))
        .await
    else {
        panic!("a new key is claimable");
    };
    let done = idem_core::Completion {
        response: Some(b"paid"),
        is_error: false,
        retention: Duration::from_secs(60),
        key_retention: Duration::ZERO,
    };
    flaky
        .0
        .down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let refused = store.complete(&claim, done).await;
    assert_eq!(store_error(refused).0, StoreErrorKind::Unavailable);
    let record = store.get(&key).await.expect("get").expect("still claimed");
    assert!(
        matches!(record.state, idem_core::RecordState::InProgress { token, .. } if token == claim.token()),
        "{record:?}"
    );
    flaky
        .0
        .down
        .store(false, std::sync::atomic::Ordering::SeqCst);
    store
        .complete(&claim, done)
        .await
        .expect("the same completion lands once the store is back");
    let replay = store
        .claim(ClaimRequest::new(&key, Duration::from_secs(30)))
        .await;
    assert!(
        matches!(&replay, Ok(ClaimOutcome::Completed(kept)) if kept.response.as_deref() == Some(&b"paid"[..])),
        "{replay:?}"
    );
}

/// A memory store that keeps responses of at most 1 KiB, as a DynamoDB-backed server keeps at
/// most 400 KB: the server's engine learns the limit.
struct Small {
    records: idem_core::MemoryStore,
}

impl idem_core::store::Forward for Small {
    fn inner(&self) -> &dyn Store {
        &self.records
    }

    fn max_response_bytes(&self) -> Option<usize> {
        Some(1024)
    }
}

/// **Not retained, through the network.** A result the server's store cannot keep is kept by
/// the server's engine as "not retained"; the caller that ran it gets it, and every retry
/// through `RemoteStore` (its `start` and its `get`) is told so, typed, and never runs the work
/// again. (Before the fenced `start` carried `not_retained`, a retry read an empty response
/// as a damaged record.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_servers_store_cannot_keep_is_not_retained_and_never_reruns() {
    let small = Arc::new(idem_core::store::Forwarding(Small {
        records: idem_core::MemoryStore::new(),
    }));
    let served = Served::over(small).await;
    let engine = idem_core::Idempotency::new(served.remote.clone());
    let key = Key::derive("remote", "", "too-large-for-the-server").expect("a valid key");
    let reason = idem_core::conformance::unretained_result_never_reruns(&engine, key, 4096).await;
    assert!(
        reason.contains("more than the store keeps in a record (1024)"),
        "{reason}"
    );
    let record = served
        .remote
        .get(&key)
        .await
        .expect("get")
        .expect("completed");
    let idem_core::RecordState::Completed(kept) = record.state else {
        panic!("the key completed: {record:?}");
    };
    assert_eq!(kept.not_retained.as_deref(), Some(reason.as_str()));
    assert!(matches!(kept.result(), Err(Error::ResultNotRetained { reason: r }) if r == reason));
}

/// **Not retained before it is sent.** A result larger than the server takes in a request
/// (`RemoteStoreBuilder::max_response_bytes`, the server's `--max-body-bytes` less 4 KiB) is
/// kept as "not retained" by the caller's engine, which never sends what the server would
/// refuse with `413` after the work ran (a completion that failed so would have let a retry run
/// the work again). The raw store refuses such a completion, typed, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_over_the_servers_body_limit_is_not_retained_and_never_reruns() {
    let config = Config {
        max_body_bytes: 8192,
        ..Config::default()
    };
    let store: Arc<dyn Store> = Arc::new(idem_core::MemoryStore::new());
    let served = Served::with(store, config, |b| b.max_response_bytes(8192 - 4096)).await;
    assert_eq!(served.remote.max_response_bytes(), Some(4096));
    let engine = idem_core::Idempotency::new(served.remote.clone());
    let key = Key::derive("remote", "", "over-the-body-limit").expect("a valid key");
    let reason = idem_core::conformance::unretained_result_never_reruns(&engine, key, 6000).await;
    assert!(
        reason.contains("more than the store keeps in a record (4096)"),
        "{reason}"
    );
    // The raw store: refused before anything is sent.
    let other = Key::derive("remote", "", "raw-over-the-limit").expect("a valid key");
    let Ok(ClaimOutcome::Claimed(claim)) = served
        .remote
        .claim(ClaimRequest::new(&other, Duration::from_secs(30)))
        .await
    else {
        panic!("a new key is claimable");
    };
    let big = vec![7; 5000];
    let refused = served
        .remote
        .complete(
            &claim,
            idem_core::Completion {
                response: Some(&big),
                is_error: false,
                retention: Duration::from_secs(60),
                key_retention: Duration::ZERO,
            },
        )
        .await;
    let (kind, message) = store_error(refused);
    assert_eq!(kind, StoreErrorKind::Query);
    assert!(
        message.contains("at most 4096 bytes, not 5000"),
        "{message}"
    );
    let record = served
        .remote
        .get(&other)
        .await
        .expect("get")
        .expect("claimed");
    assert!(
        matches!(record.state, idem_core::RecordState::InProgress { token, .. } if token == claim.token()),
        "{record:?}"
    );
}

/// A Rust service's HTTP layer with the server as its store: the first request with a key runs
/// the handler, a retry with the same key replays its response from the server's store, marked
/// replayed, and another caller's same key runs on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_layer_runs_once_with_the_server_as_its_store() {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let harness = SqliteRemote::new().await.expect("a SQLite server");
    let engine = idem_core::Idempotency::new(
        RemoteStore::builder(harness.served.remote.server(), ALICE)
            .build()
            .expect("builds"),
    );
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let app = axum::Router::new()
        .route(
            "/payments",
            axum::routing::post(move || {
                let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                async move { format!("payment {n}") }
            }),
        )
        .layer(
            idem_tower::http::IdempotencyLayer::builder(engine)
                .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
                .build()
                .expect("a layer scoped by caller"),
        );
    let send = |caller: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::post("/payments")
                .header("idempotency-key", "pay-1")
                .header("x-api-key", caller)
                .body(Body::from("{}"))
                .expect("a request");
            let response = app.oneshot(request).await.expect("an answer");
            let replayed = response.headers().contains_key("idempotent-replayed");
            let body = response
                .into_body()
                .collect()
                .await
                .expect("a body")
                .to_bytes();
            (String::from_utf8_lossy(&body).into_owned(), replayed)
        }
    };
    assert_eq!(send("tenant-a").await, ("payment 1".to_owned(), false));
    assert_eq!(send("tenant-a").await, ("payment 1".to_owned(), true));
    assert_eq!(send("tenant-b").await, ("payment 2".to_owned(), false));
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
}
