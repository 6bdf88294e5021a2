//! [`MemoryStore`]: records in a hash map, for tests and single-process services.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::key::{Fingerprint, Key, KeyMap, Token};
use crate::record::{Cached, Claim, Completion, Record, RecordState, Start};
use crate::store::{check_duration, check_fingerprint, Store};

#[derive(Clone)]
struct Entry {
    fingerprint: Option<Fingerprint>,
    /// The token of the claim that wrote the record, kept after completion so that completing
    /// the same claim again is recognised.
    token: Token,
    state: RecordState,
}

impl Entry {
    fn expires_at(&self) -> SystemTime {
        match &self.state {
            RecordState::InProgress { lease_until, .. } => *lease_until,
            RecordState::Completed(c) => c.expires_at,
        }
    }
}

/// How many expired records each mutating call frees after its own work. A new key costs two
/// mutating calls (start, complete), so the store frees up to 16 expired records per record it
/// creates: expiry outpaces creation, and a backlog left by a burst drains as traffic goes on.
const SWEEP: usize = 8;

/// Below this capacity a shard is never shrunk: a small map costs little, and shrinking it would
/// only make it grow again at the next burst.
const MIN_CAPACITY: usize = 128;

/// How many hash maps the records are split over. A hash map grows and shrinks by rehashing all
/// its entries in one call; split 64 ways, that call moves a 64th of the records (a shrink after
/// a burst of a million records held the lock 286 ms in one map).
const SHARDS: usize = 64;

/// The shard of `key`. Keys are SHA-256 digests, so any bits would do; folding all 32 bytes also
/// spreads keys built with [`Key::from_bytes`] that differ in a few bytes only.
fn shard_of(key: &Key) -> usize {
    usize::from(key.as_bytes().iter().fold(0u8, |acc, b| acc ^ b)) % SHARDS
}

/// The records and their expiry index, always changed together under the store's one lock.
struct Records {
    shards: Vec<KeyMap<Entry>>,
    len: usize,
    /// Every record's `(expires_at, key)`, exactly one per record, earliest first: expired
    /// records are found at the front without looking at any live one.
    by_expiry: BTreeSet<(SystemTime, Key)>,
    /// How many index entries `expire` looked at, so a unit test can count that pruning does not
    /// scan.
    #[cfg(test)]
    examined: usize,
}

impl Default for Records {
    fn default() -> Self {
        Records {
            // An empty `HashMap` allocates nothing, so idle shards cost a few words each.
            shards: (0..SHARDS).map(|_| KeyMap::default()).collect(),
            len: 0,
            by_expiry: BTreeSet::new(),
            #[cfg(test)]
            examined: 0,
        }
    }
}

