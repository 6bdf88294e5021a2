//! A background task that runs a job at once and then every interval until its handle stops
//! it, keeping the latest report: the machinery the request-history pruner
//! ([`kit::Pruner`](crate::kit::Pruner)) and the [`RecordPruner`](crate::RecordPruner) share.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// The handle of a spawned periodic job whose runs report an `R`.
#[derive(Debug)]
pub(crate) struct Periodic<R> {
    stop: watch::Sender<bool>,
    reports: watch::Receiver<Option<R>>,
    task: JoinHandle<()>,
}

impl<R: Copy + Send + Sync + 'static> Periodic<R> {
    /// Spawns the job. `run` gets a receiver that turns `true` (or closes) when the handle asks
    /// the job to stop, so a long run can end early; it returns the run's report, or `None` for
    /// a failed run (which it has logged). A run that overruns the interval delays the next.
    pub(crate) fn spawn<F, Fut>(interval: Duration, mut run: F) -> Periodic<R>
    where
        F: FnMut(watch::Receiver<bool>) -> Fut + Send + 'static,
        Fut: Future<Output = Option<R>> + Send,
    {
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let (report_tx, report_rx) = watch::channel(None);
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    // A `true` sent or the handle dropped: stop either way.
                    _ = stop_rx.changed() => break,
                }
                if let Some(report) = run(stop_rx.clone()).await {
                    report_tx.send_replace(Some(report));
                }
                if stop_requested(&stop_rx) {
                    break;
                }
            }
        });
        Periodic {
            stop: stop_tx,
            reports: report_rx,
            task,
        }
    }

    /// The report of the latest successful run, if any.
    pub(crate) fn last_report(&self) -> Option<R> {
        *self.reports.borrow()
    }

    /// Waits for the next successful run; `None` once the job has stopped.
    pub(crate) async fn next_report(&mut self) -> Option<R> {
        self.reports.changed().await.ok()?;
        *self.reports.borrow_and_update()
    }

    /// Asks the job to stop and waits for it; a panic inside the job is resumed here.
    pub(crate) async fn shutdown(self) {
        self.stop.send_replace(true);
        if let Err(e) = self.task.await {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }
}

/// Whether the handle asked the job to stop (sent `true` or was dropped).
pub(crate) fn stop_requested(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}
