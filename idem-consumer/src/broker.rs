//! The [`Broker`] trait and the one run loop that drives every long-running consumer: receive a
//! batch, run it through a [`Consumer`] while the broker's hold on its messages is extended, and
//! settle each message by its outcome. The SQS, NATS and Kafka consumers are brokers driven by
//! this loop; a broker of your own is one `impl Broker` away (a database queue, an in-process
//! channel), driven by [`Consumer::run`].

use std::fmt;
use std::future::Future;
use std::time::Duration;

use idem_core::{Codec, Steps};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::{Consumer, Disposition, Message, MessageHandler, MessageOutcome};

/// A source of message batches that a [`Consumer`] runs ([`Consumer::run`]): it receives
/// messages, holds each one while it runs (a visibility timeout, an ack wait), extends that hold,
/// and settles each message by its outcome's [`Disposition`].
///
/// A received message comes as its batch [`Message`] (the body the handler gets, its key and its
/// group) and its [`Receipt`](Broker::Receipt): what the broker needs to settle it later (a
/// receipt handle, an acker, an offset).
///
/// [`Consumer::run`] drives a broker in one loop, as opentelemetry's `BatchSpanProcessor` drives a
/// `SpanExporter`:
///
/// 1. [`receive`](Broker::receive) a batch (waiting for it, as a long poll does); a failed
///    receive is logged and tried again after a second; an empty batch is received again.
/// 2. Run it through the consumer, with each claim's lease set to the broker's
///    [`hold`](Broker::hold), and every third of the hold [`extend`](Broker::extend) the hold on
///    the batch's messages (as the engine renews their claims), until every message has its
///    outcome.
/// 3. [`settle`](Broker::settle) each message by its outcome's [`Disposition`]; a failed or
///    poison message is logged first.
/// 4. Stop once `shutdown` resolves; it is watched while receiving, so a batch in hand is
///    finished and settled first.
///
/// An in-process queue, as a broker: received messages are held until settled, a message handed
/// back comes again, a poison one goes to a dead-letter list.
///
/// ```
/// use std::collections::VecDeque;
/// use std::sync::Mutex;
/// use std::time::Duration;
/// use idem::consumer::{Broker, Consumer, Disposition, Message, Received};
/// use idem::{Idempotency, MemoryStore};
///
/// #[derive(Default)]
/// struct Queue {
///     ready: Mutex<VecDeque<(String, u64)>>, // (order id, cents)
///     dead: Mutex<Vec<String>>,
/// }
///
/// impl Broker for Queue {
///     type Body = u64;
///     type Receipt = (String, u64);
///     type Error = std::convert::Infallible;
///
///     fn hold(&self) -> Duration {
///         Duration::from_secs(30)
///     }
///
///     async fn receive(&self) -> Result<Received<Self>, Self::Error> {
///         let mut ready = self.ready.lock().unwrap();
///         let n = ready.len().min(10);
///         Ok(ready.drain(..n).map(|(id, cents)| (Message::keyed(cents, id.clone()), (id, cents))).collect())
///     }
///
///     async fn extend(&self, _held: &[(String, u64)]) {} // nothing comes back on its own here
///
///     async fn settle(&self, settled: Vec<((String, u64), Disposition)>) {
///         for (message, disposition) in settled {
///             match disposition {
///                 Disposition::Acknowledge => {}
///                 Disposition::Redeliver { .. } => self.ready.lock().unwrap().push_back(message),
///                 Disposition::DeadLetter => self.dead.lock().unwrap().push(message.0),
///             }
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let queue = Queue::default();
/// for (id, cents) in [("order-1", 4200), ("order-2", 900), ("order-1", 4200)] {
///     queue.ready.lock().unwrap().push_back((id.to_owned(), cents));
/// }
/// let consumer = Consumer::new(Idempotency::new(MemoryStore::new()), "charge")?;
/// let charge = |cents: u64| async move { Ok::<_, std::io::Error>(format!("charged {cents}")) };
/// // Runs until the queue is drained (a real service stops on a signal).
/// let drained = async {
///     while !queue.ready.lock().unwrap().is_empty() {
///         tokio::task::yield_now().await;
///     }
/// };
/// consumer.run(&queue, charge, drained).await;
/// assert!(queue.dead.lock().unwrap().is_empty());
/// # Ok(()) }
/// ```
pub trait Broker: Sync {
    /// A message's body, as the handler gets it.
    type Body;
    /// What settles a received message: a receipt handle, an acker, an offset.
    type Receipt: Sync;
    /// Why a receive failed (logged; the loop tries again after a second).
    type Error: fmt::Display;

