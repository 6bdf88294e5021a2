//! `OffloadStore` on every store (memory, SQLite, PostgreSQL, Redis on one server and on a
//! Cluster, DynamoDB on moto, and `RemoteStore` through an idem-server in process) with both
//! object backends: a local directory (object_store's `LocalFileSystem` in a temporary
//! directory) and S3 served by moto (`IDEM_TEST_S3_URL`; without it the S3 cases skip, saying
//! why, unless `IDEM_REQUIRE_S3=1`, set by `scripts/test`, makes that a failure).
//!
//! On each: an engine's result and an HTTP response (through the axum layer) of 8 MiB and of
//! 100 MiB replay byte for byte and their work runs once; a step's result resumes from its
//! object; a process killed between the upload and the record leaves an orphan and a lease
//! that lapses, and the retry replays its own result, never the orphan's; a record whose object
//! was replaced or deleted is a typed `Corrupt` error, never a replay nor a second run; pruning
//! removes ended objects and keeps live ones. DynamoDB keeps a 5 MiB response. The memory store
//! runs pruning on a manual clock, to the second.
//!
//! Each case prints a `[timing]` line (`cargo test -- --nocapture` shows them).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use idem::http::IdempotencyLayer;
use idem::object_store::aws::AmazonS3Builder;
use idem::object_store::local::LocalFileSystem;
use idem::object_store::path::Path;
use idem::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use idem::store::{Forward, Forwarding};
use idem::{
    Claim, ClaimOutcome, ClaimRequest, Completion, Error, Idempotency, Key, ManualClock,
    MemoryStore, OffloadStore, OnLocked, Pruner, PrunerConfig, Record, RecordState, RemoteStore,
    Store, StoreError, StoreErrorKind,
};
use idem_server::{auth::Tokens, router, App, Config};
use idem_test_support::stores::{self, Leftover};
use idem_test_support::{eventually, setting, unique_name, within};
use tower::ServiceExt;

const MIB: usize = 1 << 20;

/// The S3 test bucket: created once per server (a second create is refused, and ignored).
const BUCKET: &str = "idem-offload-tests";

/// Where a case's objects go: a backend, and a prefix of the case's own.
struct Bucket {
    objects: Arc<dyn ObjectStore>,
    prefix: String,
    name: &'static str,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Clone, Copy)]
enum Backend {
    Local,
    S3,
}

impl Bucket {
    /// The backend, or `None` after saying why the case skips (S3 without its server).
    async fn new(backend: Backend) -> Option<Bucket> {
        let prefix = unique_name("case");
        match backend {
            Backend::Local => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let local = LocalFileSystem::new_with_prefix(dir.path())
                    .expect("the directory exists")
                    .with_automatic_cleanup(true);
                Some(Bucket {
                    objects: Arc::new(local),
                    prefix,
                    name: "local",
                    _dir: Some(dir),
                })
            }
            Backend::S3 => {
                let test = idem_test_support::current_test();
                let url = setting(&test, "IDEM_TEST_S3_URL", "IDEM_REQUIRE_S3")?;
                // object_store creates no buckets: moto takes an unsigned request.
                reqwest::Client::new()
                    .put(format!("{url}/{BUCKET}"))
                    .send()
                    .await
                    .expect("moto answers");
                let s3 = AmazonS3Builder::new()
                    .with_endpoint(&url)
                    .with_allow_http(true)
                    .with_virtual_hosted_style_request(false)
                    .with_region("us-east-1")
                    .with_access_key_id("idem-test")
                    .with_secret_access_key("idem-test")
                    .with_bucket_name(BUCKET)
                    .build()
                    .expect("an S3 client of moto");
                Some(Bucket {
                    objects: Arc::new(s3),
                    prefix,
                    name: "s3",
                    _dir: None,
                })
            }
        }
    }

    /// `store` wrapped so that large results go to this bucket.
    fn offload<S: Store>(&self, store: S) -> Forwarding<OffloadStore<S>> {
        OffloadStore::builder(store, self.objects.clone())
            .prefix(&self.prefix)
            .build()
            .expect("a valid OffloadStore")
    }

