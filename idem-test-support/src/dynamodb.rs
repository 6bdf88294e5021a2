//! DynamoDB for a test: the shared server comes from `IDEM_TEST_DYNAMODB_URL` (an endpoint such
//! as `http://127.0.0.1:8000`, moto in server mode as `scripts/test` starts it); without it the
//! test prints `skipping <test>: IDEM_TEST_DYNAMODB_URL is not set` and returns, unless
//! `IDEM_REQUIRE_DYNAMODB=1` (set by `scripts/test`) makes that a failure. A server of the
//! test's own ([`Server`]) starts with `IDEM_DYNAMODB_SERVER_CMD`. Clients use static test
//! credentials and a fixed region, so nothing is looked up elsewhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_dynamodb::aws_sdk_dynamodb::config::interceptors::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
};
use idem_dynamodb::aws_sdk_dynamodb::config::retry::{RetryPartition, TokenBucket};
use idem_dynamodb::aws_sdk_dynamodb::config::{
    timeout::TimeoutConfig, BehaviorVersion, ConfigBag, Credentials, Intercept, Region,
    RuntimeComponents,
};
use idem_dynamodb::aws_sdk_dynamodb::{self, Client};
use idem_dynamodb::{DynamoStore, DynamoStoreBuilder};

/// The shared test server's endpoint, or `None` after printing why `test` skips.
///
/// ```
/// let _url = idem_test_support::dynamodb::dynamo_url("doc_example");
/// ```
pub fn dynamo_url(test: &str) -> Option<String> {
    crate::setting(test, "IDEM_TEST_DYNAMODB_URL", "IDEM_REQUIRE_DYNAMODB")
}

/// A server of the test's own when `scripts/test` gave the command to start one
/// (`IDEM_DYNAMODB_SERVER_CMD`), else the shared one: its endpoint, and the server to keep
/// until the test ends. `None` after printing why the test skips.
///
/// Why a server of its own when one can be had: moto answers one request at a time (so that
/// its conditional writes are atomic) at about 3 ms each, so a storm of a thousand calls would
/// hold up a timing test running beside it by seconds. A real DynamoDB has no such queue.
///
/// ```no_run
/// # async fn doc() {
/// let Some((url, _server)) = idem_test_support::dynamodb::own_or_shared_server().await else {
///     return;
/// };
/// # let _ = url; }
/// ```
pub async fn own_or_shared_server() -> Option<(String, Option<Server>)> {
    match Server::command() {
        Some(cmd) => {
            let server = tokio::task::spawn_blocking(move || Server::start(&cmd))
                .await
                .expect("start a DynamoDB server");
            Some((server.url(), Some(server)))
        }
        None => Some((dynamo_url(&crate::current_test())?, None)),
    }
}

/// A client of the server at `endpoint` with static test credentials, bounded timeouts and the
/// SDK's standard retries. The timeouts are generous: moto answers one request at a time, so in
/// the storm rule a request may queue behind a thousand others on a loaded machine, and they are
/// bounds only a failing test waits out.
///
/// Its retries draw on a token bucket of its own without a quota. The SDK's default bucket
/// (500 tokens, 10 for each retry of a connection error) is shared by every request of a
/// client: when a thousand calls open their connections at once and a burst of them is reset,
/// fifty retries empty it, and the calls after them fail on their first reset instead of trying
/// again (`dynamodb_store::engine_storm_runs_each_key_once` did, once in a CI run). Each request
/// still makes at most the standard three attempts, so a stopped server fails as fast as
/// before.
///
/// ```
/// let _client = idem_test_support::dynamodb::client("http://127.0.0.1:8000");
/// ```
pub fn client(endpoint: &str) -> Client {
    Client::from_conf(config(endpoint).build())
}

/// The configuration of [`client`], to add to.
///
/// ```
/// let _config = idem_test_support::dynamodb::config("http://127.0.0.1:8000").build();
/// ```
pub fn config(endpoint: &str) -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "idem-test",
            "idem-test",
            None,
            None,
            "idem-test",
        ))
        .endpoint_url(endpoint)
        .retry_partition(
            RetryPartition::custom("idem-test")
                .token_bucket(TokenBucket::unlimited())
                .build(),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(Duration::from_secs(60))
                .operation_timeout(Duration::from_secs(120))
                .build(),
        )
}