impl Records {
    fn get(&self, key: &Key) -> Option<&Entry> {
        self.shards[shard_of(key)].get(key)
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Inserts or replaces the record of `key`, moving its index entry.
    fn insert(&mut self, key: Key, entry: Entry) {
        let at = entry.expires_at();
        match self.shards[shard_of(&key)].insert(key, entry) {
            Some(old) => {
                self.by_expiry.remove(&(old.expires_at(), key));
            }
            None => self.len += 1,
        }
        self.by_expiry.insert((at, key));
    }

    fn remove(&mut self, key: &Key) -> Option<Entry> {
        let shard = shard_of(key);
        let entry = self.shards[shard].remove(key)?;
        self.len -= 1;
        self.by_expiry.remove(&(entry.expires_at(), *key));
        // Aborts and evictions empty the map too, not only expiry.
        self.shrink(shard);
        Some(entry)
    }

    /// Applies `f` to the entry still carrying `claim`'s token, or fails with `LeaseLost`; with
    /// `in_progress`, a completed entry counts as lost too. The index follows the new expiry.
    fn update_owned(
        &mut self,
        claim: &Claim,
        in_progress: bool,
        f: impl FnOnce(&mut Entry),
    ) -> Result<(), Error> {
        let key = claim.key();
        let entry = match self.shards[shard_of(key)].get_mut(key) {
            Some(e)
                if e.token == claim.token()
                    && (!in_progress || matches!(e.state, RecordState::InProgress { .. })) =>
            {
                e
            }
            _ => return Err(Error::LeaseLost),
        };
        let before = entry.expires_at();
        f(entry);
        let after = entry.expires_at();
        if after != before {
            self.by_expiry.remove(&(before, *key));
            self.by_expiry.insert((after, *key));
        }
        Ok(())
    }

    /// Frees up to `limit` records whose lease or retention ended at or before `now`, earliest
    /// first, and returns how many. It looks at `limit + 1` index entries at most, whatever the
    /// number of live records.
    fn expire(&mut self, now: SystemTime, limit: usize) -> usize {
        let mut freed = 0;
        while freed < limit {
            #[cfg(test)]
            {
                self.examined += 1;
            }
            match self.by_expiry.first() {
                Some(&(at, key)) if at <= now => {
                    self.by_expiry.pop_first();
                    let shard = shard_of(&key);
                    if self.shards[shard].remove(&key).is_some() {
                        self.len -= 1;
                        self.shrink(shard);
                    }
                    freed += 1;
                }
                _ => break,
            }
        }
        freed
    }

    /// Gives memory back after a burst: when under a quarter of a shard's capacity is used, the
    /// shard is rehashed into twice its length. That rehash is paid by one call, but only after
    /// the shard lost three quarters of its capacity, so it costs O(1) per record freed. The
    /// index needs nothing: a B-tree frees its nodes as they empty.
    fn shrink(&mut self, shard: usize) {
        let map = &mut self.shards[shard];
        let capacity = map.capacity();
        if capacity > MIN_CAPACITY && map.len() < capacity / 4 {
            map.shrink_to(map.len() * 2);
        }
    }
}

/// Records in process memory behind a mutex. Every operation is one lock, no I/O.
///
/// Records live as long as the process; use SQLite or PostgreSQL when a restart must not forget
/// completed work. Time comes from an injectable [`Clock`] ([`SystemClock`] by default).
///
/// # Expiry on its own
///
/// The store frees expired records by itself, so its memory stays bounded under steady load
/// without a [`Pruner`](crate::Pruner):
///
/// - The records are split over 64 hash maps by key, still under one lock, and an index of
///   records by expiry (a B-tree of `(expires_at, key)`) sits next to them. The index moves with
///   every `start`, `complete`, `renew`, `abort` and `evict`.
/// - After its own work, each of those calls frees up to 8 records whose lease or retention has
///   ended, earliest first. A new key is two such calls, so the store frees up to 16 expired
///   records per record it creates: expiry keeps pace with any rate of new keys, and a burst's
///   backlog drains as traffic goes on. `get` frees nothing.
/// - When under a quarter of a map's capacity is in use (and it has more than 128 slots), the
///   map shrinks to twice its length, so the memory of a burst is returned.
///
/// Cost per mutating call, with `n` records held: O(log n) to keep the index, plus up to 8
/// removals of O(log n) each; no call looks at a live record other than the earliest one. A map
/// grows or shrinks by rehashing its entries in the call that triggers it; with 64 maps that is
/// about `n / 64` entries, at most once per doubling or halving of that map.
/// [`prune_expired(limit)`](Store::prune_expired) takes from the front of the index in
/// O(limit · log n) and is only needed to drain at once (say, after a burst with no traffic
/// after it).
///
/// As with a pruner, a claim whose lease has ended may find its record freed by another call,
/// and its `complete` is then [`Error::LeaseLost`]; the engine renews leases while work runs, so
/// this happens only to a claim that stopped renewing.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Completion, Key, ManualClock, MemoryStore, Start, Store};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let clock = ManualClock::new();
/// let store = MemoryStore::with_clock(clock.clone());
/// let lease = Duration::from_secs(30);
/// let old = Key::derive("deposit", "alice", "req-1")?;
/// let Start::Started(claim) = store.start(&old, None, lease).await? else { unreachable!() };
/// store.complete(&claim, Completion { response: None, is_error: false }, Duration::from_secs(60)).await?;
///
/// // Its retention ends; the next call frees it, with no prune.
/// clock.advance(Duration::from_secs(61));
/// let new = Key::derive("deposit", "alice", "req-2")?;
/// store.start(&new, None, lease).await?;
/// assert_eq!(store.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    records: Arc<Mutex<Records>>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.lock().len())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    ///
    /// ```
    /// let store = idem_core::MemoryStore::new();
    /// assert_eq!(store.len(), 0);
    /// ```
    pub fn new() -> MemoryStore {
        MemoryStore::with_clock(SystemClock)
    }