    /// Every object under the case's prefix, by name.
    async fn listed(&self) -> Vec<Path> {
        let prefix = Path::from(self.prefix.as_str());
        let mut found: Vec<Path> = self
            .objects
            .list(Some(&prefix))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await
            .expect("list the case's objects");
        found.sort();
        found
    }

    /// Deletes the case's objects (moto keeps them in memory).
    async fn empty(self) {
        for location in self.listed().await {
            let _ = self.objects.delete(&location).await;
        }
    }
}

use futures_util::TryStreamExt;

/// `len` lowercase letters, different for each `seed`, none of its 64 KiB blocks alike (each is
/// one random block turned by another amount), so a shifted, truncated or reordered copy
/// differs. Made of block copies: a 100 MiB value costs little even in a debug build.
fn letters(len: usize, seed: u64) -> String {
    const BLOCK: usize = 64 * 1024;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let block: Vec<u8> = (0..BLOCK)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect();
    let mut bytes = Vec::with_capacity(len + BLOCK);
    for turn in (0..).map(|i: usize| i.wrapping_mul(7_919) % BLOCK) {
        if bytes.len() >= len {
            break;
        }
        bytes.extend_from_slice(&block[turn..]);
        bytes.extend_from_slice(&block[..turn]);
    }
    bytes.truncate(len);
    String::from_utf8(bytes).expect("letters are UTF-8")
}

fn key(name: &str) -> Key {
    Key::derive("offload", "", name).expect("a valid key")
}

/// The result `name`'s call replays (its work, which would answer nothing, does not run).
async fn replays(engine: &Idempotency, name: &str) -> String {
    let replayed = engine
        .call(key(name))
        .run(async { Ok::<_, Error>(String::new()) })
        .await
        .expect("a replay");
    assert!(replayed.is_replayed(), "{name} replays");
    replayed.into_inner()
}

fn is_corrupt<T: std::fmt::Debug>(result: &Result<T, Error>) -> bool {
    matches!(result, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Corrupt)
}

/// The cases, each on a fresh store (`store`, named `on`) and a bucket of its own.
mod cases {
    use super::*;

    /// An engine's result of `size` bytes (a JSON string) replays byte for byte on a second
    /// call, whose work does not run; the record points at one object of the result's size.
    pub async fn engine_result(on: &str, store: Arc<dyn Store>, bucket: &Bucket, size: usize) {
        let engine = Idempotency::new(bucket.offload(store));
        assert_eq!(engine.policy().max_response_bytes(), 1 << 30);
        let value = letters(size, 1);
        let runs = AtomicUsize::new(0);
        let work = |value: String| {
            let runs = &runs;
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(value)
            }
        };
        let started = Instant::now();
        let first = engine.call(key("result")).run(work(value.clone())).await;
        let stored = started.elapsed();
        assert!(!first.expect("the first call runs").is_replayed());
        let started = Instant::now();
        let again = engine.call(key("result")).run(work(String::new())).await;
        let replayed = started.elapsed();
        let again = again.expect("the second call replays");
        assert!(again.is_replayed());
        assert!(
            again.into_inner() == value,
            "the replay is the result, byte for byte"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let objects = bucket.listed().await;
        assert_eq!(objects.len(), 1, "{objects:?}");
        let meta = bucket.objects.head(&objects[0]).await.expect("the object");
        // The engine's envelope (6 bytes) around the JSON string (2 quotes).
        assert_eq!(meta.size, size as u64 + 8);
        eprintln!(
            "[timing] {on} {} engine {} MiB: first call {stored:.2?}, replay {replayed:.2?}",
            bucket.name,
            size / MIB
        );
    }

