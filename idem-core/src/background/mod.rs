//! The background jobs: the [`Pruner`](crate::Pruner), which deletes what has expired, the
//! [`Completer`](crate::Completer), which finishes operations abandoned past their lease, and the
//! [`Dispatcher`](crate::Dispatcher), which publishes an outbox. Each
//! is a loop on a spawned task that one node runs at a time: they share the task and its handle
//! ([`Background`]: stop, shutdown, reports), the stop signal ([`stop_requested`]) and the lease
//! ([`Lease`], [`RecordsLease`]: a claim of a reserved key in the store itself). What differs is
//! what a run does and how runs are paced (the pruner by the expiry rate it measures, the
//! completer by its interval), which stays with each job.

use tokio::sync::watch;
use tokio::task::JoinHandle;

mod completer;
mod dispatcher;
mod lease;
mod pruner;

pub use completer::{CompleteReport, Completer, CompleterConfig, CompleterHandle};
pub use dispatcher::{DispatchReport, Dispatcher, DispatcherConfig, DispatcherHandle};
pub use lease::records_lease_key;
pub use lease::Lease;
pub(crate) use lease::RecordsLease;
pub use pruner::Target;
pub use pruner::{PruneReport, Pruner, PrunerConfig, PrunerHandle};

/// A background task that runs until stopped and reports each successful run: what a
/// [`PrunerHandle`] and a [`CompleterHandle`](crate::CompleterHandle) hold.
#[derive(Debug)]
pub(crate) struct Background<R> {
    stop: watch::Sender<bool>,
    reports: watch::Receiver<Option<R>>,
    task: JoinHandle<()>,
}

impl<R: Copy + Send + Sync + 'static> Background<R> {
    /// Spawns `body` with the stop signal and the sender of its reports.
    pub(crate) fn spawn<F, Fut>(body: F) -> Background<R>
    where
        F: FnOnce(watch::Receiver<bool>, watch::Sender<Option<R>>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (stop, stop_rx) = watch::channel(false);
        let (report_tx, reports) = watch::channel(None);
        let task = tokio::spawn(body(stop_rx, report_tx));
        Background {
            stop,
            reports,
            task,
        }
    }

    /// The report of the latest successful run, if any.
    pub(crate) fn last_report(&self) -> Option<R> {
        *self.reports.borrow()
    }

    /// Waits for the next successful run's report; `None` once the task has stopped.
    pub(crate) async fn next_report(&mut self) -> Option<R> {
        self.reports.changed().await.ok()?;
        *self.reports.borrow_and_update()
    }

    /// Asks the task to stop and waits until it has, through a shared handle (a store's clones
    /// share its pruner's). A panic of the task is not resumed here: the task is gone either way.
    pub(crate) async fn stop(&self) {
        self.stop.send_replace(true);
        // The task holds the reports' sender: the channel closes when the task ends.
        let mut reports = self.reports.clone();
        while reports.changed().await.is_ok() {}
    }

    /// Asks the task to stop and waits for it; resumes its panic, if it panicked.
    pub(crate) async fn shutdown(self) {
        self.stop.send_replace(true);
        if let Err(e) = self.task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// Whether the handle asked the task to stop (sent `true` or was dropped).
pub(crate) fn stop_requested(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}
