//! The [`Dispatcher`]: publishes an outbox's unsent messages, in order per aggregate, one node
//! at a time under a lease (docs/outbox.md).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{stop_requested, Background, Lease, RecordsLease};
use crate::error::Error;
use crate::key::Key;
use crate::outbox::{MessageId, OutboxMessage, OutboxSource, PendingMessage, Publisher};
use crate::store::{check_duration, Store};

/// How a [`Dispatcher`] runs: pages of at most [`batch_size`](Self::batch_size) messages, the
/// messages of up to [`concurrency`](Self::concurrency) aggregates published at once (each
/// aggregate's in order), a run every [`interval`](Self::interval) while the outbox is empty,
/// under a [`lease`](Self::lease) named by [`name`](Self::name); sent messages deleted once
/// they are [`sent_retention`](Self::sent_retention) old.
///
/// ```
/// use std::time::Duration;
/// let config = idem::DispatcherConfig::new().interval(Duration::from_millis(50)).concurrency(32);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DispatcherConfig {
    name: String,
    batch_size: u32,
    concurrency: usize,
    interval: Duration,
    lease: Duration,
    sent_retention: Duration,
}

impl DispatcherConfig {
    /// The defaults: the lease name `outbox`, pages of 500 messages, 32 aggregates at once, a
    /// run every 100 ms while idle, a 30 s lease, sent messages kept 24 h.
    ///
    /// ```
    /// assert_eq!(idem::DispatcherConfig::new(), idem::DispatcherConfig::default());
    /// ```
    pub fn new() -> DispatcherConfig {
        DispatcherConfig {
            name: "outbox".into(),
            batch_size: 500,
            concurrency: 32,
            interval: Duration::from_millis(100),
            lease: Duration::from_secs(30),
            sent_retention: Duration::from_secs(24 * 3600),
        }
    }

    /// The name of the dispatchers' lease (1 to 255 bytes): dispatchers of one outbox share
    /// it, so one of them publishes at a time; dispatchers of two outboxes on one store need
    /// two names.
    ///
    /// ```
    /// let _ = idem::DispatcherConfig::new().name("orders-outbox");
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> DispatcherConfig {
        self.name = name.into();
        self
    }

    /// The most messages one page reads (1 to 10,000).
    ///
    /// ```
    /// let _ = idem::DispatcherConfig::new().batch_size(100);
    /// ```
    pub fn batch_size(mut self, batch_size: u32) -> DispatcherConfig {
        self.batch_size = batch_size;
        self
    }

    /// How many aggregates' messages are published at once (1 to 10,000); one aggregate's are
    /// always published one after the other, in order.
    ///
    /// ```
    /// let _ = idem::DispatcherConfig::new().concurrency(8);
    /// ```
    pub fn concurrency(mut self, concurrency: usize) -> DispatcherConfig {
        self.concurrency = concurrency;
        self
    }

    /// How long a spawned dispatcher waits after a run that emptied the outbox (or failed, or
    /// found the lease held) before the next: the lag a message waits at most, besides
    /// publishing, when the outbox was empty.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem::DispatcherConfig::new().interval(Duration::from_millis(20));
    /// ```
    pub fn interval(mut self, interval: Duration) -> DispatcherConfig {
        self.interval = interval;
        self
    }

    /// The dispatchers' lease: a run takes it, renews it before each page, and releases it at
    /// the end; another node takes over within this long of one that died.
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem::DispatcherConfig::new().lease(Duration::from_secs(10));
    /// ```
    pub fn lease(mut self, lease: Duration) -> DispatcherConfig {
        self.lease = lease;
        self
    }

    /// How long sent messages are kept before a run deletes them (for an operator to look at,
    /// or a consumer to be replayed from).
    ///
    /// ```
    /// use std::time::Duration;
    /// let _ = idem::DispatcherConfig::new().sent_retention(Duration::from_secs(3600));
    /// ```
    pub fn sent_retention(mut self, retention: Duration) -> DispatcherConfig {
        self.sent_retention = retention;
        self
    }

    fn validate(&self) -> Result<Key, Error> {
        let bad = |what: String| Err(Error::InvalidConfig(what));
        if !(1..=10_000).contains(&self.batch_size) {
            return bad(format!(
                "dispatcher batch_size must be 1 to 10000, got {}",
                self.batch_size
            ));
        }
        if !(1..=10_000).contains(&self.concurrency) {
            return bad(format!(
                "dispatcher concurrency must be 1 to 10000, got {}",
                self.concurrency
            ));
        }
        check_duration("dispatcher interval", self.interval)?;
        check_duration("dispatcher lease", self.lease)?;
        check_duration("dispatcher sent_retention", self.sent_retention)?;
        lease_key(&self.name)
    }
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig::new()
    }
}