    /// An HTTP response of `size` bytes through the axum layer replays byte for byte; the
    /// handler runs once. The layer's limit follows the engine's, which follows the store's.
    pub async fn http_response(on: &str, store: Arc<dyn Store>, bucket: &Bucket, size: usize) {
        let engine = Idempotency::new(bucket.offload(store));
        let body = Bytes::from(letters(size, 2));
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (body, runs) = (body.clone(), runs.clone());
            move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                body
            }
        };
        let layer = IdempotencyLayer::builder(engine)
            .shared_key_space()
            .build()
            .expect("a layer");
        let app = Router::new().route("/report", post(handler)).layer(layer);
        let mut took = Vec::new();
        for _ in 0..2 {
            let request = Request::post("/report")
                .header("idempotency-key", "report-1")
                .body(Body::empty())
                .expect("a request");
            let started = Instant::now();
            let response = app.clone().oneshot(request).await.expect("an answer");
            assert_eq!(response.status(), StatusCode::OK);
            let got = response
                .into_body()
                .collect()
                .await
                .expect("the body")
                .to_bytes();
            took.push(started.elapsed());
            assert!(got == body, "the response is the handler's, byte for byte");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
        assert_eq!(bucket.listed().await.len(), 1);
        eprintln!(
            "[timing] {on} {} http {} MiB: first request {:.2?}, replay {:.2?}",
            bucket.name,
            size / MIB,
            took[0],
            took[1]
        );
    }

    /// A step's large result goes to an object: a retry after the work failed resumes with it
    /// (read back from the object) and does not run the step again.
    pub async fn step_result(on: &str, store: Arc<dyn Store>, bucket: &Bucket) {
        let engine = Idempotency::new(bucket.offload(store));
        let quote = letters(MIB, 3);
        let (steps_run, attempts) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let attempt = || {
            engine.call(key("steps")).run_steps(|steps| {
                let (quote, steps_run, attempts) = (&quote, &steps_run, &attempts);
                async move {
                    let got: String = steps
                        .run("quote", || async move {
                            steps_run.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Error>(quote.clone())
                        })
                        .await?;
                    if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Err(Error::InvalidStep("the first attempt fails".into()));
                    }
                    Ok::<_, Error>(got.len())
                }
            })
        };
        assert!(
            attempt().await.is_err(),
            "the first attempt fails after its step"
        );
        let done = attempt().await.expect("the second attempt resumes");
        assert_eq!(done.into_inner(), MIB);
        assert_eq!(steps_run.load(Ordering::SeqCst), 1, "the step ran once");
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        eprintln!("[timing] {on} {} steps: ok", bucket.name);
    }

    /// The process dies between the upload and the record: its object is an orphan, its
    /// record stays in progress until its lease lapses, and the retry runs the work again and
    /// replays its own result, never the orphan's. Then a record whose object was replaced or
    /// deleted reads as `Corrupt`, and nothing runs.
    pub async fn killed_between_upload_and_record(
        on: &str,
        store: Arc<dyn Store>,
        bucket: &Bucket,
    ) {
        // Long enough that the record still reads as in progress after the upload and the
        // kill on a loaded machine (scaled as the conformance rules' leases are).
        let lease = idem::conformance::scaled(Duration::from_secs(2));
        let (entered, mut upload_done) = tokio::sync::mpsc::unbounded_channel();
        let hung = Forwarding(Hang {
            inner: store.clone(),
            entered,
            home: tokio::runtime::Handle::current(),
        });
        let dying = Idempotency::new(bucket.offload(hung));
        let orphan_value = letters(MIB, 4);
        // The process that dies: a runtime of its own, shut down under the call.
        let process = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let (first_runs, value) = (Arc::new(AtomicUsize::new(0)), orphan_value.clone());
        let runs = first_runs.clone();
        process.spawn(async move {
            let _ = dying
                .call(key("killed"))
                .lease(lease)
                .run(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(value)
                })
                .await;
        });
        within("the upload, then the record's complete", upload_done.recv()).await;
        process.shutdown_background();
        assert_eq!(first_runs.load(Ordering::SeqCst), 1);

        // The record first, then the bucket: a listing of the bucket can take seconds on a
        // loaded machine, and a store that drops a claim when its lease lapses (Redis) would
        // no longer have the record to show.
        let offloaded = bucket.offload(store.clone());
        let record = offloaded.get(&key("killed")).await.expect("a read");
        assert!(
            matches!(
                record.map(|r| r.state),
                Some(RecordState::InProgress { .. })
            ),
            "the record was never completed"
        );
        let orphans = bucket.listed().await;
        assert_eq!(orphans.len(), 1, "the upload landed: {orphans:?}");

        // The retry waits out the dead claim's lease, runs, and replays its own result.
        let engine = Idempotency::new(offloaded);
        let retry_value = letters(MIB, 5);
        let runs = AtomicUsize::new(0);
        let call = |value: String| {
            let runs = &runs;
            engine
                .call(key("killed"))
                .lease(lease)
                .on_locked(OnLocked::Wait {
                    timeout: Duration::from_secs(30),
                })
                .run(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(value)
                })
        };
        let started = Instant::now();
        let retried = call(retry_value.clone()).await.expect("the retry runs");
        let waited = started.elapsed();
        assert!(!retried.is_replayed());
        let replayed = call(String::new()).await.expect("a replay");
        assert!(replayed.is_replayed());
        let replayed = replayed.into_inner();
        assert!(replayed == retry_value && replayed != orphan_value);
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // The retry's object, replaced by other bytes of its length, then of another, then gone.
        let objects = bucket.listed().await;
        let ours: Vec<&Path> = objects.iter().filter(|o| !orphans.contains(o)).collect();
        assert_eq!(ours.len(), 1, "{objects:?}");
        let ours = ours[0].clone();
        let meta = bucket.objects.head(&ours).await.expect("the object");
        let other = letters(meta.size as usize, 6);
        for replacement in [other.as_bytes(), &other.as_bytes()[1..]] {
            let payload = PutPayload::from(Bytes::copy_from_slice(replacement));
            bucket.objects.put(&ours, payload).await.expect("overwrite");
            let read = call(String::new()).await;
            assert!(is_corrupt(&read), "{:?}", read.map(|o| o.is_replayed()));
        }
        bucket.objects.delete(&ours).await.expect("delete");
        let read = call(String::new()).await;
        assert!(is_corrupt(&read), "{:?}", read.map(|o| o.is_replayed()));
        let message = read.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("missing"), "{message}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "nothing ran again");
        eprintln!(
            "[timing] {on} {} kill: the retry waited out the lease and ran in {waited:.2?}",
            bucket.name
        );
    }

    /// Pruning removes an ended result's object and keeps a live one's. The store keeps the
    /// records' time (a 1 s retention, waited out for real); the wrapper's clock, which names
    /// objects and ends their hours, is moved by the test.
    pub async fn pruning(on: &str, store: Arc<dyn Store>, bucket: &Bucket) {
        let clock = ManualClock::at(std::time::SystemTime::now());
        let offloaded = Arc::new(
            OffloadStore::builder(store.clone(), bucket.objects.clone())
                .prefix(&bucket.prefix)
                .clock(clock.clone())
                .build()
                .expect("a valid OffloadStore"),
        );
        let engine = Idempotency::from_arc(offloaded.clone());
        let run = |name: &'static str, retention: Duration| {
            engine
                .call(key(name))
                .retention(retention)
                .run(async { Ok::<_, Error>(letters(MIB, 7)) })
        };
        run("ends", Duration::from_secs(1)).await.expect("stored");
        run("lives", Duration::from_secs(86_400))
            .await
            .expect("stored");
        let both = bucket.listed().await;
        assert_eq!(both.len(), 2);
        let ended = eventually(|| async {
            !matches!(
                store.get(&key("ends")).await.map(|r| r.map(|r| r.state)),
                Ok(Some(RecordState::Completed(_)))
            )
        })
        .await;
        assert!(ended, "the 1 s retention ended");
        // Its hour, and the grace after it, have ended too; the live one's has not.
        clock.advance(Duration::from_secs(3 * 3600));
        let started = Instant::now();
        let mut deleted = 0;
        for _ in 0..10 {
            let pruned = offloaded.prune_expired(100).await.expect("prune");
            deleted += pruned;
            if pruned < 100 {
                break;
            }
        }
        let took = started.elapsed();
        assert!(deleted >= 1, "{deleted}");
        let left = bucket.listed().await;
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(replays(&engine, "lives").await == letters(MIB, 7));
        eprintln!("[timing] {on} {} prune: {took:.2?}", bucket.name);
    }

    /// DynamoDB keeps records of at most 400 KB; offloaded, a 5 MiB response is stored and
    /// replays (the same as [`http_response`]).
    pub async fn five_mib_response(on: &str, store: Arc<dyn Store>, bucket: &Bucket) {
        assert_eq!(store.max_response_bytes(), Some(399_730));
        http_response(on, store, bucket, 5 * MIB).await;
    }
}