    /// How long a received message stays held (invisible, unacknowledged) before the broker
    /// would deliver it again: the claims' lease. The loop [`extend`](Self::extend)s the hold
    /// every third of it while the batch runs, so a message never comes back while its claim
    /// lives, and a consumer that dies stops both.
    fn hold(&self) -> Duration;

    /// A short name for the logs ("SQS", "JetStream").
    fn name(&self) -> &str {
        "the broker"
    }

    /// Receives a batch, each message with its receipt (an empty batch is fine: the loop
    /// receives again). It may wait for messages, as a long poll does.
    fn receive(&self) -> impl Future<Output = Result<Received<Self>, Self::Error>> + Send;

    /// Extends the hold on these messages (received, not settled yet) by [`hold`](Self::hold).
    /// A failure is the broker's to log: the message may come back early and meet its claim
    /// ([`InFlight`](MessageOutcome::InFlight)).
    fn extend(&self, held: &[Self::Receipt]) -> impl Future<Output = ()> + Send;

    /// Settles each message of a batch by its disposition: acknowledges the ones done, hands
    /// back the others (after `after` where given), dead-letters the poison ones. A failure is
    /// the broker's to log: an acknowledgement lost brings the message back, and it replays.
    fn settle(&self, settled: Vec<(Self::Receipt, Disposition)>)
        -> impl Future<Output = ()> + Send;
}

/// A batch as a [`Broker`] receives it: each message with its [`Receipt`](Broker::Receipt).
pub type Received<B> = Vec<(Message<<B as Broker>::Body>, <B as Broker>::Receipt)>;

impl<C: Codec> Consumer<C> {
    /// Receives batches from `broker` and runs each through `handler`
    /// ([`process`](Self::process)), settling every message by its outcome, until `shutdown`
    /// resolves; then stops receiving, finishes and settles the batch in hand, and returns.
    /// The claims' lease is the broker's [`hold`](Broker::hold), extended with it. A failed
    /// receive is logged and tried again after a second. See [`Broker`].
    pub async fn run<B, H>(&self, broker: &B, handler: H, shutdown: impl Future<Output = ()>)
    where
        B: Broker,
        H: MessageHandler<B::Body>,
        H::Error: fmt::Display,
    {
        receive_loop(broker, shutdown, |batch| {
            self.process_received(broker, batch, &handler)
        })
        .await
    }

    /// [`run`](Self::run) with exactly-once effects: each batch goes through
    /// [`process_steps`](Self::process_steps), whose handler applies each message's effect as
    /// one transactional step.
    pub async fn run_steps<B, T, E, H, F>(
        &self,
        broker: &B,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) where
        B: Broker,
        H: Fn(B::Body, Steps<C>) -> F,
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
    {
        receive_loop(broker, shutdown, |batch| {
            self.process_received_steps(broker, batch, &handler)
        })
        .await
    }

    /// One received batch through [`process`](Self::process), settled on `broker`.
    pub(crate) async fn process_received<B, H>(
        &self,
        broker: &B,
        received: Received<B>,
        handler: &H,
    ) -> Vec<MessageOutcome<H::Value, H::Error>>
    where
        B: Broker,
        H: MessageHandler<B::Body>,
        H::Error: fmt::Display,
    {
        self.settled(broker, received, |consumer, batch| async move {
            consumer.process(batch, handler).await
        })
        .await
    }

