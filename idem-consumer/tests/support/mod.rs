//! What several test binaries share (a module of each, not a test of its own). A binary that
//! includes it (`mod support;`) compiles every part its features allow and uses some.
#![allow(dead_code)]

#[cfg(feature = "sqs")]
pub mod sqs;

use std::sync::Arc;
use std::time::Duration;

/// Handlers that wait, bounded, until `n` of them have started: a test that a consumer runs `n`
/// messages at once. Each message is charged once the `n` met; one that waited in vain is
/// counted as `alone` and fails.
#[derive(Clone)]
pub struct AllAtOnce {
    n: usize,
    met: Arc<tokio::sync::Barrier>,
    pub charges: idem_test_support::Tally,
}

impl AllAtOnce {
    pub fn new(n: usize) -> AllAtOnce {
        AllAtOnce {
            n,
            met: Arc::new(tokio::sync::Barrier::new(n)),
            charges: Default::default(),
        }
    }

    /// The handler's body for `order`.
    pub async fn meet(&self, order: String) -> Result<String, String> {
        let bound = idem::conformance::scaled(Duration::from_secs(10));
        if tokio::time::timeout(bound, self.met.wait()).await.is_err() {
            self.charges.add("alone");
            return Err(format!("{order}: fewer than {} ran at once", self.n));
        }
        self.charges.add(&order);
        Ok(order)
    }

    /// How many handlers waited in vain.
    pub fn alone(&self) -> u32 {
        self.charges.count("alone")
    }

    /// Whether every one of `orders` was charged exactly once.
    pub fn each_once(&self, orders: &[String]) -> bool {
        orders.iter().all(|o| self.charges.count(o) == 1)
    }
}

/// Spawns a consumer's run, handing `run` the shutdown signal that [`stop`] sends: returns the
/// sender and the task, for [`stop`].
pub fn spawn_run<F, R>(
    run: F,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
)
where
    F: FnOnce(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> R,
    R: std::future::Future<Output = ()> + Send + 'static,
{
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let shutdown = Box::pin(async move {
        let _ = stopped.wait_for(|s| *s).await;
    });
    (stop, tokio::spawn(run(shutdown)))
}

/// Sends a consumer's run its shutdown and waits for it to return (a minute at most).
pub async fn stop(stop: tokio::sync::watch::Sender<bool>, run: tokio::task::JoinHandle<()>) {
    stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the consumer did not shut down")
        .expect("the consumer panicked");
}
