//! Redis for a test: the standalone server comes from `IDEM_TEST_REDIS_URL` and the cluster from
//! `IDEM_TEST_REDIS_CLUSTER_URLS` (comma-separated node URLs), as `scripts/test` starts them;
//! without the variable the test prints `skipping <test>: … is not set` and returns, unless
//! `IDEM_REQUIRE_REDIS=1` (set by `scripts/test`) makes that a failure.

use std::path::PathBuf;

use idem_redis::{RedisStore, RedisStoreBuilder};

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
///
/// ```
/// use idem_test_support::redis::{redis_urls, Flavor};
///
/// let _urls = redis_urls(Flavor::Cluster, "doc_example");
/// ```
pub fn redis_urls(flavor: Flavor, test: &str) -> Option<Vec<String>> {
    let urls = crate::setting(test, flavor.var(), "IDEM_REQUIRE_REDIS")?;
    Some(urls.split(',').map(str::to_owned).collect())
}

/// The directory of `redis-server` and `redis-cli` (`IDEM_REDIS_BINDIR`), for a test that runs
/// servers of its own; `None` after printing why `test` skips.
///
/// ```
/// let _bindir = idem_test_support::redis::redis_bindir("doc_example");
/// ```
pub fn redis_bindir(test: &str) -> Option<PathBuf> {
    crate::setting(test, "IDEM_REDIS_BINDIR", "IDEM_REQUIRE_REDIS").map(PathBuf::from)
}

/// A key prefix no other test uses.
///
/// ```
/// assert!(idem_test_support::redis::fresh_prefix().starts_with("idem_test_"));
/// ```
pub fn fresh_prefix() -> String {
    crate::unique_name("idem_test")
}

/// A store of `flavor` under a fresh prefix, configured by `configure`; `None` when the test
/// skips.
///
/// ```no_run
/// # async fn doc() {
/// use idem_test_support::redis::{fresh_store, Flavor};
///
/// let Some(store) = fresh_store(Flavor::Single, |b| b).await else { return };
/// # let _ = store; }
/// ```
pub async fn fresh_store(
    flavor: Flavor,
    configure: impl FnOnce(RedisStoreBuilder) -> RedisStoreBuilder,
) -> Option<RedisStore> {
    let urls = redis_urls(flavor, &crate::current_test())?;
    let builder = configure(RedisStore::builder().prefix(fresh_prefix()));
    let store = match flavor {
        Flavor::Single => builder.connect(&urls[0]).await,
        Flavor::Cluster => builder.connect_cluster(&urls).await,
    };
    Some(store.unwrap_or_else(|e| panic!("connect to the test Redis ({flavor:?}): {e}")))
}
