//! The [`Broker`] trait and the one run loop that drives every long-running consumer: receive a
//! batch, run it through a [`Consumer`] while the broker's hold on its messages is extended, and
//! settle each message by its outcome. The SQS, NATS and Kafka consumers are brokers driven by
//! this loop; a broker of your own is one `impl Broker` away (a database queue, an in-process
//! channel), driven by [`Consumer::run`].

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::Fuse;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;

use idem_core::{Codec, Steps};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;
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
/// 1. [`receive_up_to`](Broker::receive_up_to) a batch of at most as many messages as the
///    consumer has room for (its [`concurrency`](Consumer::concurrency) less the messages
///    still running), waiting for them as a long poll does; a failed receive is logged and
///    tried again after a second; an empty batch is received again.
/// 2. Run it through the consumer, with each claim's lease set to the broker's
///    [`hold`](Broker::hold), and every third of the hold [`extend`](Broker::extend) the hold on
///    the batch's messages (as the engine renews their claims), until every message has its
///    outcome. Each message frees its room as its outcome is known, and once half the
///    concurrency is free the next receive runs beside the batches in hand: a slow message
///    holds up its own batch's settling, not the queue. (Half, not one: every batch costs a
///    receive, a settle and its extends, so batches of one message would multiply them.) In
///    [ordered](Consumer::ordered) mode a batch runs alone, received once the one before it is
///    settled (a group's next message waits for the one before it).
/// 3. [`settle`](Broker::settle) each message of the batch by its outcome's [`Disposition`],
///    once all of them have one; a failed or poison message is logged first.
/// 4. Stop once `shutdown` resolves: no receive after it, and the batches in hand are finished
///    and settled first.
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

    /// Receives a batch of at most `most` messages (at least 1): what the loop calls, with the
    /// room its consumer has left. By default [`receive`](Self::receive), whatever `most`
    /// says: a broker whose batches can be larger than its consumer's concurrency overrides
    /// it, or the loop runs up to a batch more than the concurrency at once (it receives again
    /// only once the messages running are fewer than the concurrency).
    fn receive_up_to(
        &self,
        most: usize,
    ) -> impl Future<Output = Result<Received<Self>, Self::Error>> + Send {
        let _ = most;
        self.receive()
    }

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
    /// resolves; then stops receiving, finishes and settles the batches in hand, and returns.
    /// Up to [`concurrency`](Self::concurrency) messages run at once, across batches: the next
    /// receive asks for the room the running ones leave (in [ordered](Self::ordered) mode, one
    /// batch at a time). The claims' lease is the broker's [`hold`](Broker::hold), extended
    /// with it. A failed receive is logged and tried again after a second. See [`Broker`].
    pub async fn run<B, H>(&self, broker: &B, handler: H, shutdown: impl Future<Output = ()>)
    where
        B: Broker,
        H: MessageHandler<B::Body>,
        H::Error: fmt::Display,
    {
        let (consumer, room, slots) = self.looping();
        let consumer = &consumer;
        receive_loop(broker, shutdown, &room, slots, |batch| {
            consumer.process_received(broker, batch, &handler)
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
        let (consumer, room, slots) = self.looping();
        let consumer = &consumer;
        receive_loop(broker, shutdown, &room, slots, |batch| {
            consumer.process_received_steps(broker, batch, &handler)
        })
        .await
    }

    /// This consumer as a long-running loop runs it: its room (a slot per message it runs at
    /// once, or in ordered mode one for the batch), and a copy whose batches give each
    /// message's slot back as its outcome is known.
    fn looping(&self) -> (Consumer<C>, Arc<Room>, Slots) {
        if self.ordered {
            return (self.clone(), Arc::new(Room::new(1)), Slots::Batch);
        }
        let room = Arc::new(Room::new(self.concurrency));
        let mut consumer = self.clone();
        consumer.room = Some(room.clone());
        (consumer, room, Slots::Messages)
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

/// The message slots of a long-running consumer's loop, shared by the batches it runs at
/// once: the loop takes one for each message it receives, and a message gives its slot back
/// as soon as its outcome is known, before its batch is settled. The loop receives again once
/// half the slots are free (rounded up), so that a batch is not one message with a receive,
/// a settle and extends of its own. In ordered mode a slot is a whole batch (one at a time),
/// given back once the batch is settled.
#[derive(Debug)]
pub(crate) struct Room {
    /// Free slots; below zero when a broker handed out more than it was asked for.
    free: Mutex<isize>,
    /// How many must be free for the next receive.
    enough: isize,
    freed: Notify,
}

impl Room {
    pub(crate) fn new(slots: usize) -> Room {
        let slots = isize::try_from(slots).unwrap_or(isize::MAX).max(1);
        Room {
            free: Mutex::new(slots),
            enough: slots / 2 + slots % 2,
            freed: Notify::new(),
        }
    }

    fn free(&self) -> isize {
        *self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until enough slots are free (half of them); returns how many are.
    async fn wait_free(&self) -> usize {
        loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            // Registered before the count is read, so a slot given back in between wakes it.
            freed.as_mut().enable();
            let free = self.free();
            if free >= self.enough {
                return usize::try_from(free).unwrap_or(1);
            }
            freed.await;
        }
    }

    fn take(&self, n: usize) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        *free = free.saturating_sub(isize::try_from(n).unwrap_or(isize::MAX));
    }

    /// Gives `n` slots back.
    pub(crate) fn give(&self, n: usize) {
        if n == 0 {
            return;
        }
        {
            let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
            *free = free.saturating_add(isize::try_from(n).unwrap_or(isize::MAX));
        }
        self.freed.notify_waiters();
    }
}

/// How a long-running consumer's loop overlaps its batches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slots {
    /// A slot per message, given back by each message as its outcome is known: batches
    /// overlap, up to the consumer's concurrency in messages.
    Messages,
    /// One slot for the whole batch, given back once it is settled: one batch at a time
    /// (ordered mode, where a group's next message must wait for the one before it).
    Batch,
}

/// The loop of a long-running consumer: `receive` batches from `broker` and `process` them (their
/// output dropped) until `shutdown` resolves; then stop receiving, finish the batches in hand and
/// return. With [`Slots::Messages`], a receive asks for as many messages as `room` has free
/// slots and runs beside the batches in hand; with [`Slots::Batch`], it waits for the batch in
/// hand to be settled. A failed receive is logged and tried again after a second.
async fn receive_loop<B, P, PF>(
    broker: &B,
    shutdown: impl Future<Output = ()>,
    room: &Room,
    slots: Slots,
    mut process: P,
) where
    B: Broker,
    P: FnMut(Received<B>) -> PF,
    PF: Future,
{
    let mut shutdown = std::pin::pin!(shutdown);
    let mut running = FuturesUnordered::new();
    // The receive in progress is kept across the loop's turns: a batch that ends while a long
    // poll waits must not cancel it (the messages it is handed would stay hidden until their
    // hold ends).
    let mut receiving = std::pin::pin!(receive(broker, room, slots).fuse());
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = running.next(), if !running.is_empty() => {}
            received = &mut receiving => {
                if let Some(batch) = received.filter(|batch| !batch.is_empty()) {
                    room.take(match slots {
                        Slots::Messages => batch.len(),
                        Slots::Batch => 1,
                    });
                    let batch = process(batch);
                    running.push(async move {
                        batch.await;
                        if slots == Slots::Batch {
                            room.give(1);
                        }
                    });
                }
                receiving.set(receive(broker, room, slots).fuse());
            }
        }
    }
    // Stopped receiving: a receive in progress is dropped now (not left unpolled while the
    // batches in hand are finished and settled).
    receiving.set(Fuse::terminated());
    while running.next().await.is_some() {}
}

/// One receive of [`receive_loop`], once `room` has enough free slots: up to that many messages
/// (any number with [`Slots::Batch`]); `None` after a failed receive, logged, and a second's
/// pause.
async fn receive<B: Broker>(broker: &B, room: &Room, slots: Slots) -> Option<Received<B>> {
    let free = room.wait_free().await;
    let most = match slots {
        Slots::Messages => free,
        Slots::Batch => usize::MAX,
    };
    match broker.receive_up_to(most).await {
        Ok(batch) => Some(batch),
        Err(e) => {
            tracing::warn!("receiving from {} failed: {e}", broker.name());
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
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
