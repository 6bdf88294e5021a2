//! An in-process cache of completed records, so a replay of a hot key costs no round trip.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::clock::{Clock, SystemClock};
use crate::key::{Fingerprint, Key, KeyMap};
use crate::record::StoredResult;

/// Settings of an engine's in-process cache of completed records, set with
/// [`EngineBuilder::replay_cache`](crate::EngineBuilder::replay_cache). Off by default.
///
/// With the cache on, a call whose key completed earlier (in this process, or read once from the
/// store by this process) replays from memory: zero round trips. The cache holds at most
/// `max_entries` records and `max_bytes` bytes of stored results (the oldest entries leave
/// first). An entry never outlives its record's retention, nor `max_age` (1 minute by default).
///
/// **The same answers as the store.** The cache changes what a replay costs, never what a call
/// gets: an entry keeps what its record holds, including its fingerprint (or that it has none),
/// and a call the entry cannot answer as the store would (a fingerprint it cannot compare) goes
/// to the store. `tests/replay_cache_differential.rs` runs random sequences of calls against an
/// engine with the cache and one without and compares every answer.
///
/// **Clocks.** An entry's lifetime is measured on the cache's [`clock`](Self::clock) (the
/// system clock by default), which also turns a record's expiry, read from the store, into how
/// long the entry may replay. A store that keeps time on another clock (a SQL server whose clock
/// is ahead of this machine's) can see a record expire up to that difference earlier than the
/// cache does, never more than `max_age` earlier.
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
/// use idem::{Error, Idempotency, Key, MemoryStore, ReplayCache, Store};
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
#[derive(Clone)]
pub struct ReplayCache {
    max_entries: usize,
    max_bytes: usize,
    max_age: Duration,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayCache")
            .field("max_entries", &self.max_entries)
            .field("max_bytes", &self.max_bytes)
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

impl ReplayCache {
    /// A cache of at most `max_entries` completed records and `max_bytes` bytes of results.
    ///
    /// ```
    /// use idem::ReplayCache;
    /// let cache = ReplayCache::new(10_000, 16 << 20);
    /// # let _ = cache;
    /// ```
    pub fn new(max_entries: usize, max_bytes: usize) -> ReplayCache {
        ReplayCache {
            max_entries,
            max_bytes,
            max_age: Duration::from_secs(60),
            clock: Arc::new(SystemClock),
        }
    }

    /// How long an entry may be replayed at most, whatever its retention (default 1 minute):
    /// the bound on how long a record deleted elsewhere still replays here.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::ReplayCache;
    /// let cache = ReplayCache::new(10_000, 16 << 20).max_age(Duration::from_secs(5));
    /// # let _ = cache;
    /// ```
    pub fn max_age(mut self, max_age: Duration) -> ReplayCache {
        self.max_age = max_age;
        self
    }

    /// The clock entries age on and records' expiry is compared with (the system clock by
    /// default). Tests that control a [`MemoryStore`](crate::MemoryStore)'s clock give the
    /// cache the same one, so that both see a retention end at the same moment.
    ///
    /// ```
    /// use idem::{ManualClock, MemoryStore, ReplayCache};
    /// let clock = ManualClock::new();
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let cache = ReplayCache::new(100, 1 << 20).clock(clock);
    /// # let _ = (store, cache);
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> ReplayCache {
        self.clock = Arc::new(clock);
        self
    }
}

/// What the cache knows of a record's fingerprint: the store compares the fingerprint a call
/// gives with the record's, so the cache answers a call with a fingerprint only when it knows
/// what the store would answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    /// The record has this fingerprint, or none (`None`): this process completed it.
    Exactly(Option<Fingerprint>),
    /// The record has this fingerprint or none: the store replayed it to a call that gave this
    /// one, which it does in both cases.
    ThisOrNone(Fingerprint),
    /// Nothing: the store replayed it to a call that gave no fingerprint.
    Nothing,
}

impl Known {
    /// What a replay from the store to a call that gave `given` tells of the record.
    pub(super) fn from_replay(given: Option<Fingerprint>) -> Known {
        match given {
            Some(given) => Known::ThisOrNone(given),
            None => Known::Nothing,
        }
    }
}

/// What the cache knows of a key.
pub(super) enum Hit {
    /// The record, to replay.
    Replay(StoredResult),
    /// The record was completed with another fingerprint.
    Reused,
}

struct Entry {
    response: Option<Vec<u8>>,
    is_error: bool,
    expires_at: SystemTime,
    fingerprint: Known,
    /// The entry's end on the cache's clock: its record's retention end, or `max_age` after it
    /// was kept, whichever is sooner.
    until: SystemTime,
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

    /// The cache's time now.
    pub(super) fn now(&self) -> SystemTime {
        self.settings.clock.now()
    }

