//! Who waits for a key in this process, and how long work typically takes (for `retry_after`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::key::{Key, KeyMap};

/// A running estimate of how long this engine's work takes, for `retry_after`: an exponentially
/// weighted mean over a sample of recent calls (weight 1/8; see [`Typical::wants_sample`]), in
/// microseconds; zero until the first call.
/// Aligned to a cache line of its own (128 bytes: two 64-byte lines, which some CPUs fetch in
/// pairs), so that its writes do not take from other cores the line of the engine's fields that
/// every call reads (the store, the count of releases under way, the count of waiters).
#[derive(Default)]
#[repr(align(128))]
pub(super) struct Typical(AtomicU64);

/// `retry_after` before any work has finished in this engine.
pub(super) const FIRST_GUESS: Duration = Duration::from_secs(1);
/// One claimed call in this many times its work for the estimate (when nothing else times it).
pub(super) const SAMPLE_ONE_IN: u32 = 8;
/// The shortest `retry_after`: retrying sooner only spends a round trip.
pub(super) const MIN_RETRY_AFTER: Duration = Duration::from_millis(10);

impl Typical {
    pub(super) fn observe(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        // A lost update between two racing calls only skips one sample.
        let old = self.0.load(Ordering::Relaxed);
        let new = if old == 0 {
            took
        } else {
            old - old / 8 + took / 8
        }
        .max(1);
        // Storing the same value would still take the cache line from every other core that
        // reads it; work of steady length (or under 8 µs) leaves the estimate as it was.
        if new != old {
            self.0.store(new, Ordering::Relaxed);
        }
    }

    /// Whether a claimed call should time its work for this estimate: every call until the
    /// first sample, then one in [`SAMPLE_ONE_IN`], drawn at random. A mean over a sample tracks
    /// the work's typical time as well, and the calls left out read no clock.
    pub(super) fn wants_sample(&self) -> bool {
        self.0.load(Ordering::Relaxed) == 0 || fastrand::u32(..SAMPLE_ONE_IN) == 0
    }

    /// When a call locked out by a live claim should try again: how long this engine's work
    /// typically takes (at least [`MIN_RETRY_AFTER`]; [`FIRST_GUESS`] before any has finished),
    /// never more than what is left of the holder's lease.
    pub(super) fn retry_after(&self, lease_left: Duration) -> Duration {
        let typical = match self.0.load(Ordering::Relaxed) {
            0 => FIRST_GUESS,
            micros => Duration::from_micros(micros).max(MIN_RETRY_AFTER),
        };
        typical.min(lease_left)
    }
}

/// Per-key wake-ups shared by the waiters of one engine.
#[derive(Default)]
pub(super) struct Waiters {
    slots: Mutex<KeyMap<Arc<Slot>>>,
    /// How many slots the map holds, changed under its lock: zero lets a completion skip the
    /// lock. A waiter that joins after a completion read zero polls the store after joining, and
    /// finds the result there.
    held: AtomicUsize,
}

#[derive(Default)]
pub(super) struct Slot {
    pub(super) notify: Notify,
    polling: AtomicBool,
    /// How many waiters hold this slot; changed only under the map's lock, so the last one out
    /// removes it whatever else holds a reference for a moment.
    members: AtomicUsize,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, KeyMap<Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn join(&self, key: Key) -> SlotRef<'_> {
        let slot = {
            let mut slots = self.lock();
            let slot = slots.entry(key).or_insert_with(|| {
                self.held.fetch_add(1, Ordering::SeqCst);
                Arc::default()
            });
            slot.members.fetch_add(1, Ordering::Relaxed);
            slot.clone()
        };
        SlotRef {
            waiters: self,
            key,
            slot,
        }
    }

    pub(super) fn wake(&self, key: &Key) {
        if self.held.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(slot) = self.lock().get(key) {
            slot.notify.notify_waiters();
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        let len = self.lock().len();
        assert_eq!(
            len,
            self.held.load(Ordering::SeqCst),
            "the slot count is off"
        );
        len
    }
}

/// A waiter's membership in a key's slot; the last one out removes the slot.
pub(super) struct SlotRef<'a> {
    waiters: &'a Waiters,
    key: Key,
    slot: Arc<Slot>,
}

impl std::ops::Deref for SlotRef<'_> {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        &self.slot
    }
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        let mut slots = self.waiters.lock();
        if self.slot.members.fetch_sub(1, Ordering::Relaxed) == 1 {
            slots.remove(&self.key);
            self.waiters.held.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// The one waiter per key that polls the store; leaving hands the role on by waking the others.
pub(super) struct PollerRole<'a>(&'a Slot);

impl<'a> PollerRole<'a> {
    pub(super) fn take(slot: &'a Slot) -> Option<PollerRole<'a>> {
        slot.polling
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| PollerRole(slot))
    }
}

impl Drop for PollerRole<'_> {
    fn drop(&mut self) {
        self.0.polling.store(false, Ordering::Release);
        self.0.notify.notify_waiters();
    }
}