/// A store whose `complete` never returns: the process dies there.
struct Hang {
    inner: Arc<dyn Store>,
    entered: tokio::sync::mpsc::UnboundedSender<()>,
    /// The test's own runtime, where the dying process's store calls run. A pool shares its
    /// connections between runtimes: one opened on the dying runtime is bound to its reactor and
    /// fails the retry's first call once that runtime is shut down ("a Tokio context ... is being
    /// shut down"), which a process killed for real, with connections of its own, never does.
    home: tokio::runtime::Handle,
}

impl Hang {
    async fn at_home<T: Send + 'static>(
        &self,
        call: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        self.home.spawn(call).await.expect("the store call ran")
    }
}

#[async_trait]
impl Forward for Hang {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        let (inner, key, fingerprint) = (
            self.inner.clone(),
            *request.key,
            request.fingerprint.copied(),
        );
        let (lease, on_lapse) = (request.lease, request.on_lapse);
        self.at_home(async move {
            let mut request = ClaimRequest::new(&key, lease);
            request.fingerprint = fingerprint.as_ref();
            request.on_lapse = on_lapse;
            inner.claim(request).await
        })
        .await
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        let (inner, claim) = (self.inner.clone(), claim.clone());
        self.at_home(async move { inner.renew(&claim, lease).await })
            .await
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        let (inner, claim) = (self.inner.clone(), claim.clone());
        self.at_home(async move { inner.abort(&claim).await }).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let (inner, key) = (self.inner.clone(), *key);
        self.at_home(async move { inner.get(&key).await }).await
    }

    async fn complete(&self, _claim: &Claim, _completion: Completion<'_>) -> Result<(), Error> {
        let _ = self.entered.send(());
        std::future::pending().await
    }
}