    /// The record of `key`, if cached and still live, for a call with `fingerprint`; `None`
    /// when the store is to be asked.
    pub(super) fn get(&self, key: &Key, fingerprint: Option<&Fingerprint>) -> Option<Hit> {
        let now = self.now();
        let mut entries = self.lock();
        let entry = entries.map.get(key)?;
        if now >= entry.until {
            entries.remove(key);
            return None;
        }
        let replay = || {
            Some(Hit::Replay(StoredResult {
                response: entry.response.clone(),
                is_error: entry.is_error,
                expires_at: entry.expires_at,
                not_retained: None,
            }))
        };
        let Some(given) = fingerprint else {
            // The store replays a completed record to a call without a fingerprint.
            return replay();
        };
        match entry.fingerprint {
            Known::Exactly(None) => replay(),
            Known::Exactly(Some(known)) if known == *given => replay(),
            Known::Exactly(Some(_)) => Some(Hit::Reused),
            Known::ThisOrNone(known) if known == *given => replay(),
            // The record's fingerprint is another or none: only the store knows which.
            Known::ThisOrNone(_) | Known::Nothing => None,
        }
    }

    /// Keeps a completed record of `key`, replayable until `until` on the cache's clock (and
    /// never past `max_age` from now).
    pub(super) fn put(
        &self,
        key: Key,
        fingerprint: Known,
        cached: &StoredResult,
        until: SystemTime,
    ) {
        let until = until.min(self.now() + self.settings.max_age);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn key(i: u32) -> Key {
        Key::derive("cache", "", &i.to_string()).unwrap()
    }

    fn record(len: usize) -> StoredResult {
        StoredResult {
            response: Some(vec![7; len]),
            is_error: false,
            expires_at: SystemTime::now() + Duration::from_secs(3600),
            not_retained: None,
        }
    }

    fn cache(settings: ReplayCache) -> (Cache, ManualClock) {
        let clock = ManualClock::new();
        (Cache::new(settings.clock(clock.clone())), clock)
    }

    #[test]
    fn bounded_by_entries_and_bytes_oldest_first() {
        let (cache, clock) = cache(ReplayCache::new(3, 250));
        let later = clock.now() + Duration::from_secs(30);
        let none = Known::Exactly(None);
        for i in 0..5 {
            cache.put(key(i), none, &record(100), later);
        }
        // 250 bytes hold two 100-byte results: the three oldest are gone.
        assert_eq!(cache.len(), (2, 200));
        assert!(cache.get(&key(2), None).is_none());
        assert!(matches!(cache.get(&key(4), None), Some(Hit::Replay(_))));
        let (cache, _) = self::cache(ReplayCache::new(3, 1 << 20));
        for i in 0..1_000 {
            cache.put(key(i), none, &record(1), later);
        }
        assert_eq!(cache.len(), (3, 3));
        assert!(matches!(cache.get(&key(999), None), Some(Hit::Replay(_))));
        // A result larger than the whole cache is not kept.
        cache.put(key(5_000), none, &record(2 << 20), later);
        assert!(cache.get(&key(5_000), None).is_none());
    }

    #[test]
    fn an_entry_never_outlives_its_retention_nor_max_age() {
        let (cache, clock) = cache(ReplayCache::new(10, 1 << 20).max_age(Duration::from_secs(60)));
        let none = Known::Exactly(None);
        cache.put(
            key(1),
            none,
            &record(1),
            clock.now() + Duration::from_secs(5),
        );
        cache.put(
            key(2),
            none,
            &record(1),
            clock.now() + Duration::from_secs(600),
        );
        clock.advance(Duration::from_secs(5));
        assert!(cache.get(&key(1), None).is_none(), "past its retention");
        assert!(cache.get(&key(2), None).is_some());
        clock.advance(Duration::from_secs(55));
        assert!(cache.get(&key(2), None).is_none(), "past max_age");
        assert_eq!(cache.len(), (0, 0));
    }

    #[test]
    fn fingerprints_are_answered_as_the_store_would_or_left_to_it() {
        let (cache, clock) = cache(ReplayCache::new(10, 1 << 20));
        let later = clock.now() + Duration::from_secs(30);
        let (a, b) = (Fingerprint::of_bytes(b"a"), Fingerprint::of_bytes(b"b"));
        let replays = |k, given: Option<&Fingerprint>| {
            matches!(cache.get(&key(k), given), Some(Hit::Replay(_)))
        };
        // Completed here with `a`: the record has `a`.
        cache.put(key(1), Known::Exactly(Some(a)), &record(1), later);
        assert!(replays(1, Some(&a)) && replays(1, None));
        assert!(matches!(cache.get(&key(1), Some(&b)), Some(Hit::Reused)));
        // Completed here without one: the store replays it to any call.
        cache.put(key(2), Known::Exactly(None), &record(1), later);
        assert!(replays(2, Some(&a)) && replays(2, Some(&b)) && replays(2, None));
        // Replayed by the store to a call with `a`: the record has `a` or none, so `b` asks.
        cache.put(key(3), Known::ThisOrNone(a), &record(1), later);
        assert!(replays(3, Some(&a)) && replays(3, None));
        assert!(cache.get(&key(3), Some(&b)).is_none());
        // Replayed to a call without one: a call that gives one asks the store.
        cache.put(key(4), Known::Nothing, &record(1), later);
        assert!(replays(4, None));
        assert!(cache.get(&key(4), Some(&a)).is_none());
        cache.remove(&key(1));
        assert!(cache.get(&key(1), Some(&a)).is_none());
    }
}
