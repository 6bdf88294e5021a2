use std::sync::Arc;

use async_trait::async_trait;
use idem_core::conformance::Harness;
use idem_core::{MemoryStore, Store, TokioClock};

/// The memory store on tokio's (paused) clock.
pub struct MemoryHarness(MemoryStore);

#[async_trait]
impl Harness for MemoryHarness {
    async fn new() -> Option<Self> {
        Some(MemoryHarness(MemoryStore::with_clock(TokioClock::new())))
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.0.clone())
    }
}
