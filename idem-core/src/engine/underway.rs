//! What this process has under way for a key (a release, a completion retried in the
//! background), so that a call of the key here waits for it instead of meeting the key's claim
//! in the store.

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use super::finish::PendingResult;
use super::Shared;
use crate::key::{Key, KeyMap};
use crate::store::Store;

/// Keys with something under way in this process that a call of the key must wait for instead
/// of meeting the key's claim in the store: a release ([`Releases`]), or a completion retried in
/// the background ([`Completions`]), each with what the call needs of it (`V`).
pub(super) struct Underway<V> {
    /// How many are under way: zero lets every call skip the map.
    count: AtomicUsize,
    keys: Mutex<KeyMap<Slot<V>>>,
}

/// The keys whose claims this process is releasing.
pub(super) type Releases = Underway<()>;

/// The keys whose completions this process retries in the background, with their results.
pub(super) type Completions = Underway<Arc<PendingResult>>;

struct Slot<V> {
    done: Arc<Notify>,
    count: usize,
    value: V,
}

impl<V> Default for Underway<V> {
    fn default() -> Self {
        Underway {
            count: AtomicUsize::new(0),
            keys: Mutex::new(KeyMap::default()),
        }
    }
}

impl<V: Clone> Underway<V> {
    fn lock(&self) -> std::sync::MutexGuard<'_, KeyMap<Slot<V>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more under way for `key` (the first one's `value` is the key's).
    pub(super) fn begin(&self, key: Key, value: V) {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.lock()
            .entry(key)
            .or_insert_with(|| Slot {
                done: Arc::new(Notify::new()),
                count: 0,
                value,
            })
            .count += 1;
    }

    /// One fewer under way for `key`; the last one wakes whoever waits.
    pub(super) fn end(&self, key: &Key) {
        let ended = {
            let mut keys = self.lock();
            match keys.get_mut(key) {
                Some(slot) if slot.count > 1 => {
                    slot.count -= 1;
                    None
                }
                Some(_) => keys.remove(key).map(|slot| slot.done),
                None => None,
            }
        };
        self.count.fetch_sub(1, Ordering::AcqRel);
        if let Some(done) = ended {
            done.notify_waiters();
        }
    }

    /// Whether anything is under way in this process; if not, [`get`](Self::get) finds nothing
    /// and [`settled`](Self::settled) returns at once.
    pub(super) fn under_way(&self) -> bool {
        self.count.load(Ordering::Acquire) != 0
    }

    /// What is under way for `key`, if anything.
    pub(super) fn get(&self, key: &Key) -> Option<V> {
        if !self.under_way() {
            return None;
        }
        self.lock().get(key).map(|slot| slot.value.clone())
    }

    /// Waits until nothing is under way for `key` in this process, for at most `bound`: `true`
    /// when that came, `false` when `bound` passed first.
    pub(super) async fn settled(&self, key: &Key, bound: Duration) -> bool {
        if !self.under_way() {
            return true;
        }
        tokio::time::timeout(bound, async {
            // Bounded: each pass waits for one end of what is under way for the key.
            loop {
                let done = match self.lock().get(key) {
                    Some(slot) => slot.done.clone(),
                    None => return,
                };
                let mut ended = pin!(done.notified());
                ended.as_mut().enable();
                // It may have ended between the look-up and `enable`.
                if !self
                    .lock()
                    .get(key)
                    .is_some_and(|slot| Arc::ptr_eq(&slot.done, &done))
                {
                    continue;
                }
                ended.await;
            }
        })
        .await
        .is_ok()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A release under way; dropping it (done, or its task dropped) ends it and wakes whoever waits.
pub(super) struct Releasing {
    shared: Arc<Shared>,
    key: Key,
}

impl Releasing {
    /// The store the claim is released in.
    pub(super) fn store(&self) -> &dyn Store {
        &*self.shared.store
    }

    pub(super) fn begin(shared: &Arc<Shared>, key: Key) -> Releasing {
        shared.releases.begin(key, ());
        Releasing {
            shared: shared.clone(),
            key,
        }
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        self.shared.releases.end(&self.key);
        self.shared.waiters.wake(&self.key);
    }
}