    /// One received batch through [`process_steps`](Self::process_steps), settled on `broker`.
    pub(crate) async fn process_received_steps<B, T, E, H, F>(
        &self,
        broker: &B,
        received: Received<B>,
        handler: &H,
    ) -> Vec<MessageOutcome<T, E>>
    where
        B: Broker,
        H: Fn(B::Body, Steps<C>) -> F,
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: fmt::Display,
    {
        self.settled(broker, received, |consumer, batch| async move {
            consumer.process_steps(batch, handler).await
        })
        .await
    }

    /// Runs one received batch through `run` (this consumer with the claims' lease set to the
    /// broker's hold, and the batch) while the heartbeat extends the hold on its messages, then
    /// settles each message by its outcome.
    async fn settled<B, T, E, R, RF>(
        &self,
        broker: &B,
        received: Received<B>,
        run: R,
    ) -> Vec<MessageOutcome<T, E>>
    where
        B: Broker,
        R: FnOnce(Consumer<C>, Vec<Message<B::Body>>) -> RF,
        RF: Future<Output = Vec<MessageOutcome<T, E>>>,
        E: fmt::Display,
    {
        let (batch, receipts): (Vec<_>, Vec<_>) = received.into_iter().unzip();
        let keys: Vec<Option<String>> = batch.iter().map(|m| m.key.clone()).collect();
        let hold = broker.hold();
        let consumer = self.clone().lease(hold);
        let beat = || broker.extend(&receipts);
        // At least a millisecond apart: an interval of zero would never let the work run.
        let every = (hold / 3).max(Duration::from_millis(1));
        let outcomes = with_heartbeat(run(consumer, batch), every, beat).await;
        let mut settled = Vec::with_capacity(outcomes.len());
        for ((receipt, outcome), key) in receipts.into_iter().zip(&outcomes).zip(&keys) {
            let (broker, key) = (broker.name(), key.as_deref().unwrap_or("-"));
            match outcome {
                MessageOutcome::Poison(e) => {
                    tracing::error!(broker, key, "poison message, to the dead-letter queue: {e}")
                }
                MessageOutcome::Uncertain(e) => {
                    tracing::error!(
                        broker,
                        key,
                        "uncertain message, to the dead-letter queue: {e}"
                    )
                }
                MessageOutcome::Failed(failure) => {
                    tracing::warn!(broker, key, "message handed back: {failure}")
                }
                _ => {}
            }
            settled.push((receipt, outcome.disposition()));
        }
        broker.settle(settled).await;
        outcomes
    }
}

/// The loop of a long-running consumer: `receive` a batch from `broker` and `process` it (its
/// output dropped) until `shutdown` resolves, then return (a batch in hand is finished first,
/// as shutdown is only watched while receiving). A failed receive is logged and tried again
/// after a second.
async fn receive_loop<B, P, PF>(broker: &B, shutdown: impl Future<Output = ()>, mut process: P)
where
    B: Broker,
    P: FnMut(Received<B>) -> PF,
    PF: Future,
{
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let received = tokio::select! {
            _ = &mut shutdown => return,
            received = broker.receive() => received,
        };
        match received {
            Ok(batch) if batch.is_empty() => {}
            Ok(batch) => {
                process(batch).await;
            }
            Err(e) => {
                tracing::warn!("receiving from {} failed: {e}", broker.name());
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

/// Runs `work` and, every `every` until it ends, `beat` (extending the broker's hold on the
/// batch's messages as the engine renews their claims). Both are polled together: a slow beat
/// never holds up the work, whose claims renew inside it.
async fn with_heartbeat<O, B, BF>(work: impl Future<Output = O>, every: Duration, mut beat: B) -> O
where
    B: FnMut() -> BF,
    BF: Future<Output = ()>,
{
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    let heartbeat = async {
        loop {
            tick.tick().await;
            beat().await;
        }
    };
    tokio::select! {
        out = work => out,
        never = heartbeat => never,
    }
}