    /// An empty store reading time from `clock`.
    ///
    /// ```
    /// use idem_core::{ManualClock, MemoryStore};
    /// let clock = ManualClock::new();
    /// let store = MemoryStore::with_clock(clock.clone());
    /// assert!(store.is_empty());
    /// ```
    pub fn with_clock(clock: impl Clock) -> MemoryStore {
        MemoryStore {
            records: Arc::default(),
            clock: Arc::new(clock),
        }
    }

    /// How many records are held. Expired records are freed a few per mutating call, so this
    /// may count some whose lease or retention has ended and that no call has freed yet.
    ///
    /// ```
    /// let store = idem_core::MemoryStore::new();
    /// assert_eq!(store.len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is held.
    ///
    /// ```
    /// assert!(idem_core::MemoryStore::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // A panic while holding the lock cannot leave the map and its index out of step: nothing
        // between their paired writes can panic (times are computed before, allocation failure
        // aborts), so the records are consistent and poisoning can be ignored.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs one mutating call under the lock with the current time, then frees up to [`SWEEP`]
    /// expired records. The call's own work comes first, so a claim whose lease ended but that
    /// nobody took over can still complete in this very call.
    fn mutate<R>(&self, f: impl FnOnce(&mut Records, SystemTime) -> R) -> R {
        let mut records = self.lock();
        let now = self.clock.now();
        let out = f(&mut records, now);
        records.expire(now, SWEEP);
        out
    }
}

fn remaining(until: SystemTime, now: SystemTime) -> Duration {
    until.duration_since(now).unwrap_or(Duration::ZERO)
}

#[async_trait]
impl Store for MemoryStore {
    async fn start(
        &self,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        lease: Duration,
    ) -> Result<Start, Error> {
        check_duration("lease", lease)?;
        self.mutate(|records, now| {
            if let Some(e) = records.get(key) {
                if e.expires_at() > now {
                    check_fingerprint(e.fingerprint.as_ref(), fingerprint)?;
                    return Ok(match &e.state {
                        RecordState::InProgress { lease_until, .. } => Start::Locked {
                            retry_after: remaining(*lease_until, now),
                        },
                        RecordState::Completed(c) => Start::Completed(c.clone()),
                    });
                }
            }
            let token = Token::random();
            records.insert(
                *key,
                Entry {
                    fingerprint: fingerprint.copied(),
                    token,
                    state: RecordState::InProgress {
                        token,
                        lease_until: now + lease,
                    },
                },
            );
            Ok(Start::Started(Claim::new(*key, token)))
        })
    }

    async fn complete(
        &self,
        claim: &Claim,
        completion: Completion<'_>,
        retention: Duration,
    ) -> Result<(), Error> {
        check_duration("retention", retention)?;
        self.mutate(|records, now| {
            records.update_owned(claim, false, |e| {
                // Completing the same claim again succeeds and keeps the first result.
                if matches!(e.state, RecordState::InProgress { .. }) {
                    e.state = RecordState::Completed(Cached {
                        response: completion.response.map(<[u8]>::to_vec),
                        is_error: completion.is_error,
                        expires_at: now + retention,
                    });
                }
            })
        })
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        self.mutate(|records, _| {
            records.update_owned(claim, true, |_| ())?;
            records.remove(claim.key());
            Ok(())
        })
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        check_duration("lease", lease)?;
        self.mutate(|records, now| {
            records.update_owned(claim, true, |e| {
                if let RecordState::InProgress { lease_until, .. } = &mut e.state {
                    *lease_until = now + lease;
                }
            })
        })
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let now = self.clock.now();
        Ok(self
            .lock()
            .get(key)
            .filter(|e| e.expires_at() > now)
            .map(|e| Record {
                key: *key,
                fingerprint: e.fingerprint,
                state: e.state.clone(),
            }))
    }

