//! An in-process cache of completed records, so a replay of a hot key costs no round trip.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::key::{Fingerprint, Key, KeyMap};
use crate::record::Cached;

/// Settings of an engine's in-process cache of completed records, set with
/// [`Builder::replay_cache`](crate::Builder::replay_cache). Off by default.
///
/// With the cache on, a call whose key completed earlier (in this process, or read once from the
/// store by this process) replays from memory: zero round trips. The cache holds at most
/// `max_entries` records and `max_bytes` bytes of stored results (the oldest entries leave
/// first). An entry never outlives its record's retention, nor `max_age` (1 minute by default).
///
/// **Across nodes.** An entry is a copy of a completed record, and a completed record never
/// changes until it expires, so a cached replay is always the result the work returned: the
/// cache cannot make work run twice, nor replay another key's result. What it can do is replay a
/// record that was deleted elsewhere: evicted by another node, by the CLI, or through
/// [`Store::evict`](crate::Store::evict) directly. Such an entry keeps replaying for at most
/// `max_age` (or until its retention ends, if sooner); [`Idempotency::evict`](crate::Idempotency::evict)
/// clears it in this process at once. Keep `max_age` short where records are evicted by hand.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Error, Idempotency, Key, MemoryStore, ReplayCache, Store};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let store = std::sync::Arc::new(MemoryStore::new());
/// let engine = Idempotency::builder(store.clone())
///     .replay_cache(ReplayCache::new(10_000, 16 << 20).max_age(Duration::from_secs(30)))
///     .build()?;
/// let key = Key::derive("charge", "", "order-1")?;
/// engine.call(key).run(async { Ok::<_, Error>(4200u64) }).await?;
/// store.evict(&key).await?; // behind the engine's back: the cache still replays
/// let again = engine.call(key).run(async { Ok::<_, Error>(1u64) }).await?;
/// assert_eq!(again.into_inner(), 4200);
/// engine.evict(&key).await?; // through the engine: gone here too, so the work runs again
/// let fresh = engine.call(key).run(async { Ok::<_, Error>(7u64) }).await?;
/// assert_eq!(fresh.into_inner(), 7);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayCache {
    max_entries: usize,
    max_bytes: usize,
    max_age: Duration,
}

impl ReplayCache {
    /// A cache of at most `max_entries` completed records and `max_bytes` bytes of results.
    pub fn new(max_entries: usize, max_bytes: usize) -> ReplayCache {
        ReplayCache {
            max_entries,
            max_bytes,
            max_age: Duration::from_secs(60),
        }
    }

    /// How long an entry may be replayed at most, whatever its retention (default 1 minute):
    /// the bound on how long a record deleted elsewhere still replays here.
    pub fn max_age(mut self, max_age: Duration) -> ReplayCache {
        self.max_age = max_age;
        self
    }
}

/// What the cache knows of a key.
pub(super) enum Hit {
    /// The record, to replay.
    Replay(Cached),
    /// The record was completed with another fingerprint.
    Reused,
}

struct Entry {
    response: Option<Vec<u8>>,
    is_error: bool,
    expires_at: SystemTime,
    /// The fingerprint the record is known to have; `None` when unknown (it was replayed to a
    /// call that gave none), so a call with a fingerprint asks the store.
    fingerprint: Option<Fingerprint>,
    until: Instant,
    /// Which insertion of the key this is, to tell its place in `order` from older ones.
    generation: u64,
}

#[derive(Default)]
struct Entries {
    map: KeyMap<Entry>,
    /// Keys in insertion order, with the generation inserted; stale places are skipped.
    order: VecDeque<(Key, u64)>,
    bytes: usize,
    generation: u64,
}

/// The cache of one engine.
pub(super) struct Cache {
    settings: ReplayCache,
    entries: Mutex<Entries>,
}

