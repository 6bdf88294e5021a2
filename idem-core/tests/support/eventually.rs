//! Bounded polling for what happens in the background (a pruner's delete, a task's end), shared
//! by the test crates (included with `#[path]`): a test waits for a condition, never for a fixed
//! time.

use std::future::Future;
use std::time::Duration;

/// Polls `done` every 10 ms for at most 10 s; whether it came true.
pub async fn eventually<F: Future<Output = bool>>(mut done: impl FnMut() -> F) -> bool {
    for _ in 0..1_000 {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}
