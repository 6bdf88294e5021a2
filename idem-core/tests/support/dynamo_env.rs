//! The project's rule for a test that needs DynamoDB, shared by every test crate (included with
//! `#[path]`): the server comes from `IDEM_TEST_DYNAMODB_URL` (an endpoint such as
//! `http://127.0.0.1:8000`, moto in server mode as `scripts/test` starts it); without it the
//! test prints `skipping <test>: IDEM_TEST_DYNAMODB_URL is not set` and returns, unless
//! `IDEM_REQUIRE_DYNAMODB=1` (set by `scripts/test`) makes that a failure. Clients use static
//! test credentials and a fixed region, so nothing is looked up elsewhere.
#![allow(dead_code)]

use std::time::Duration;

use idem_core::aws_sdk_dynamodb::config::{
    timeout::TimeoutConfig, BehaviorVersion, Credentials, Region,
};
use idem_core::aws_sdk_dynamodb::{self, Client};
use idem_core::{DynamoStore, DynamoStoreBuilder};

/// The test server's endpoint, or `None` after printing why `test` skips.
pub fn dynamo_url(test: &str) -> Option<String> {
    match std::env::var("IDEM_TEST_DYNAMODB_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("IDEM_REQUIRE_DYNAMODB").is_ok_and(|v| v == "1") => panic!(
            "{test}: IDEM_TEST_DYNAMODB_URL is not set, and IDEM_REQUIRE_DYNAMODB=1 requires it"
        ),
        _ => {
            eprintln!("skipping {test}: IDEM_TEST_DYNAMODB_URL is not set");
            None
        }
    }
}

/// The name of the running test (its thread's name), for messages.
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("a DynamoDB test")
        .to_owned()
}

/// A client of the server at `endpoint` with static test credentials, bounded timeouts and the
/// SDK's standard retries. The timeouts are generous: moto answers one request at a time, so in
/// the storm rule a request may queue behind a thousand others on a loaded machine.
pub fn client(endpoint: &str) -> Client {
    Client::from_conf(config(endpoint).build())
}

/// The configuration of [`client`], to add to.
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
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(Duration::from_secs(30))
                .operation_timeout(Duration::from_secs(60))
                .build(),
        )
}

/// A table name no other test uses.
pub fn fresh_table() -> String {
    format!("idem_test_{:016x}", fastrand::u64(..))
}

/// A store on a fresh table (created here), configured by `configure`.
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

/// Deletes `table` from a thread with a runtime of its own (for `Drop`, which cannot await and
/// whose runtime may be busy or gone); failures only leave a stray table in the throwaway server.
pub fn drop_table(endpoint: &str, table: &str) {
    let (endpoint, table) = (endpoint.to_owned(), table.to_owned());
    let cleanup = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let _ = client(&endpoint)
                .delete_table()
                .table_name(table)
                .send()
                .await;
        });
    });
    let _ = cleanup.join();
}

/// A DynamoDB-compatible server of the test's own, started with `IDEM_DYNAMODB_SERVER_CMD`
/// (`scripts/test` sets it to moto's launcher; the command gets `HOST PORT` appended) on a free
/// loopback port, and killed when dropped.
pub struct Server {
    child: std::process::Child,
    port: u16,
}

impl Server {
    /// The start command, or `None` when the variable is not set.
    pub fn command() -> Option<String> {
        std::env::var("IDEM_DYNAMODB_SERVER_CMD")
            .ok()
            .filter(|c| !c.trim().is_empty())
    }

    /// Starts a server on a free port and waits (20 s at most) until it accepts connections.
    pub fn start(command: &str) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free loopback port")
            .port();
        Server::start_on(command, port)
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
        let mut server = Server { child, port };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("the DynamoDB server on port {port} exited at start: {status}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the DynamoDB server on port {port} did not accept connections within 20 s"
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
        self.kill();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
