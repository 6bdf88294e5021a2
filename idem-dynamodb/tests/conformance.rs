//! The conformance suite (`idem_core::conformance`, written once for every store) against the
//! DynamoDB store (moto under `scripts/test`, a server per rule: see [`DynamoHarness`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::conformance::{suite, Harness};
use idem_core::Store;
use idem_dynamodb::DynamoStore;

use idem_test_support::dynamodb::{drop_table, fresh_store, own_or_shared_server, Server};

/// A DynamoDB store on a fresh table with a unique name. The server: one of the rule's own,
/// started with `IDEM_DYNAMODB_SERVER_CMD` when `scripts/test` set it, otherwise the shared one
/// named by `IDEM_TEST_DYNAMODB_URL`. Without either the test prints why and skips, unless
/// `IDEM_REQUIRE_DYNAMODB=1` (set by `scripts/test`), which makes it a failure.
///
/// Why a server per rule under `scripts/test`: moto answers one request at a time, so the storm
/// rule's thousand calls would hold up a timing rule running beside it
/// (`engine_renews_long_work` probes a 1 s lease) by seconds.
///
/// The clock-skew margin is 100 ms: every store handle of a rule runs on this one machine's
/// clock, and the rules wait 150 ms past a lease of 300 ms (times `IDEM_TEST_TIME_SCALE`), so a
/// takeover after `lease + margin` is exactly what they check. The margin itself is tested in `tests/dynamodb_store.rs`.
pub struct DynamoHarness {
    store: DynamoStore,
    url: String,
    _server: Option<Server>,
}

#[async_trait]
impl Harness for DynamoHarness {
    async fn new() -> Option<Self> {
        let (url, server) = own_or_shared_server().await?;
        let store = fresh_store(&url, |b| b.clock_skew_margin(Duration::from_millis(100))).await;
        Some(DynamoHarness {
            store,
            url,
            _server: server,
        })
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }
}

impl Drop for DynamoHarness {
    fn drop(&mut self) {
        if self._server.is_none() {
            drop_table(&self.url, self.store.table());
        }
    }
}

suite!(
    dynamodb_store,
    crate::DynamoHarness,
    (flavor = "multi_thread", worker_threads = 2)
);