/// The reserved key of the dispatchers' lease named `name`.
fn lease_key(name: &str) -> Result<Key, Error> {
    Ok(Key::derive("idem.dispatcher", "", name)?)
}

/// What one dispatcher run did.
///
/// ```
/// let report = idem::DispatchReport::default();
/// assert_eq!(report.published, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatchReport {
    /// Messages the broker acknowledged, marked sent.
    pub published: u64,
    /// Messages whose publishing failed (each logged, `WARN`): left unsent for the next run.
    pub failed: u64,
    /// Messages not tried because an earlier message of their aggregate failed: left unsent,
    /// so the aggregate's order holds.
    pub held_back: u64,
    /// Sent messages deleted (older than the sent retention).
    pub pruned: u64,
    /// Pages read.
    pub pages: u32,
    /// The longest a published message had waited since it was added (the store's clock
    /// against this node's): the end-to-end lag to alert on.
    pub max_lag: Duration,
    /// Another dispatcher held the lease, so this run did nothing.
    pub skipped: bool,
    /// The last page came back short: nothing unsent was left unseen.
    pub drained: bool,
    /// How long the run took.
    pub elapsed: Duration,
}

/// Publishes an outbox's unsent messages: a background task run like the
/// [`Pruner`](crate::Pruner) and the [`Completer`](crate::Completer), one node at a time under
/// a lease (a record of the store under the reserved key
/// `Key::derive("idem.dispatcher", "", name)`).
///
/// A run takes the lease (or reports [`skipped`](DispatchReport::skipped)), reads the unsent
/// messages a page at a time in outbox order, publishes the messages of each aggregate one
/// after the other (aggregates side by side), and marks the acknowledged ones sent in one
/// write per page. A message whose publishing fails stops its aggregate for this run (the
/// messages after it are [`held_back`](DispatchReport::held_back)) and ends the run after that
/// page, so the next run starts again from it: order per aggregate holds. A crash between
/// the broker's acknowledgement and the mark publishes that page's messages again, with the
/// same ids, which the brokers' deduplication and idem's consumers absorb: at least once,
/// never lost, never a message of a transaction that rolled back (it was never in the outbox).
///
/// ```
/// use std::sync::Arc;
/// use idem::{ChannelPublisher, Dispatcher, DispatcherConfig, Key, MemoryOutbox, MemoryStore};
/// use idem::{MessageId, OutboxMessage, OutboxSource};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let outbox = Arc::new(MemoryOutbox::new());
/// let key = Key::derive("orders", "", "o-1")?;
/// outbox.add(OutboxMessage::new(MessageId::derive(&key, "placed"), "order", "o-1", "Placed", b"{}".to_vec())?);
/// let (publisher, mut received) = ChannelPublisher::new(16);
/// let dispatcher = Dispatcher::new(
///     Arc::new(MemoryStore::new()), // where the lease is kept
///     outbox.clone(),
///     Arc::new(publisher),
///     DispatcherConfig::new(),
/// )?;
/// let report = dispatcher.run_once().await?;
/// assert_eq!(report.published, 1);
/// assert_eq!(received.recv().await.map(|m| m.kind), Some("Placed".to_owned()));
/// assert!(outbox.pending(10).await?.is_empty());
/// # Ok(()) }
/// ```
pub struct Dispatcher {
    store: Arc<dyn Store>,
    source: Arc<dyn OutboxSource>,
    publisher: Arc<dyn Publisher>,
    config: DispatcherConfig,
    lease_key: Key,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What publishing one aggregate's messages of a page came to.
#[derive(Default)]
struct Published {
    sent: Vec<MessageId>,
    failed: u64,
    held_back: u64,
    max_lag: Duration,
}

impl Dispatcher {
    /// A dispatcher of `source` to `publisher`, its lease kept in `store` (the records store
    /// the outbox sits beside, or any store the dispatchers share). Checks `config`; otherwise
    /// [`Error::InvalidConfig`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::{ChannelPublisher, Dispatcher, DispatcherConfig, Error, MemoryOutbox, MemoryStore};
    /// let (publisher, _received) = ChannelPublisher::new(1);
    /// let bad = Dispatcher::new(
    ///     Arc::new(MemoryStore::new()),
    ///     Arc::new(MemoryOutbox::new()),
    ///     Arc::new(publisher),
    ///     DispatcherConfig::new().batch_size(0),
    /// );
    /// assert!(matches!(bad, Err(Error::InvalidConfig(_))));
    /// ```
    pub fn new(
        store: Arc<dyn Store>,
        source: Arc<dyn OutboxSource>,
        publisher: Arc<dyn Publisher>,
        config: DispatcherConfig,
    ) -> Result<Dispatcher, Error> {
        let lease_key = config.validate()?;
        Ok(Dispatcher {
            store,
            source,
            publisher,
            config,
            lease_key,
        })
    }