/// An idem-server over a SQLite store, in process on a loopback port, as the store
/// (`RemoteStore`, with the admin token so that it may prune); the server stops with it.
struct Served {
    remote: RemoteStore,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Forward for Served {
    fn inner(&self) -> &dyn Store {
        &self.remote
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const ADMIN: &str = "admin-token-0123456789";

async fn remote() -> Option<(Arc<dyn Store>, Leftover)> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite = idem::SqliteStore::builder()
        .pruner(None)
        .open(dir.path().join("idem.db"))
        .await
        .expect("a SQLite store");
    let tokens = Tokens::new(ADMIN, &[]).expect("a token long enough");
    let app = App::new(Arc::new(sqlite), tokens, Config::default(), None).expect("the server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("its address");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router(app)).await;
    });
    let remote = RemoteStore::builder(format!("http://{address}"), ADMIN)
        .build()
        .expect("a RemoteStore");
    let served = Served {
        remote,
        task,
        _dir: dir,
    };
    Some((Arc::new(Forwarding(served)), Leftover::Nothing))
}

/// For each store, a module with one test per case and backend, on a fresh store and bucket.
macro_rules! on_every_store {
    ($($store:ident => $make:path),* $(,)?) => {
        $(
            mod $store {
                use super::*;
                on_every_store!(@case $store, $make, engine_8_mib_local: engine_result(8 * MIB), Local);
                on_every_store!(@case $store, $make, engine_8_mib_s3: engine_result(8 * MIB), S3);
                on_every_store!(@case $store, $make, engine_100_mib_local: engine_result(100 * MIB), Local);
                on_every_store!(@case $store, $make, engine_100_mib_s3: engine_result(100 * MIB), S3);
                on_every_store!(@case $store, $make, http_8_mib_local: http_response(8 * MIB), Local);
                on_every_store!(@case $store, $make, http_8_mib_s3: http_response(8 * MIB), S3);
                on_every_store!(@case $store, $make, http_100_mib_local: http_response(100 * MIB), Local);
                on_every_store!(@case $store, $make, http_100_mib_s3: http_response(100 * MIB), S3);
                on_every_store!(@case $store, $make, steps_local: step_result(), Local);
                on_every_store!(@case $store, $make, steps_s3: step_result(), S3);
                on_every_store!(@case $store, $make, killed_between_upload_and_record_local: killed_between_upload_and_record(), Local);
                on_every_store!(@case $store, $make, killed_between_upload_and_record_s3: killed_between_upload_and_record(), S3);
                on_every_store!(@case $store, $make, pruning_local: pruning(), Local);
                on_every_store!(@case $store, $make, pruning_s3: pruning(), S3);
            }
        )*
    };
    (@case $store:ident, $make:path, $test:ident: $case:ident($($arg:expr),*), $backend:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let Some((store, leftover)) = $make().await else {
                return;
            };
            let Some(bucket) = Bucket::new(Backend::$backend).await else {
                return;
            };
            cases::$case(stringify!($store), store, &bucket $(, $arg)*).await;
            bucket.empty().await;
            leftover.remove().await;
        }
    };
}