    async fn evict(&self, key: &Key) -> Result<bool, Error> {
        Ok(self.mutate(|records, _| records.remove(key).is_some()))
    }

    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        let now = self.clock.now();
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        Ok(self.lock().expire(now, limit) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const LONG: Duration = Duration::from_secs(3600);
    const RETENTION: Duration = Duration::from_secs(1);

    fn key(i: u64) -> Key {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&i.to_be_bytes());
        Key::from_bytes(bytes)
    }

    fn done() -> Completion<'static> {
        Completion {
            response: Some(b"r"),
            is_error: false,
        }
    }

    async fn claim(store: &MemoryStore, key: &Key, lease: Duration) -> Claim {
        match store.start(key, None, lease).await.unwrap() {
            Start::Started(c) => c,
            other => panic!("expected Started, got {other:?}"),
        }
    }

    impl Records {
        fn capacity(&self) -> usize {
            self.shards.iter().map(KeyMap::capacity).sum()
        }
    }

    /// The index holds exactly one entry per record, at the record's expiry.
    fn assert_in_step(store: &MemoryStore) {
        let records = store.lock();
        assert_eq!(records.by_expiry.len(), records.len);
        let mut held = 0;
        for (shard, map) in records.shards.iter().enumerate() {
            for (k, e) in map {
                assert_eq!(shard_of(k), shard);
                assert!(records.by_expiry.contains(&(e.expires_at(), *k)));
                held += 1;
            }
        }
        assert_eq!(held, records.len);
    }

    #[tokio::test]
    async fn index_follows_every_call() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let renewed = claim(&store, &key(1), Duration::from_secs(1)).await;
        store.renew(&renewed, LONG).await.unwrap();
        let completed = claim(&store, &key(2), LONG).await;
        store.complete(&completed, done(), LONG).await.unwrap();
        // A repeated completion keeps the first retention, so the index does not move either.
        store
            .complete(&completed, done(), Duration::from_secs(1))
            .await
            .unwrap();
        let aborted = claim(&store, &key(3), LONG).await;
        store.abort(&aborted).await.unwrap();
        claim(&store, &key(4), LONG).await;
        assert!(store.evict(&key(4)).await.unwrap());
        // A lease that ended is taken over in place.
        claim(&store, &key(5), Duration::from_secs(1)).await;
        assert_in_step(&store);
        clock.advance(Duration::from_secs(2));
        claim(&store, &key(5), LONG).await;
        assert_in_step(&store);
        assert_eq!(store.len(), 3);
        // The renewed lease and the first retention are what the index holds: neither record
        // goes at its superseded 1 s expiry, both go at their hour, before the re-claimed key.
        clock.advance(LONG - Duration::from_secs(3));
        assert_eq!(store.prune_expired(100).await.unwrap(), 0);
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.prune_expired(100).await.unwrap(), 2);
        assert!(store.get(&key(5)).await.unwrap().is_some());
        assert_in_step(&store);
    }

    /// Claims of keys `0..n`, with the lease `lease(i)`, put straight into the records (a million
    /// calls through the trait would only be slower); the count of examined index entries starts
    /// at zero.
    fn fill(store: &MemoryStore, n: u64, lease: impl Fn(u64) -> Duration) {
        let now = store.clock.now();
        let mut records = store.lock();
        for i in 0..n {
            let token = Token::random();
            let state = RecordState::InProgress {
                token,
                lease_until: now + lease(i),
            };
            let entry = Entry {
                fingerprint: None,
                token,
                state,
            };
            records.insert(key(i), entry);
        }
        records.examined = 0;
    }

    /// `prune_expired(100)` among a million live records removes exactly the 6 expired ones and
    /// looks at them and the first live one, nothing more: it cost 22 ms of lock time when it
    /// scanned the map.
    #[tokio::test]
    async fn prune_does_not_scan_live_records() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        fill(&store, 1_000_005, |i| {
            if i % 200_000 == 0 {
                Duration::from_millis(10)
            } else {
                LONG
            }
        });
        clock.advance(Duration::from_millis(20));
        assert_eq!(store.prune_expired(100).await.unwrap(), 6);
        assert_eq!(store.lock().examined, 7);
        assert_eq!(store.len(), 999_999);
        assert_eq!(store.prune_expired(100).await.unwrap(), 0);
        // Exactly the expired ones went, and every live one stays.
        for i in [0, 1_000_000] {
            assert!(store.get(&key(i)).await.unwrap().is_none());
        }
        for i in [1, 500_001, 1_000_004] {
            assert!(store.get(&key(i)).await.unwrap().is_some());
        }
    }

    /// While a million expired records wait, a call costs its own work plus [`SWEEP`] freed
    /// records: it looks at `SWEEP` index entries, never the million (no scan under the lock).
    #[tokio::test]
    async fn a_claim_among_a_million_expired_records_does_bounded_work() {
        const EXPIRED: u64 = 1_000_000;
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        fill(&store, EXPIRED, |_| Duration::from_millis(10));
        clock.advance(Duration::from_millis(20));

        let fresh = key(EXPIRED);
        let c = claim(&store, &fresh, LONG).await;
        assert_eq!(store.lock().examined, SWEEP);
        assert_eq!(store.len(), (EXPIRED as usize) - SWEEP + 1);
        store.complete(&c, done(), LONG).await.unwrap();
        assert_eq!(store.lock().examined, 2 * SWEEP);
        // A replay frees its few as well, and reads the record in one lookup.
        assert!(matches!(
            store.start(&fresh, None, LONG).await.unwrap(),
            Start::Completed(_)
        ));
        assert_eq!(store.lock().examined, 3 * SWEEP);
        assert_eq!(store.len(), (EXPIRED as usize) - 3 * SWEEP + 1);
    }

    /// A burst of 100,000 keys whose retention then ends is freed by the calls that follow, a few
    /// per call, with nobody calling `prune_expired`, and its memory is returned: the maps'
    /// capacity follows the records held, not the peak.
    #[tokio::test]
    async fn a_burst_is_freed_by_later_calls_and_its_memory_returned() {
        const BURST: u64 = 100_000;
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        for i in 0..BURST {
            let c = claim(&store, &key(i), LONG).await;
            store.complete(&c, done(), RETENTION).await.unwrap();
        }
        assert_eq!(store.len(), BURST as usize);
        let peak = store.lock().capacity();
        assert!(peak >= BURST as usize);
        clock.advance(RETENTION * 2);
        // Each new key is two calls (start, complete), and each call frees up to 8 expired
        // records: 16 per key, so 6,250 new keys free the whole burst.
        let after = BURST / 16;
        for i in BURST..BURST + after {
            let c = claim(&store, &key(i), LONG).await;
            store.complete(&c, done(), LONG).await.unwrap();
        }
        assert_eq!(store.len(), after as usize, "only the new keys are held");
        let capacity = store.lock().capacity();
        assert!(
            capacity <= 4 * after as usize && capacity * 4 <= peak,
            "capacity {capacity} for {after} records after a peak of {peak}"
        );
        assert_eq!(store.prune_expired(u32::MAX).await.unwrap(), 0);
    }

    /// 200,000 keys, one per millisecond, each kept for one second: about 1,000 are live at any
    /// time. The store holds about that many, however many keys have gone by (it held all 200,000
    /// before it expired records by itself).
    #[tokio::test]
    async fn steady_load_stays_bounded() {
        const KEYS: u64 = 200_000;
        const LIVE: usize = 1_000;
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let mut peak = 0;
        for i in 0..KEYS {
            let c = claim(&store, &key(i), LONG).await;
            store.complete(&c, done(), RETENTION).await.unwrap();
            clock.advance(Duration::from_millis(1));
            peak = peak.max(store.len());
        }
        // Each call frees what expired before its own record is added, so the store never holds
        // more than the last second's keys.
        assert_eq!(peak, LIVE, "held {peak} records for {LIVE} live ones");
        // Only expired records went: the keys of the last second (less the one whose retention ends
        // right now) still replay, and the key before them runs again.
        let now_expiring = KEYS - LIVE as u64;
        for i in now_expiring + 1..KEYS {
            assert!(
                matches!(
                    store.start(&key(i), None, LONG).await.unwrap(),
                    Start::Completed(_)
                ),
                "key {i} is still retained"
            );
        }
        assert!(matches!(
            store.start(&key(now_expiring), None, LONG).await.unwrap(),
            Start::Started(_)
        ));
    }
}
