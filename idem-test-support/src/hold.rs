//! A handler that holds until its test lets it go, and tells the test when it starts and
//! when it is dropped before it finished: what the HTTP and gRPC layers' test servers use to
//! catch a handler mid-run (a client that goes away, a duplicate that arrives meanwhile).

use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::Semaphore;

/// The handler's side: [`hold`](Self::hold) in the handler.
#[derive(Clone)]
pub struct Hold {
    gate: Arc<Semaphore>,
    entered: UnboundedSender<()>,
    dropped: UnboundedSender<()>,
}

/// The test's side: one message on `entered` each time a handler starts holding, one on
/// `dropped` each time one is dropped before it was let go; [`release`](Self::release) lets
/// handlers go.
pub struct Holds {
    gate: Arc<Semaphore>,
    pub entered: UnboundedReceiver<()>,
    pub dropped: UnboundedReceiver<()>,
}

/// A closed gate: its handler side and its test side.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let (hold, mut holds) = idem_test_support::hold::gate();
/// let handler = tokio::spawn(async move { hold.hold().await });
/// holds.entered.recv().await.unwrap();
/// holds.release(1);
/// handler.await.unwrap();
/// assert!(holds.dropped.try_recv().is_err());
/// # });
/// ```
pub fn gate() -> (Hold, Holds) {
    let gate = Arc::new(Semaphore::new(0));
    let (entered_tx, entered) = unbounded_channel();
    let (dropped_tx, dropped) = unbounded_channel();
    let hold = Hold {
        gate: gate.clone(),
        entered: entered_tx,
        dropped: dropped_tx,
    };
    (
        hold,
        Holds {
            gate,
            entered,
            dropped,
        },
    )
}

impl Hold {
    /// Says it started, then waits for the test to [`release`](Holds::release) it; says it was
    /// dropped if its future is dropped first.
    pub async fn hold(&self) {
        let mut signal = DropSignal(Some(self.dropped.clone()));
        let _ = self.entered.send(());
        self.gate.acquire().await.unwrap().forget();
        signal.0 = None;
    }
}

impl Holds {
    /// Lets `n` held handlers go (or the next `n` to hold, at once).
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

/// Sends on `dropped` when dropped while still armed.
struct DropSignal(Option<UnboundedSender<()>>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}