    /// Runs once now: takes the lease, publishes page after page until the outbox is empty or
    /// a message fails, deletes old sent messages, and releases the lease. A publishing
    /// failure is counted, not returned; a store error stops the run and is returned. See
    /// [`Dispatcher`] for an example.
    pub async fn run_once(&self) -> Result<DispatchReport, Error> {
        let mut report = DispatchReport::default();
        self.run(None, &mut report).await?;
        Ok(report)
    }

    /// Runs in a tokio task (call it inside a runtime): a run now, the next at once while
    /// runs leave messages unsent behind a full page, else after
    /// [`interval`](DispatcherConfig::interval), until [`DispatcherHandle::shutdown`] or the
    /// handle is dropped. A failed run is logged (`WARN`) and the next interval tries again.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem::{ChannelPublisher, Dispatcher, DispatcherConfig, MemoryOutbox, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let (publisher, _received) = ChannelPublisher::new(16);
    /// let outbox = Arc::new(MemoryOutbox::new());
    /// let dispatcher = Dispatcher::new(Arc::new(MemoryStore::new()), outbox, Arc::new(publisher), DispatcherConfig::new())?;
    /// let mut handle = dispatcher.spawn();
    /// assert_eq!(handle.next_report().await.map(|r| r.published), Some(0));
    /// handle.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn spawn(self) -> DispatcherHandle {
        DispatcherHandle(Background::spawn(|mut stop_rx, report_tx| async move {
            let mut wait = Duration::ZERO;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop_rx.changed() => break,
                }
                let mut report = DispatchReport::default();
                let again = match self.run(Some(&mut stop_rx), &mut report).await {
                    Ok(()) => {
                        report_tx.send_replace(Some(report));
                        !report.drained && !report.skipped && report.failed == 0
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, published = report.published, "dispatching the outbox failed; trying again at the next interval");
                        false
                    }
                };
                if stop_requested(&stop_rx) {
                    break;
                }
                wait = if again {
                    Duration::ZERO
                } else {
                    self.config.interval
                };
            }
        }))
    }

    async fn run(
        &self,
        stop: Option<&mut watch::Receiver<bool>>,
        report: &mut DispatchReport,
    ) -> Result<(), Error> {
        let started = Instant::now();
        let key = self.lease_key;
        let mut lease = RecordsLease::new(self.store.clone(), move || Ok(key), self.config.lease);
        if !lease.acquire().await? {
            report.skipped = true;
            return Ok(());
        }
        let outcome = self.pages(stop, &mut lease, report).await;
        let pruned = match outcome {
            Ok(()) => self
                .source
                .prune_sent(self.config.sent_retention, self.config.batch_size)
                .await
                .map(|n| report.pruned = n),
            Err(e) => Err(e),
        };
        let released = lease.release().await;
        report.elapsed = started.elapsed();
        pruned?;
        released?;
        crate::observe::dispatched(
            &self.config.name,
            report.published,
            report.failed,
            report.max_lag,
        );
        if report.published + report.failed > 0 {
            tracing::info!(
                published = report.published,
                failed = report.failed,
                held_back = report.held_back,
                max_lag_ms = report.max_lag.as_millis() as u64,
                "dispatched outbox messages"
            );
        }
        Ok(())
    }

    async fn pages(
        &self,
        mut stop: Option<&mut watch::Receiver<bool>>,
        lease: &mut RecordsLease,
        report: &mut DispatchReport,
    ) -> Result<(), Error> {
        loop {
            if stop.as_deref_mut().is_some_and(|s| stop_requested(s)) {
                return Ok(());
            }
            if report.pages > 0 && !lease.acquire().await? {
                tracing::warn!("the dispatcher lost its lease; stopping this run");
                return Ok(());
            }
            let page = self.source.pending(self.config.batch_size).await?;
            report.pages += 1;
            let full = page.len() == self.config.batch_size as usize;
            let published = self.publish(page).await;
            let marked = self.source.mark_sent(&published.sent).await;
            report.published += published.sent.len() as u64;
            report.failed += published.failed;
            report.held_back += published.held_back;
            report.max_lag = report.max_lag.max(published.max_lag);
            marked?;
            if published.failed > 0 {
                return Ok(());
            }
            if !full {
                report.drained = true;
                return Ok(());
            }
        }
    }

    /// Publishes a page: each aggregate's messages in order on a task of its own, at most
    /// `concurrency` aggregates at once.
    async fn publish(&self, page: Vec<PendingMessage>) -> Published {
        let mut groups: Vec<Vec<PendingMessage>> = Vec::new();
        let mut index: std::collections::HashMap<(String, String), usize> =
            std::collections::HashMap::new();
        for pending in page {
            let m = &pending.message;
            let at = *index
                .entry((m.aggregate_type.clone(), m.aggregate_id.clone()))
                .or_insert_with(|| {
                    groups.push(Vec::new());
                    groups.len() - 1
                });
            groups[at].push(pending);
        }
        let mut total = Published::default();
        let mut tasks = JoinSet::new();
        let mut groups = groups.into_iter();
        loop {
            while tasks.len() < self.config.concurrency {
                let Some(group) = groups.next() else { break };
                tasks.spawn(publish_in_order(self.publisher.clone(), group));
            }
            let Some(done) = tasks.join_next().await else {
                return total;
            };
            match done {
                Ok(one) => {
                    total.sent.extend(one.sent);
                    total.failed += one.failed;
                    total.held_back += one.held_back;
                    total.max_lag = total.max_lag.max(one.max_lag);
                }
                // A publisher that panicked: its aggregate's messages stay unsent (those it
                // sent before are published again next run, with the same ids).
                Err(e) => {
                    tracing::error!(error = %e, "an outbox publisher panicked");
                    total.failed += 1;
                }
            }
        }
    }
}