/// Counts the requests a client sends, by operation (`PutItem`, `Query`, …): add it to a
/// client's [`config`] with `.interceptor(requests.clone())`, or take [`counted_client`]'s.
///
/// ```
/// use idem_test_support::dynamodb::Requests;
/// let requests = Requests::default();
/// assert!(requests.take().is_empty());
/// assert_eq!(Requests::only("Query", 2), std::collections::HashMap::from([("Query".to_owned(), 2)]));
/// ```
#[derive(Debug, Default, Clone)]
pub struct Requests(Arc<Mutex<HashMap<String, usize>>>);

impl Requests {
    /// The requests counted since the last `take`, by operation; counting starts again.
    pub fn take(&self) -> HashMap<String, usize> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// What [`take`](Self::take) returns after `n` requests of `op` alone.
    pub fn only(op: &str, n: usize) -> HashMap<String, usize> {
        HashMap::from([(op.to_owned(), n)])
    }
}

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "Requests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), idem_core::BoxError> {
        let op = operation(context);
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(op)
            .or_default() += 1;
        Ok(())
    }
}

/// The operation of the request an interceptor sees (`PutItem`, `Query`, …), from its
/// `X-Amz-Target` header; `?` without one.
///
/// ```no_run
/// use idem_dynamodb::aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
/// fn log(context: &BeforeTransmitInterceptorContextRef<'_>) {
///     println!("{}", idem_test_support::dynamodb::operation(context));
/// }
/// ```
pub fn operation(context: &BeforeTransmitInterceptorContextRef<'_>) -> String {
    let target = context
        .request()
        .headers()
        .get("x-amz-target")
        .unwrap_or("?");
    target.rsplit('.').next().unwrap_or(target).to_owned()
}

/// Turns the answer to the next request of each armed operation into a `500`, after the server
/// applied it: what a lost answer (a timeout, a connection lost on the way back) looks like to
/// the SDK, whose standard retries then send the same request again. Add it to a client's
/// [`config`] with `.interceptor(lose.clone())`; the client should send one request at a time
/// while it is armed.
///
/// ```
/// use idem_test_support::dynamodb::LoseAnAnswer;
/// let lose = LoseAnAnswer::default();
/// lose.arm(&["UpdateItem", "DeleteItem"]);
/// assert!(lose.lost().is_empty());
/// ```
#[derive(Debug, Default, Clone)]
pub struct LoseAnAnswer {
    /// The operations whose next answer is lost.
    armed: Arc<Mutex<Vec<&'static str>>>,
    /// The operation of the request on its way.
    sent: Arc<Mutex<Option<String>>>,
    lost: Arc<Mutex<Vec<String>>>,
}

