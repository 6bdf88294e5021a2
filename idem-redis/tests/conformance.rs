//! The conformance suite (`idem_core::conformance`, written once for every store) against the
//! Redis store: one server and a Redis Cluster, as `scripts/test` starts them.

use std::sync::Arc;

use async_trait::async_trait;
use idem_core::conformance::{suite, Harness};
use idem_core::Store;
use idem_redis::RedisStore;

use idem_test_support::redis::{fresh_store, Flavor};

/// A Redis store under a fresh key prefix on the shared test server (`CLUSTER = false`) or
/// cluster (`CLUSTER = true`) that `scripts/test` starts. Without it the test prints why and
/// skips, unless `IDEM_REQUIRE_REDIS=1` (set by `scripts/test`), which makes it a failure.
/// Redis deletes ended records itself, so the prune rules check that they are gone instead of
/// counting deletions. Records expire on their own, so nothing is cleaned up after a rule.
pub struct RedisHarness<const CLUSTER: bool> {
    store: RedisStore,
}

#[async_trait]
impl<const CLUSTER: bool> Harness for RedisHarness<CLUSTER> {
    async fn new() -> Option<Self> {
        let flavor = if CLUSTER {
            Flavor::Cluster
        } else {
            Flavor::Single
        };
        let store = fresh_store(flavor, |b| b).await?;
        Some(RedisHarness { store })
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    fn expires_by_itself(&self) -> bool {
        true
    }
}

suite!(
    redis_store,
    crate::RedisHarness<false>,
    (flavor = "multi_thread", worker_threads = 2)
);

suite!(
    redis_cluster,
    crate::RedisHarness<true>,
    (flavor = "multi_thread", worker_threads = 2)
);