/// Publishes one aggregate's messages of a page, one after the other, stopping at the first
/// that fails.
async fn publish_in_order(publisher: Arc<dyn Publisher>, group: Vec<PendingMessage>) -> Published {
    let mut out = Published::default();
    let count = group.len() as u64;
    for pending in group {
        let m: &OutboxMessage = &pending.message;
        if let Err(e) = publisher.publish(m).await {
            tracing::warn!(
                error = %e,
                id = %m.id,
                aggregate_type = %m.aggregate_type,
                aggregate_id = %m.aggregate_id,
                "publishing an outbox message failed; it and the rest of its aggregate stay unsent"
            );
            out.failed = 1;
            out.held_back = count - out.sent.len() as u64 - 1;
            return out;
        }
        let lag = SystemTime::now()
            .duration_since(pending.added_at)
            .unwrap_or_default();
        out.max_lag = out.max_lag.max(lag);
        out.sent.push(m.id);
    }
    out
}

/// Controls a [spawned](Dispatcher::spawn) dispatcher. Dropping it stops the dispatcher too
/// (after the page in progress); [`shutdown`](DispatcherHandle::shutdown) also waits for that.
///
/// ```
/// use std::sync::Arc;
/// use idem::{ChannelPublisher, Dispatcher, DispatcherConfig, MemoryOutbox, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let (publisher, _received) = ChannelPublisher::new(16);
/// let handle = Dispatcher::new(Arc::new(MemoryStore::new()), Arc::new(MemoryOutbox::new()), Arc::new(publisher), Default::default())?.spawn();
/// assert_eq!(handle.last_report(), None);
/// handle.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DispatcherHandle(Background<DispatchReport>);

impl DispatcherHandle {
    /// The report of the latest successful run, if any.
    pub fn last_report(&self) -> Option<DispatchReport> {
        self.0.last_report()
    }

    /// Waits for the next successful run and returns its report; `None` once the dispatcher
    /// has stopped.
    pub async fn next_report(&mut self) -> Option<DispatchReport> {
        self.0.next_report().await
    }