impl LoseAnAnswer {
    /// Loses the answer to the next request of each of `operations` (`PutItem`,
    /// `TransactWriteItems`, …).
    pub fn arm(&self, operations: &[&'static str]) {
        lock(&self.armed).extend_from_slice(operations);
    }

    /// The operations whose answers were lost, in order.
    pub fn lost(&self) -> Vec<String> {
        lock(&self.lost).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Intercept for LoseAnAnswer {
    fn name(&self) -> &'static str {
        "LoseAnAnswer"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), idem_core::BoxError> {
        *lock(&self.sent) = Some(operation(context));
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), idem_core::BoxError> {
        let op = lock(&self.sent).take().unwrap_or_default();
        let mut armed = lock(&self.armed);
        if let Some(at) = armed.iter().position(|a| *a == op) {
            armed.remove(at);
            *context.response_mut().status_mut() = 500u16.try_into()?;
            lock(&self.lost).push(op);
        }
        Ok(())
    }
}

/// A [`client`] of `endpoint` whose requests the returned [`Requests`] counts.
///
/// ```
/// let (_client, requests) = idem_test_support::dynamodb::counted_client("http://127.0.0.1:8000");
/// assert!(requests.take().is_empty());
/// ```
pub fn counted_client(endpoint: &str) -> (Client, Requests) {
    let requests = Requests::default();
    let client = Client::from_conf(config(endpoint).interceptor(requests.clone()).build());
    (client, requests)
}

/// A table name no other test uses.
///
/// ```
/// assert!(idem_test_support::dynamodb::fresh_table().starts_with("idem_test_"));
/// ```
pub fn fresh_table() -> String {
    crate::unique_name("idem_test")
}

/// A store on a fresh table (created here), configured by `configure`.
///
/// ```no_run
/// # async fn doc() {
/// use idem_test_support::dynamodb::{drop_table, fresh_store};
///
/// let url = "http://127.0.0.1:8000";
/// let store = fresh_store(url, |b| b).await;
/// drop_table(url, store.table());
/// # }
/// ```
pub async fn fresh_store(
    endpoint: &str,
    configure: impl FnOnce(DynamoStoreBuilder) -> DynamoStoreBuilder,
) -> DynamoStore {
    configure(
        DynamoStore::builder()
            .table(fresh_table())
            .create_table_if_missing(true),
    )
    .build(client(endpoint))
    .await
    .expect("create a fresh table on IDEM_TEST_DYNAMODB_URL")
}

/// Deletes `table` from a runtime of its own (see [`on_own_runtime`](crate::on_own_runtime),
/// for `Drop`); failures only leave a stray table in the throwaway server.
///
/// ```no_run
/// idem_test_support::dynamodb::drop_table("http://127.0.0.1:8000", "idem_test_0");
/// ```
pub fn drop_table(endpoint: &str, table: &str) {
    let (endpoint, table) = (endpoint.to_owned(), table.to_owned());
    crate::on_own_runtime(move || async move {
        let _ = client(&endpoint)
            .delete_table()
            .table_name(table)
            .send()
            .await;
    });
}

/// How long a server of a test's own gets to start accepting connections.
const START_WITHIN: Duration = Duration::from_secs(90);

/// A DynamoDB-compatible server of the test's own, started with `IDEM_DYNAMODB_SERVER_CMD`
/// (`scripts/test` sets it to moto's launcher; the command gets `HOST PORT` appended) on a free
/// loopback port, and killed when dropped.
///
/// ```no_run
/// use idem_test_support::dynamodb::Server;
///
/// if let Some(cmd) = Server::command() {
///     let server = Server::start(&cmd);
///     let _endpoint = server.url();
///     server.stop();
/// }
/// ```
pub struct Server {
    process: crate::Process,
    port: u16,
}

impl Server {
    /// The start command, or `None` when the variable is not set.
    pub fn command() -> Option<String> {
        std::env::var("IDEM_DYNAMODB_SERVER_CMD")
            .ok()
            .filter(|c| !c.trim().is_empty())
    }

    /// Starts a server on a free port ([`crate::free_port`]) and waits (90 s at most: moto's start is a second of
    /// Python imports on an idle machine, many on a busy one) until it accepts connections.
    pub fn start(command: &str) -> Server {
        Server::start_on(command, crate::free_port())
    }

    /// Starts a server on `port` (say, the port of one that was stopped) and waits for it.
    pub fn start_on(command: &str, port: u16) -> Server {
        let mut words = command.split_whitespace();
        let program = words
            .next()
            .expect("IDEM_DYNAMODB_SERVER_CMD names a program");
        let child = std::process::Command::new(program)
            .args(words)
            .args(["127.0.0.1", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the server of IDEM_DYNAMODB_SERVER_CMD");
        let mut server = Server {
            process: crate::Process::new(child),
            port,
        };
        let deadline = std::time::Instant::now() + START_WITHIN;
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            if let Some(status) = server.process.exited() {
                panic!("the DynamoDB server on port {port} exited at start: {status}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the DynamoDB server on port {port} did not accept connections within {} s",
                START_WITHIN.as_secs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its endpoint, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops it and waits until it has exited.
    pub fn stop(mut self) {
        self.process.kill();
    }
}
