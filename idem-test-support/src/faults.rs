//! Stores that fail on purpose, for the tests of what a failure does above them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use idem_core::store::{Forward, Forwarding, Operation};
use idem_core::{Error, Store, StoreError, StoreErrorKind};

/// A store whose completions fail with a passing error (`Unavailable`) while switched on, as a
/// store that went away right after the work ran: the engine then answers the caller and goes on
/// completing in the background. Everything else reaches the store behind it.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::{Idempotency, Key, MemoryStore, Outcome, RecordState, Store};
/// use idem_test_support::faults::CompletionsFail;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = CompletionsFail::new(Arc::new(MemoryStore::new()));
/// let engine = Idempotency::from_arc(store.clone());
/// let key = Key::derive("charge", "", "order-1").unwrap();
/// let first = engine.call(key).run(async { Ok::<_, idem_core::Error>(7) }).await.unwrap();
/// assert_eq!(first, Outcome::Fresh(7));
/// let record = store.get(&key).await.unwrap().unwrap();
/// assert!(matches!(record.state, RecordState::InProgress { .. }), "still completing");
/// store.switch(false);
/// # }
/// ```
pub struct CompletionsFail {
    records: Arc<dyn Store>,
    failing: AtomicBool,
}

impl CompletionsFail {
    /// `records`, with its completions failing until [`switch`](Self::switch)ed off.
    pub fn new(records: Arc<dyn Store>) -> Arc<Forwarding<CompletionsFail>> {
        Arc::new(Forwarding(CompletionsFail {
            records,
            failing: AtomicBool::new(true),
        }))
    }

    /// Completions fail (`true`) or reach the store (`false`).
    pub fn switch(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

impl Forward for CompletionsFail {
    fn inner(&self) -> &dyn Store {
        &*self.records
    }

    fn gate(&self, op: Operation) -> Result<(), Error> {
        if op == Operation::Complete && self.failing.load(Ordering::SeqCst) {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                "injected: completions fail",
            )));
        }
        Ok(())
    }
}