on_every_store! {
    memory => stores::memory,
    sqlite => stores::sqlite,
    postgres => stores::postgres,
    redis => stores::redis_single,
    redis_cluster => stores::redis_cluster,
    dynamodb => stores::dynamodb,
    remote => remote,
}

mod dynamodb_5_mib {
    use super::*;
    on_every_store!(@case dynamodb, stores::dynamodb, response_local: five_mib_response(), Local);
    on_every_store!(@case dynamodb, stores::dynamodb, response_s3: five_mib_response(), S3);
}

/// A store whose answer to `complete` is lost (after it may have landed).
struct LostAnswer(MemoryStore);

#[async_trait]
impl Forward for LostAnswer {
    fn inner(&self) -> &dyn Store {
        &self.0
    }

    async fn complete(&self, _claim: &Claim, _completion: Completion<'_>) -> Result<(), Error> {
        Err(Error::Store(StoreError::new(
            StoreErrorKind::Unavailable,
            "the answer was lost",
        )))
    }
}

/// Pruning on the memory store and one manual clock, to the second: an ended result's object
/// goes once its hour and the grace have ended, not a second before, with an orphan of that
/// hour (a completion whose answer was lost keeps its object: the record may point at it); a
/// live result's stays. The `Pruner` drives it through `prune_expired`.
mod pruning_on_a_manual_clock {
    use super::*;

