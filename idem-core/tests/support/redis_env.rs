//! The project's rule for a test that needs Redis, shared by every test crate (included with
//! `#[path]`): the standalone server comes from `IDEM_TEST_REDIS_URL` and the cluster from
//! `IDEM_TEST_REDIS_CLUSTER_URLS` (comma-separated node URLs), as `scripts/test` starts them;
//! without the variable the test prints `skipping <test>: … is not set` and returns, unless
//! `IDEM_REQUIRE_REDIS=1` (set by `scripts/test`) makes that a failure.
#![allow(dead_code)]

use idem_core::{RedisStore, RedisStoreBuilder};

/// Where a Redis test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// One server: `IDEM_TEST_REDIS_URL`.
    Single,
    /// A 3-master cluster: `IDEM_TEST_REDIS_CLUSTER_URLS`.
    Cluster,
}

impl Flavor {
    fn var(self) -> &'static str {
        match self {
            Flavor::Single => "IDEM_TEST_REDIS_URL",
            Flavor::Cluster => "IDEM_TEST_REDIS_CLUSTER_URLS",
        }
    }
}

/// The URLs of `flavor`'s servers, or `None` after printing why `test` skips.
pub fn redis_urls(flavor: Flavor, test: &str) -> Option<Vec<String>> {
    let var = flavor.var();
    match std::env::var(var) {
        Ok(urls) if !urls.is_empty() => Some(urls.split(',').map(str::to_owned).collect()),
        _ if std::env::var("IDEM_REQUIRE_REDIS").is_ok_and(|v| v == "1") => {
            panic!("{test}: {var} is not set, and IDEM_REQUIRE_REDIS=1 requires it")
        }
        _ => {
            eprintln!("skipping {test}: {var} is not set");
            None
        }
    }
}

/// The name of the running test (its thread's name), for messages.
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("a Redis test")
        .to_owned()
}

/// A key prefix no other test uses.
pub fn fresh_prefix() -> String {
    format!("idem_test_{:016x}", fastrand::u64(..))
}

/// A store of `flavor` under a fresh prefix, configured by `configure`; `None` when the test
/// skips.
pub async fn fresh_store(
    flavor: Flavor,
    configure: impl FnOnce(RedisStoreBuilder) -> RedisStoreBuilder,
) -> Option<RedisStore> {
    let urls = redis_urls(flavor, &current_test())?;
    let builder = configure(RedisStore::builder().prefix(fresh_prefix()));
    let store = match flavor {
        Flavor::Single => builder.connect(&urls[0]).await,
        Flavor::Cluster => builder.connect_cluster(&urls).await,
    };
    Some(store.unwrap_or_else(|e| panic!("connect to the test Redis ({flavor:?}): {e}")))
}