impl Cache {
    pub(super) fn new(settings: ReplayCache) -> Cache {
        Cache {
            settings,
            entries: Mutex::new(Entries::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The record of `key`, if cached and still live, for a call with `fingerprint`.
    pub(super) fn get(&self, key: &Key, fingerprint: Option<&Fingerprint>) -> Option<Hit> {
        let mut entries = self.lock();
        let entry = entries.map.get(key)?;
        if Instant::now() >= entry.until {
            entries.remove(key);
            return None;
        }
        match (entry.fingerprint.as_ref(), fingerprint) {
            (Some(known), Some(given)) if known != given => Some(Hit::Reused),
            (None, Some(_)) => None,
            _ => Some(Hit::Replay(Cached {
                response: entry.response.clone(),
                is_error: entry.is_error,
                expires_at: entry.expires_at,
            })),
        }
    }

    /// Keeps a completed record of `key`, replayable until `until` (and never past its
    /// retention or the cache's `max_age`).
    pub(super) fn put(
        &self,
        key: Key,
        fingerprint: Option<Fingerprint>,
        cached: &Cached,
        until: Instant,
    ) {
        let until = until.min(Instant::now() + self.settings.max_age);
        let size = cached.response.as_ref().map_or(0, Vec::len);
        if size > self.settings.max_bytes || self.settings.max_entries == 0 {
            return;
        }
        let mut entries = self.lock();
        entries.remove(&key);
        entries.generation += 1;
        let generation = entries.generation;
        entries.bytes += size;
        entries.order.push_back((key, generation));
        entries.map.insert(
            key,
            Entry {
                response: cached.response.clone(),
                is_error: cached.is_error,
                expires_at: cached.expires_at,
                fingerprint,
                until,
                generation,
            },
        );
        // Bounded: each pass removes one place from `order`.
        while entries.map.len() > self.settings.max_entries
            || entries.bytes > self.settings.max_bytes
            || entries.order.len() > 2 * self.settings.max_entries + 16
        {
            let Some((oldest, generation)) = entries.order.pop_front() else {
                break;
            };
            if entries
                .map
                .get(&oldest)
                .is_some_and(|e| e.generation == generation)
            {
                entries.remove(&oldest);
            }
        }
    }

    /// Forgets `key`.
    pub(super) fn remove(&self, key: &Key) {
        self.lock().remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        let entries = self.lock();
        (entries.map.len(), entries.bytes)
    }
}

impl Entries {
    fn remove(&mut self, key: &Key) {
        if let Some(entry) = self.map.remove(key) {
            self.bytes -= entry.response.as_ref().map_or(0, Vec::len);
        }
    }
}

/// When a record replayed from the store stops being replayable, on the engine's clock: its
/// retention end (read from the store's clock) as seen from now.
pub(super) fn until(expires_at: SystemTime) -> Instant {
    let left = expires_at
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Instant::now() + left
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Key {
        Key::derive("cache", "", &i.to_string()).unwrap()
    }

    fn record(len: usize) -> Cached {
        Cached {
            response: Some(vec![7; len]),
            is_error: false,
            expires_at: SystemTime::now() + Duration::from_secs(3600),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_by_entries_and_bytes_oldest_first() {
        let cache = Cache::new(ReplayCache::new(3, 250));
        let later = Instant::now() + Duration::from_secs(30);
        for i in 0..5 {
            cache.put(key(i), None, &record(100), later);
        }
        // 250 bytes hold two 100-byte results: the three oldest are gone.
        assert_eq!(cache.len(), (2, 200));
        assert!(cache.get(&key(2), None).is_none());
        assert!(matches!(cache.get(&key(4), None), Some(Hit::Replay(_))));
        let cache = Cache::new(ReplayCache::new(3, 1 << 20));
        for i in 0..1_000 {
            cache.put(key(i), None, &record(1), later);
        }
        assert_eq!(cache.len(), (3, 3));
        assert!(matches!(cache.get(&key(999), None), Some(Hit::Replay(_))));
        // A result larger than the whole cache is not kept.
        cache.put(key(5_000), None, &record(2 << 20), later);
        assert!(cache.get(&key(5_000), None).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_never_outlives_its_retention_nor_max_age() {
        let cache = Cache::new(ReplayCache::new(10, 1 << 20).max_age(Duration::from_secs(60)));
        cache.put(
            key(1),
            None,
            &record(1),
            Instant::now() + Duration::from_secs(5),
        );
        cache.put(
            key(2),
            None,
            &record(1),
            Instant::now() + Duration::from_secs(600),
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(cache.get(&key(1), None).is_none(), "past its retention");
        assert!(cache.get(&key(2), None).is_some());
        tokio::time::advance(Duration::from_secs(55)).await;
        assert!(cache.get(&key(2), None).is_none(), "past max_age");
        assert_eq!(cache.len(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn fingerprints_are_checked_or_left_to_the_store() {
        let cache = Cache::new(ReplayCache::new(10, 1 << 20));
        let later = Instant::now() + Duration::from_secs(30);
        let (a, b) = (Fingerprint::of_bytes(b"a"), Fingerprint::of_bytes(b"b"));
        cache.put(key(1), Some(a), &record(1), later);
        assert!(matches!(cache.get(&key(1), Some(&a)), Some(Hit::Replay(_))));
        assert!(matches!(cache.get(&key(1), None), Some(Hit::Replay(_))));
        assert!(matches!(cache.get(&key(1), Some(&b)), Some(Hit::Reused)));
        // Unknown fingerprint: a call that gives one asks the store.
        cache.put(key(2), None, &record(1), later);
        assert!(cache.get(&key(2), Some(&a)).is_none());
        cache.remove(&key(1));
        assert!(cache.get(&key(1), Some(&a)).is_none());
    }
}