    async fn case(backend: Backend) {
        let Some(bucket) = Bucket::new(backend).await else {
            return;
        };
        let clock = ManualClock::new(); // 2030-01-01T00:00:00Z
        let build = |store| {
            OffloadStore::builder(store, bucket.objects.clone())
                .prefix(&bucket.prefix)
                .clock(clock.clone())
                .build()
                .expect("a valid OffloadStore")
        };
        let store = Arc::new(build(MemoryStore::with_clock(clock.clone())));
        let engine = Idempotency::from_arc(store.clone());
        let minutes = |m: u64| Duration::from_secs(60 * m);
        let big = letters(MIB, 8);
        for (name, retention) in [("ends", minutes(10)), ("lives", minutes(300))] {
            let value = big.clone();
            engine
                .call(key(name))
                .retention(retention)
                .run(async { Ok::<_, Error>(value) })
                .await
                .expect("stored");
        }
        // An orphan of the same hour as "ends": the store's answer to its completion was lost.
        let lost = build_lost(&bucket, &clock);
        let ClaimOutcome::Claimed(claim) = lost
            .claim(ClaimRequest::new(&key("lost"), minutes(1)))
            .await
            .expect("a claim")
        else {
            panic!("a new key is claimed");
        };
        let kept = lost
            .complete(&claim, Completion::new(Some(big.as_bytes()), minutes(10)))
            .await;
        assert!(matches!(&kept, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unavailable));
        assert_eq!(
            bucket.listed().await.len(),
            3,
            "the lost answer's object stays"
        );

        // 01:59:59: the hour 00 ended at 01:00, its grace has a second to run.
        clock.advance(Duration::from_secs(2 * 3600 - 1));
        assert_eq!(store.prune_objects(100).await.expect("prune"), 0);
        assert_eq!(bucket.listed().await.len(), 3);
        clock.advance(Duration::from_secs(1));
        let report = Pruner::records(store.clone(), PrunerConfig::new())
            .expect("a pruner")
            .run_once()
            .await
            .expect("a run");
        assert!(report.deleted >= 2, "{report:?}");
        let left = bucket.listed().await;
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(replays(&engine, "lives").await == big);
        // Its retention ended: the key is a tombstone (the engine's key retention), which
        // answers without its result's object.
        let ends = engine
            .call(key("ends"))
            .run(async { Ok::<_, Error>(String::from("again")) })
            .await;
        assert!(matches!(ends, Err(Error::ResultExpired { .. })), "{ends:?}");
        bucket.empty().await;
    }

    fn build_lost(bucket: &Bucket, clock: &ManualClock) -> impl Store + use<> {
        OffloadStore::builder(
            Forwarding(LostAnswer(MemoryStore::with_clock(clock.clone()))),
            bucket.objects.clone(),
        )
        .prefix(&bucket.prefix)
        .clock(clock.clone())
        .build()
        .expect("a valid OffloadStore")
    }

    #[tokio::test]
    async fn local() {
        case(Backend::Local).await;
    }

    #[tokio::test]
    async fn s3() {
        case(Backend::S3).await;
    }
}

/// The raw store API: a small value that starts as a pointer does is offloaded anyway, so no
/// value kept in a record is ever read as one; a small value stays in the record.
#[tokio::test]
async fn a_value_shaped_as_a_pointer_is_offloaded_however_small() {
    let Some(bucket) = Bucket::new(Backend::Local).await else {
        return;
    };
    let memory = MemoryStore::new();
    let store = bucket.offload(memory.clone());
    let lease = Duration::from_secs(30);
    for (name, value) in [("shaped", &b"\x8FIDEMOBJ and more"[..]), ("small", b"{}")] {
        let ClaimOutcome::Claimed(claim) = store
            .claim(ClaimRequest::new(&key(name), lease))
            .await
            .expect("a claim")
        else {
            panic!("a new key is claimed");
        };
        store
            .complete(
                &claim,
                Completion::new(Some(value), Duration::from_secs(60)),
            )
            .await
            .expect("completed");
        let Some(RecordState::Completed(stored)) = store
            .get(&key(name))
            .await
            .expect("a read")
            .map(|r| r.state)
        else {
            panic!("completed");
        };
        assert_eq!(stored.response.as_deref(), Some(value));
    }
    assert_eq!(bucket.listed().await.len(), 1, "only the shaped value went");
    let Some(RecordState::Completed(raw)) = memory
        .get(&key("small"))
        .await
        .expect("a read")
        .map(|r| r.state)
    else {
        panic!("completed");
    };
    assert_eq!(raw.response.as_deref(), Some(&b"{}"[..]), "kept in place");
}