    /// Stops the dispatcher after the page in progress, lets it release its lease, and waits
    /// for it. A panic inside the dispatcher task is resumed here.
    pub async fn shutdown(self) {
        self.0.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::outbox::MemoryOutbox;
    use crate::{BoxError, MemoryStore};

    /// Records what it published; fails the `fail`-th message of aggregate `o-2` once.
    #[derive(Default)]
    struct Broker {
        got: Mutex<Vec<(String, String)>>,
        calls: AtomicUsize,
        fail_once: Mutex<Option<String>>,
    }

    #[async_trait]
    impl Publisher for Broker {
        async fn publish(&self, m: &OutboxMessage) -> Result<(), BoxError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut fail = self.fail_once.lock().unwrap();
            if fail.as_deref() == Some(m.kind.as_str()) {
                *fail = None;
                return Err("the broker refused it".into());
            }
            self.got
                .lock()
                .unwrap()
                .push((m.aggregate_id.clone(), m.kind.clone()));
            Ok(())
        }
    }

    fn add(outbox: &MemoryOutbox, aggregate: &str, kind: &str) {
        let key = Key::derive("orders", "", aggregate).unwrap();
        let m = OutboxMessage::new(
            MessageId::derive(&key, kind),
            "order",
            aggregate,
            kind,
            vec![],
        )
        .unwrap();
        outbox.add(m);
    }

    fn dispatcher(outbox: &Arc<MemoryOutbox>, broker: &Arc<Broker>, batch: u32) -> Dispatcher {
        Dispatcher::new(
            Arc::new(MemoryStore::new()),
            outbox.clone(),
            broker.clone(),
            DispatcherConfig::new().batch_size(batch).concurrency(4),
        )
        .unwrap()
    }

    /// **In order per aggregate, a failure holds its aggregate back.** Two aggregates, three
    /// messages each; the broker refuses o-2's second once: o-1's all go, o-2's first goes and
    /// its third is held back; the next run publishes o-2's second then third, and nothing
    /// twice.
    #[tokio::test]
    async fn a_failure_holds_back_its_aggregate_in_order() {
        let outbox = Arc::new(MemoryOutbox::new());
        for n in 1..=3 {
            add(&outbox, "o-1", &format!("a{n}"));
            add(&outbox, "o-2", &format!("b{n}"));
        }
        let broker = Arc::new(Broker::default());
        *broker.fail_once.lock().unwrap() = Some("b2".into());
        let d = dispatcher(&outbox, &broker, 100);
        let first = d.run_once().await.unwrap();
        assert_eq!((first.published, first.failed, first.held_back), (4, 1, 1));
        assert!(!first.drained);
        let second = d.run_once().await.unwrap();
        assert_eq!(
            (second.published, second.failed, second.drained),
            (2, 0, true)
        );
        let got = broker.got.lock().unwrap().clone();
        for aggregate in ["o-1", "o-2"] {
            let kinds: Vec<&str> = got
                .iter()
                .filter(|(a, _)| a == aggregate)
                .map(|(_, k)| k.as_str())
                .collect();
            let want: Vec<String> = (1..=3)
                .map(|n| format!("{}{n}", if aggregate == "o-1" { "a" } else { "b" }))
                .collect();
            assert_eq!(kinds, want, "{aggregate}");
        }
        assert_eq!(
            broker.calls.load(Ordering::SeqCst),
            7,
            "6 messages, one tried twice"
        );
        assert!(outbox.pending(10).await.unwrap().is_empty());
    }

    /// **Pages until drained; a held lease skips.** 25 messages in pages of 10 are published
    /// in one run (3 pages); a second dispatcher while the first's lease is held skips.
    #[tokio::test]
    async fn pages_until_drained_and_one_holder_at_a_time() {
        let outbox = Arc::new(MemoryOutbox::new());
        for n in 0..25 {
            add(&outbox, &format!("o-{n}"), "placed");
        }
        let broker = Arc::new(Broker::default());
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let config = DispatcherConfig::new().batch_size(10);
        let d = Dispatcher::new(
            store.clone(),
            outbox.clone(),
            broker.clone(),
            config.clone(),
        )
        .unwrap();
        let report = d.run_once().await.unwrap();
        assert_eq!(
            (report.published, report.pages, report.drained),
            (25, 3, true)
        );
        let mut holder = RecordsLease::new(store.clone(), || lease_key("outbox"), config.lease);
        assert!(holder.acquire().await.unwrap());
        let other = Dispatcher::new(store, outbox, broker, config).unwrap();
        assert!(other.run_once().await.unwrap().skipped);
    }

    #[test]
    fn bad_configs_are_refused() {
        for bad in [
            DispatcherConfig::new().batch_size(0),
            DispatcherConfig::new().concurrency(0),
            DispatcherConfig::new().interval(Duration::ZERO),
            DispatcherConfig::new().name(""),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
