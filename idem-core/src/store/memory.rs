//! [`MemoryStore`]: records in a hash map, for tests and single-process services.

use std::collections::hash_map::Entry as Slot;
use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::key::{Fingerprint, Key, KeyMap, Token};
use crate::record::{
    Claim, ClaimOutcome, ClaimRequest, Completion, OnLapse, Record, RecordState, StoredResult,
    UncertainOperation,
};
use crate::step::{
    failed_step, Abandoned, AbandonedQuery, StepLog, StepRecord, StepState, StepWrite, INPUT_STEP,
};
use crate::store::{check_duration, check_fingerprint, Immediate, Store, LAPSED_CLAIMS_KEPT};

/// A record as the store keeps it: 96 bytes a slot with its key, where the public
/// [`Record`]'s layout took 144. Every byte of a slot is paid for in each hash map's memory and
/// in the pages a growing map touches: with the bigger layout, a quarter of the time of a million
/// new keys went to faulting in fresh pages.
struct Entry {
    /// The token of the claim that wrote the record, kept after completion so that completing
    /// the same claim again is recognised.
    token: Token,
    /// The lease's end while the claim runs; the result's retention's end once completed.
    expires_at: SystemTime,
    /// How long a completed record's key is kept after its retention, as a tombstone, in whole
    /// seconds (its completion's `key_retention`, rounded up): in the slot's padding.
    kept_secs: u32,
    /// The stored response of a completed record, if it has one.
    response: Option<Box<[u8]>>,
    /// Boxed: most records of the engine carry none, and inline it would take 33 bytes of every
    /// slot.
    fingerprint: Option<Box<Fingerprint>>,
    phase: Phase,
}

/// Whether a record's claim runs (and what it becomes on lapse) or its work completed (and
/// how).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running { uncertain: bool },
    Completed { is_error: bool },
}

impl Entry {
    /// When the record's tombstone ends: its retention's end plus `kept_secs`.
    fn key_until(&self) -> SystemTime {
        self.expires_at + Duration::from_secs(u64::from(self.kept_secs))
    }

    /// When the store next acts on the record by itself, if ever: for a running claim,
    /// `lapsed_kept` ([`LAPSED_CLAIMS_KEPT`]) after its lease's end (so that a holder whose lease
    /// ran out, with nobody having claimed the key since, can still complete it), and never
    /// for an uncertain one; for a completed record, its retention's end when its response is
    /// then dropped for a tombstone, else its tombstone's end, when it is freed.
    fn due_at(&self, lapsed_kept: Duration) -> Option<SystemTime> {
        match self.phase {
            Phase::Running { uncertain: true } => None,
            Phase::Running { uncertain: false } => Some(self.expires_at + lapsed_kept),
            Phase::Completed { .. } if self.kept_secs > 0 && self.response.is_some() => {
                Some(self.expires_at)
            }
            Phase::Completed { .. } => Some(self.key_until()),
        }
    }

    /// Whether the record still holds its key at `now`: a running claim while its lease runs
    /// (an uncertain one always), a completed one until its tombstone ends.
    fn holds_key(&self, now: SystemTime) -> bool {
        match self.phase {
            Phase::Running { uncertain } => uncertain || self.expires_at > now,
            Phase::Completed { .. } => self.key_until() > now,
        }
    }

    fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Running { .. })
    }

    /// Whether this is an uncertain claim whose lease ended by `now`.
    fn is_uncertain(&self, now: SystemTime) -> bool {
        self.phase == (Phase::Running { uncertain: true }) && self.expires_at <= now
    }

    fn fingerprint(&self) -> Option<&Fingerprint> {
        self.fingerprint.as_deref()
    }

    /// The record's state at `now` as [`Store`] callers see it (a completed record's response
    /// copied).
    fn state(&self, now: SystemTime) -> RecordState {
        match self.phase {
            Phase::Running { .. } if self.is_uncertain(now) => RecordState::Uncertain {
                token: self.token,
                since: self.expires_at,
            },
            Phase::Running { .. } => RecordState::InProgress {
                token: self.token,
                lease_until: self.expires_at,
            },
            Phase::Completed { .. } if self.expires_at <= now => RecordState::Expired {
                since: self.expires_at,
            },
            Phase::Completed { is_error } => RecordState::Completed(StoredResult {
                response: self.response.as_deref().map(<[u8]>::to_vec),
                is_error,
                expires_at: self.expires_at,
                not_retained: None,
            }),
        }
    }
}

/// How many due index entries each mutating call takes after its own work (freeing their
/// records, or dropping them as stale). A new key costs two mutating calls (start, complete) and
/// adds at most two entries, so the store takes up to 16 entries per record it creates: expiry
/// outpaces creation, and a backlog left by a burst drains as traffic goes on.
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
    let (low, high) = key.words();
    let folded = (low ^ high)
        .to_le_bytes()
        .iter()
        .fold(0u8, |acc, b| acc ^ b);
    usize::from(folded) % SHARDS
}

/// How many distinct durations (leases, retentions) get a queue of their own in the expiry
/// index; entries of any further duration go to a sorted set. A service uses a few.
const QUEUES: usize = 8;

/// Where the store finds records whose lease or retention has ended, earliest first.
///
/// Every expiry is `now + d`, with `d` the lease or retention of the call that set it and `now`
/// read under the store's lock, so the entries of one duration arrive in expiry order: a queue
/// per duration stays sorted by appending, O(1) and no allocation per entry, where a sorted set
/// of every entry cost O(log n), a node allocation and two thirds of a claim's time.
///
/// Entries are never looked up: when a record changes (completed, renewed, aborted, evicted,
/// taken over) the entry of its old expiry is taken back if it is still the newest of its queue
/// (nothing of its duration came after it: a claim completed before the next claim, as on one
/// task); otherwise it stays, and is dropped as stale when it reaches the front, because its
/// record is gone or now expires at another time. So the index holds at most one entry per record
/// plus one per change made within the longest lease or retention in use.
/// If the wall clock steps back, a queue's later entries may be due before its front; they are
/// then freed when the front is, at most one step late (reads still judge each record by its own
/// expiry, so a late free never makes a record count as live).
#[derive(Default)]
struct ExpiryIndex {
    queues: Vec<(Duration, VecDeque<(SystemTime, Key)>)>,
    /// Entries of durations beyond the first [`QUEUES`], sorted.
    others: BTreeSet<(SystemTime, Key)>,
}

impl ExpiryIndex {
    fn push(&mut self, duration: Duration, at: SystemTime, key: Key) {
        if let Some((_, queue)) = self.queues.iter_mut().find(|(d, _)| *d == duration) {
            queue.push_back((at, key));
        } else if self.queues.len() < QUEUES {
            self.queues.push((duration, VecDeque::from([(at, key)])));
        } else if let Some(slot) = self.queues.iter_mut().find(|(_, q)| q.is_empty()) {
            // A queue `retract` emptied: its slot goes to this duration.
            slot.0 = duration;
            slot.1.push_back((at, key));
        } else {
            self.others.insert((at, key));
        }
    }

    /// Takes back the entry `(at, key)` if it is the newest of its queue: the entry a change to
    /// `key`'s record is about to make stale, when no entry of the same duration came after it (a
    /// claim completed before the next claim, as on one task). Then the change leaves no stale
    /// entry behind, and a new key costs one entry instead of two. O(1) for each queue in use; a
    /// stale entry it does not find is dropped when due, as before.
    fn retract(&mut self, at: SystemTime, key: &Key) {
        let newest = |(_, queue): &(Duration, VecDeque<(SystemTime, Key)>)| {
            queue.back().is_some_and(|(t, k)| *t == at && k == key)
        };
        if let Some((_, queue)) = self.queues.iter_mut().find(|q| newest(q)) {
            // An emptied queue keeps its slot and its memory: on one task the next claim pushes
            // to it again, and freeing it would cost an allocation a key. `push` hands its slot
            // to another duration when all are taken.
            queue.pop_back();
        }
    }

    /// Takes the earliest entry due at `now`, if any.
    fn pop_due(&mut self, now: SystemTime) -> Option<(SystemTime, Key)> {
        // The queue holding it, or `None` for the sorted set, and when it is due.
        let mut earliest: Option<(Option<usize>, SystemTime)> = None;
        for (i, (_, queue)) in self.queues.iter().enumerate() {
            if let Some(&(at, _)) = queue.front()
                && at <= now
                && earliest.is_none_or(|(_, e)| at < e)
            {
                earliest = Some((Some(i), at));
            }
        }
        if let Some(&(at, _)) = self.others.first()
            && at <= now
            && earliest.is_none_or(|(_, e)| at < e)
        {
            earliest = Some((None, at));
        }
        let Some(from) = earliest?.0 else {
            return self.others.pop_first();
        };
        let queue = &mut self.queues[from].1;
        let entry = queue.pop_front();
        if queue.is_empty() {
            // Frees its slot for another duration, and its memory.
            self.queues.swap_remove(from);
        } else if queue.capacity() > MIN_CAPACITY && queue.len() < queue.capacity() / 4 {
            queue.shrink_to(queue.len() * 2);
        }
        entry
    }

    #[cfg(test)]
    fn entries(&self) -> impl Iterator<Item = &(SystemTime, Key)> {
        self.queues
            .iter()
            .flat_map(|(_, q)| q.iter())
            .chain(self.others.iter())
    }
}

/// The steps of one operation (docs/steps.md), kept apart from its record so that a release
/// keeps them.
struct StepsEntry {
    /// How many claims have begun this operation's steps.
    attempt: u32,
    /// The token of the claim counted last.
    token: Token,
    /// The steps' retention ends here (moved on by every step write and begin).
    expires_at: SystemTime,
    /// By position.
    steps: Vec<StepRecord>,
}

/// The records and their expiry index, always changed together under the store's one lock.
struct Records {
    shards: Vec<KeyMap<Entry>>,
    /// The steps of operations that ran any, by operation key: few next to the records, so
    /// they are swept by `prune_expired` and judged by their expiry when read.
    steps: KeyMap<StepsEntry>,
    len: usize,
    /// An entry at every record's expiry (and stale ones): expired records are found at the
    /// front without looking at any live one.
    by_expiry: ExpiryIndex,
    /// How long a claim whose lease ended is kept for its holder: [`LAPSED_CLAIMS_KEPT`] (zero
    /// in the index's own unit tests, which free claims at their lease's end).
    lapsed_kept: Duration,
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
            steps: KeyMap::default(),
            len: 0,
            by_expiry: ExpiryIndex::default(),
            lapsed_kept: LAPSED_CLAIMS_KEPT,
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

    /// Claims `key` at `now` for `lease` unless a live record holds it, with one hash lookup:
    /// `Err(existing)` is that record; an expired one is replaced.
    fn claim(
        &mut self,
        key: Key,
        now: SystemTime,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
        uncertain: bool,
    ) -> Result<Token, &Entry> {
        let lease_until = now + lease;
        let token = Token::random();
        let entry = Entry {
            token,
            expires_at: lease_until,
            kept_secs: 0,
            response: None,
            fingerprint: fingerprint.map(Box::new),
            phase: Phase::Running { uncertain },
        };
        match self.shards[shard_of(&key)].entry(key) {
            Slot::Occupied(slot) if slot.get().holds_key(now) => return Err(slot.into_mut()),
            // An expired record is replaced; its old index entry is now stale.
            Slot::Occupied(mut slot) => {
                slot.insert(entry);
            }
            Slot::Vacant(slot) => {
                slot.insert(entry);
                self.len += 1;
            }
        }
        if !uncertain {
            self.by_expiry.push(
                lease + self.lapsed_kept,
                lease_until + self.lapsed_kept,
                key,
            );
        }
        Ok(token)
    }

    fn remove(&mut self, key: &Key) -> Option<Entry> {
        let shard = shard_of(key);
        // Its index entry becomes stale.
        let entry = self.shards[shard].remove(key)?;
        if let Some(due) = entry.due_at(self.lapsed_kept) {
            self.by_expiry.retract(due, key);
        }
        self.len -= 1;
        // Aborts and evictions empty the map too, not only expiry.
        self.shrink(shard);
        Some(entry)
    }

    /// Applies `f` to the entry still carrying `claim`'s token, or fails with `LeaseLost`; with
    /// `in_progress`, a completed entry counts as lost too. When `f` moves when the store next
    /// acts on the record ([`Entry::due_at`]), the index follows.
    fn update_owned(
        &mut self,
        claim: &Claim,
        in_progress: bool,
        now: SystemTime,
        f: impl FnOnce(&mut Entry),
    ) -> Result<(), Error> {
        let key = claim.key();
        let entry = match self.shards[shard_of(key)].get_mut(key) {
            Some(e) if e.token == claim.token() && (!in_progress || e.is_running()) => e,
            _ => return Err(Error::LeaseLost),
        };
        let before = entry.due_at(self.lapsed_kept);
        f(entry);
        let after = entry.due_at(self.lapsed_kept);
        if after != before {
            if let Some(before) = before {
                self.by_expiry.retract(before, key);
            }
            if let Some(after) = after {
                // Every due time is now plus the duration its call set (a lease and the
                // lapsed claims' keeping, a retention, a tombstone): its queue.
                let duration = after.duration_since(now).unwrap_or_default();
                self.by_expiry.push(duration, after, *key);
            }
        }
        Ok(())
    }

    /// Fails with `LeaseLost` unless `claim` holds a running record: the fence of every step
    /// write.
    fn check_running(&self, claim: &Claim) -> Result<(), Error> {
        match self.get(claim.key()) {
            Some(e) if e.token == claim.token() && e.is_running() => Ok(()),
            _ => Err(Error::LeaseLost),
        }
    }

    /// The live steps of `claim`'s operation, counting `claim` as an attempt if it is new to
    /// them, kept until `until`.
    fn steps_of(&mut self, claim: &Claim, now: SystemTime, until: SystemTime) -> &mut StepsEntry {
        let entry = self
            .steps
            .entry(*claim.key())
            .or_insert_with(|| StepsEntry {
                attempt: 0,
                token: claim.token(),
                expires_at: until,
                steps: Vec::new(),
            });
        if entry.expires_at <= now {
            // Ended steps read as absent, as an ended record does.
            entry.attempt = 0;
            entry.steps.clear();
        }
        if entry.attempt == 0 || entry.token != claim.token() {
            entry.attempt += 1;
            entry.token = claim.token();
        }
        entry.expires_at = until;
        entry
    }

    /// Deletes up to `limit` step logs whose retention has ended; returns how many.
    fn expire_steps(&mut self, now: SystemTime, limit: usize) -> usize {
        let ended: Vec<Key> = self
            .steps
            .iter()
            .filter(|(_, s)| s.expires_at <= now)
            .map(|(k, _)| *k)
            .take(limit)
            .collect();
        for key in &ended {
            self.steps.remove(key);
        }
        ended.len()
    }

    /// Takes index entries due at `now`, earliest first, freeing the records they point at,
    /// until `limit` records are freed or, with `look_at`, that many entries were taken. Returns
    /// how many records it freed. A stale entry (its record gone or expiring at another time)
    /// is dropped; a live record is never looked at, whatever their number.
    fn expire(&mut self, now: SystemTime, limit: usize, look_at: Option<usize>) -> usize {
        let mut freed = 0;
        let mut taken = 0;
        while freed < limit && look_at.is_none_or(|most| taken < most) {
            #[cfg(test)]
            {
                self.examined += 1;
            }
            let Some((at, key)) = self.by_expiry.pop_due(now) else {
                break;
            };
            taken += 1;
            let shard = shard_of(&key);
            if let Slot::Occupied(mut slot) = self.shards[shard].entry(key) {
                if slot.get().due_at(self.lapsed_kept) != Some(at) {
                    continue;
                }
                let entry = slot.get_mut();
                if entry.kept_secs > 0 && entry.response.is_some() && !entry.is_running() {
                    // Its retention ended: the response goes, the key stays as a tombstone
                    // until its own end.
                    entry.response = None;
                    let kept = Duration::from_secs(u64::from(entry.kept_secs));
                    let until = entry.key_until();
                    self.by_expiry.push(kept, until, key);
                } else {
                    slot.remove();
                    self.len -= 1;
                    self.shrink(shard);
                }
                freed += 1;
            }
        }
        freed
    }

    /// Gives memory back after a burst: when under a quarter of a shard's capacity is used, the
    /// shard is rehashed into twice its length. That rehash is paid by one call, but only after
    /// the shard lost three quarters of its capacity, so it costs O(1) per record freed. The
    /// index shrinks its own queues as they empty.
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
///   records by expiry sits next to them: a queue per lease or retention duration in use (up to
///   8, then a sorted set), appended to by every `start`, `complete` and `renew` that sets an
///   expiry. An entry whose record has since changed is dropped when it comes due, or at once
///   if it is still the newest of its queue.
/// - After its own work, each mutating call takes up to 8 due entries from the index, freeing
///   the records they point at, earliest first. A new key is two such calls and adds at most
///   two entries, so expiry keeps pace with any rate of new keys, and a burst's backlog drains as
///   traffic goes on. `get` frees nothing.
/// - When under a quarter of a map's capacity is in use (and it has more than 128 slots), the
///   map shrinks to twice its length, so the memory of a burst is returned.
/// - A completed record is freed when its retention ends; a claim whose lease ended is kept for
///   [`LAPSED_CLAIMS_KEPT`] more, so that its holder can still complete it while nobody takes
///   the key over (the next `start` takes it over at once).
///
/// Cost per mutating call: one hash lookup and, when it sets an expiry, one append to a queue
/// (no allocation, O(1)); then up to 8 entries taken from the index, O(1) each. No call looks
/// at a live record other than the earliest one. The index holds one entry per record plus one
/// per change made within the longest lease or retention (48 bytes each). A map grows or shrinks
/// by rehashing its entries in the call that triggers it; with 64 maps that is about `n / 64`
/// entries, at most once per doubling or halving of that map.
/// [`prune_expired(limit)`](Store::prune_expired) frees up to `limit` records from the front of
/// the index, and is only needed to drain at once (say, after a burst with no traffic after it).
///
/// Memory: a record takes a 96-byte slot (its key and entry) in a map kept between a quarter
/// and seven eighths full, its stored response on the heap (and its fingerprint, if it has one),
/// and a 48-byte index entry at its expiry (two while a stale one waits to come due). A million
/// records with 22-byte responses, each claimed and completed in turn, took about 280 bytes
/// each: 200 in the maps (half full at that count), 50 in the index, 32 for the response.
///
/// Speed: the full path of a new key (claim, then complete) costs about 1 µs at a million
/// records, most of it the memory those records take; see `docs/performance.md`. Nothing in
/// this store waits, and it says so through [`Store::immediate`]: the engine calls its claims and
/// completions directly instead of through the [`Store`] trait's boxed futures, however it was
/// given (by value, in an `Arc`, or as `Arc<dyn Store>`): a new key through the engine allocates
/// its encoded result and this store's copy of it, nothing else.
///
/// As with a pruner, a claim whose lease has ended may find its record freed by another call,
/// and its `complete` is then [`Error::LeaseLost`]; the engine renews leases while work runs, so
/// this happens only to a claim that stopped renewing.
///
/// ```
/// use std::time::Duration;
/// use idem::{Completion, Key, ManualClock, MemoryStore, ClaimOutcome, ClaimRequest, Store};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// let clock = ManualClock::new();
/// let store = MemoryStore::with_clock(clock.clone());
/// let lease = Duration::from_secs(30);
/// let old = Key::derive("deposit", "alice", "req-1")?;
/// let ClaimOutcome::Claimed(claim) = store.claim(ClaimRequest::new(&old, lease)).await? else { unreachable!() };
/// let retention = Duration::from_secs(60);
/// store.complete(&claim, Completion { response: None, is_error: false, retention, key_retention: Duration::ZERO }).await?;
///
/// // Its retention ends; the next call frees it, with no prune.
/// clock.advance(Duration::from_secs(61));
/// let new = Key::derive("deposit", "alice", "req-2")?;
/// store.claim(ClaimRequest::new(&new, lease)).await?;
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
    /// let store = idem::MemoryStore::new();
    /// assert_eq!(store.len(), 0);
    /// ```
    pub fn new() -> MemoryStore {
        MemoryStore::with_clock(SystemClock)
    }

    /// An empty store reading time from `clock`.
    ///
    /// ```
    /// use idem::{ManualClock, MemoryStore};
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
    /// let store = idem::MemoryStore::new();
    /// assert_eq!(store.len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is held.
    ///
    /// ```
    /// assert!(idem::MemoryStore::new().is_empty());
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
        records.expire(now, SWEEP, Some(SWEEP));
        out
    }
}

/// Nothing in this store waits: the engine calls its claims and completions directly.
impl Immediate for MemoryStore {
    fn claim_now(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        request.check()?;
        let (key, fingerprint, lease) = (request.key, request.fingerprint, request.lease);
        let uncertain = request.on_lapse == OnLapse::Uncertain;
        self.mutate(|records, now| {
            match records.claim(*key, now, lease, fingerprint.copied(), uncertain) {
                Ok(token) => Ok(ClaimOutcome::Claimed(Claim::new(*key, token))),
                Err(e) => {
                    check_fingerprint(e.fingerprint(), fingerprint)?;
                    Ok(match e.state(now) {
                        RecordState::InProgress { lease_until, .. } => ClaimOutcome::Locked {
                            retry_after: remaining(lease_until, now),
                        },
                        RecordState::Completed(c) => ClaimOutcome::Completed(c),
                        RecordState::Uncertain { since, .. } => ClaimOutcome::Uncertain { since },
                        RecordState::Expired { since } => ClaimOutcome::Expired { since },
                    })
                }
            }
        })
    }

    fn complete_now(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error> {
        completion.check()?;
        let retention = completion.retention;
        let kept_secs = whole_secs(completion.key_retention);
        self.mutate(|records, now| {
            records.update_owned(claim, false, now, |e| {
                // Completing the same claim again succeeds and keeps the first result.
                if e.is_running() {
                    e.phase = Phase::Completed {
                        is_error: completion.is_error,
                    };
                    e.response = completion.response.map(Box::from);
                    e.expires_at = now + retention;
                    e.kept_secs = kept_secs;
                }
            })
        })
    }
}

fn remaining(until: SystemTime, now: SystemTime) -> Duration {
    until.duration_since(now).unwrap_or(Duration::ZERO)
}

/// `d` in whole seconds, rounded up (a tombstone's length as the stores keep it), at most
/// `u32::MAX` (136 years; a completion checks it under ten).
fn whole_secs(d: Duration) -> u32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    u32::try_from(secs).unwrap_or(u32::MAX)
}

#[async_trait]
impl Store for MemoryStore {
    fn immediate(&self) -> Option<&dyn Immediate> {
        Some(self)
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        Immediate::claim_now(self, request)
    }

    async fn complete(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error> {
        Immediate::complete_now(self, claim, completion)
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        self.mutate(|records, now| {
            records.update_owned(claim, true, now, |_| ())?;
            records.remove(claim.key());
            Ok(())
        })
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        check_duration("lease", lease)?;
        self.mutate(|records, now| {
            records.update_owned(claim, true, now, |e| {
                // `update_owned` only calls this on a running claim.
                e.expires_at = now + lease;
            })
        })
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let now = self.clock.now();
        Ok(self
            .lock()
            .get(key)
            .filter(|e| e.holds_key(now))
            .map(|e| Record::new(*key, e.fingerprint().copied(), e.state(now))))
    }

    async fn evict(&self, key: &Key) -> Result<bool, Error> {
        Ok(self.mutate(|records, _| {
            records.steps.remove(key);
            records.remove(key).is_some()
        }))
    }

    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        let now = self.clock.now();
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        // Stale index entries do not count against `limit`, so a batch that comes back short
        // means nothing expired is left. Each stale entry is taken once, so they add O(1) per
        // call that made one.
        let mut records = self.lock();
        let freed = records.expire(now, limit, None);
        // Ended step logs fill what is left of the batch, so a short batch still means drained.
        let steps = records.expire_steps(now, limit - freed);
        Ok((freed + steps) as u64)
    }

    async fn begin_steps(&self, claim: &Claim, retention: Duration) -> Result<StepLog, Error> {
        check_duration("retention", retention)?;
        self.mutate(|records, now| {
            records.check_running(claim)?;
            let entry = records.steps_of(claim, now, now + retention);
            Ok(StepLog {
                attempt: entry.attempt,
                steps: entry.steps.clone(),
            })
        })
    }

    async fn find_abandoned(&self, query: AbandonedQuery<'_>) -> Result<Vec<Abandoned>, Error> {
        let now = self.clock.now();
        let AbandonedQuery { after, limit } = query;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let records = self.lock();
        let mut found: Vec<(Key, &[u8])> = records
            .steps
            .iter()
            .filter(|(key, steps)| {
                let failed = failed_step(steps.attempt);
                steps.expires_at > now
                    && after.is_none_or(|after| key.as_bytes() > after.as_bytes())
                    // No claim holds it and it has not completed: its record is gone (freed
                    // after its lease, or released) or running past its lease.
                    && records.get(key).is_none_or(|e| {
                        e.phase == (Phase::Running { uncertain: false }) && e.expires_at <= now
                    })
                    && !steps.steps.iter().any(|s| s.name == failed)
            })
            .filter_map(|(key, steps)| {
                steps.steps.iter().find_map(|s| match &s.state {
                    StepState::Finished(input) if s.name == INPUT_STEP => {
                        Some((*key, input.as_slice()))
                    }
                    _ => None,
                })
            })
            .collect();
        found.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        found
            .into_iter()
            .take(limit)
            .map(|(key, input)| Abandoned::decode(key, input))
            .collect()
    }

    async fn take_uncertain(
        &self,
        key: &Key,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, Error> {
        check_duration("lease", lease)?;
        self.mutate(|records, now| {
            match records.shards[shard_of(key)].get_mut(key) {
                Some(e) if e.token == token && e.is_uncertain(now) => {
                    // Uncertain claims have no index entry, and this one stays uncertain.
                    e.token = Token::random();
                    e.expires_at = now + lease;
                    Ok(Claim::new(*key, e.token))
                }
                _ => Err(Error::NotUncertain { operation: *key }),
            }
        })
    }

    async fn find_uncertain(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<UncertainOperation>, Error> {
        let now = self.clock.now();
        let AbandonedQuery { after, limit } = query;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let records = self.lock();
        let mut found: Vec<UncertainOperation> = records
            .shards
            .iter()
            .flatten()
            .filter(|(key, e)| {
                e.is_uncertain(now) && after.is_none_or(|after| key.as_bytes() > after.as_bytes())
            })
            .map(|(key, e)| UncertainOperation {
                key: *key,
                token: e.token,
                since: e.expires_at,
            })
            .collect();
        found.sort_unstable_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
        found.truncate(limit);
        Ok(found)
    }

    async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
        step.check()?;
        self.mutate(|records, now| {
            records.check_running(claim)?;
            if let Some(on_lapse) = step.on_lapse {
                records.update_owned(claim, true, now, |e| {
                    e.phase = Phase::Running {
                        uncertain: on_lapse == OnLapse::Uncertain,
                    };
                })?;
            }
            let entry = records.steps_of(claim, now, now + step.retention);
            let state = match step.result {
                Some(result) => StepState::Finished(result.to_vec()),
                None => StepState::Begun,
            };
            match entry.steps.iter_mut().find(|s| s.name == step.name) {
                // The first result stands.
                Some(stored) if matches!(stored.state, StepState::Finished(_)) => {}
                Some(stored) => {
                    stored.position = step.position;
                    stored.state = state;
                }
                None => {
                    entry.steps.push(StepRecord {
                        name: step.name.to_owned(),
                        position: step.position,
                        state,
                    });
                    entry.steps.sort_by_key(|s| s.position);
                }
            }
            Ok(())
        })
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

    fn done(retention: Duration) -> Completion<'static> {
        Completion {
            response: Some(b"r"),
            is_error: false,
            retention,
            key_retention: Duration::ZERO,
        }
    }

    async fn claim(store: &MemoryStore, key: &Key, lease: Duration) -> Claim {
        match store.claim(ClaimRequest::new(key, lease)).await.unwrap() {
            ClaimOutcome::Claimed(c) => c,
            other => panic!("expected Claimed, got {other:?}"),
        }
    }

    impl Records {
        fn capacity(&self) -> usize {
            self.shards.iter().map(KeyMap::capacity).sum()
        }
    }

    #[test]
    fn a_slot_is_96_bytes() {
        // What `Entry`'s doc promises; the public `Record`'s layout took 144.
        assert_eq!(std::mem::size_of::<(Key, Entry)>(), 96);
    }

    /// The index holds an entry at every record's freeing time, and `len` counts the records.
    fn assert_in_step(store: &MemoryStore) {
        let records = store.lock();
        let index: std::collections::HashSet<_> = records.by_expiry.entries().copied().collect();
        let mut held = 0;
        for (shard, map) in records.shards.iter().enumerate() {
            for (k, e) in map {
                assert_eq!(shard_of(k), shard);
                // An uncertain claim is never due: it has no entry.
                if let Some(due) = e.due_at(records.lapsed_kept) {
                    assert!(index.contains(&(due, *k)));
                }
                held += 1;
            }
        }
        assert_eq!(held, records.len);
    }

    /// A store on `clock` that frees a lapsed claim at its lease's end, as it did before
    /// [`LAPSED_CLAIMS_KEPT`]: the index's own tests check its order, its stale entries and its
    /// bounded work, which do not depend on when a claim is due.
    fn indexed(clock: &ManualClock) -> MemoryStore {
        let store = MemoryStore::with_clock(clock.clone());
        store.lock().lapsed_kept = Duration::ZERO;
        store
    }

    /// A running claim whose lease ended is kept for [`LAPSED_CLAIMS_KEPT`], neither swept by
    /// the calls that follow nor pruned, and its holder completes it; past that window it is
    /// freed.
    #[tokio::test]
    async fn a_lapsed_claim_is_kept_for_its_holder_then_freed() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let late = claim(&store, &key(1), Duration::from_secs(1)).await;
        let gone = claim(&store, &key(2), Duration::from_secs(1)).await;
        clock.advance(Duration::from_secs(3600));
        // Calls of other keys sweep what is due; a prune frees what is due.
        for i in 10..40 {
            claim(&store, &key(i), LONG).await;
        }
        assert_eq!(store.prune_expired(100).await.unwrap(), 0);
        store.complete(&late, done(LONG)).await.unwrap();
        assert!(matches!(
            store.claim(ClaimRequest::new(&key(1), LONG)).await.unwrap(),
            ClaimOutcome::Completed(_)
        ));
        clock.advance(LAPSED_CLAIMS_KEPT);
        assert!(store.prune_expired(100).await.unwrap() >= 1);
        assert!(matches!(
            store.complete(&gone, done(LONG)).await,
            Err(Error::LeaseLost)
        ));
        assert_in_step(&store);
    }

    fn index_len(store: &MemoryStore) -> usize {
        store.lock().by_expiry.entries().count()
    }

    #[tokio::test]
    async fn index_follows_every_call() {
        let clock = ManualClock::new();
        let store = indexed(&clock);
        let renewed = claim(&store, &key(1), Duration::from_secs(1)).await;
        store.renew(&renewed, LONG).await.unwrap();
        let completed = claim(&store, &key(2), LONG).await;
        store.complete(&completed, done(LONG)).await.unwrap();
        // A repeated completion keeps the first retention, so the index does not move either.
        store
            .complete(&completed, done(Duration::from_secs(1)))
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
        // Once every lease and retention has ended, the records and every stale entry left by
        // the changes above (renewal, completion, abort, eviction, takeover) are gone.
        clock.advance(LONG);
        assert_eq!(store.prune_expired(100).await.unwrap(), 1);
        assert_eq!(store.len(), 0);
        assert_eq!(index_len(&store), 0);
    }

    /// A change made before any other entry of its duration came takes its stale entry back:
    /// claims completed one after another leave one entry each, and an abort or an eviction
    /// right after its claim leaves none.
    #[tokio::test]
    async fn a_change_with_nothing_after_it_leaves_no_stale_entry() {
        let clock = ManualClock::new();
        let store = indexed(&clock);
        for i in 0..100 {
            let c = claim(&store, &key(i), LONG).await;
            store.complete(&c, done(RETENTION)).await.unwrap();
        }
        assert_eq!(index_len(&store), 100);
        let renewed = claim(&store, &key(100), LONG).await;
        clock.advance(Duration::from_millis(1));
        store.renew(&renewed, LONG).await.unwrap();
        assert_eq!(index_len(&store), 101);
        let aborted = claim(&store, &key(101), LONG).await;
        store.abort(&aborted).await.unwrap();
        claim(&store, &key(102), LONG).await;
        assert!(store.evict(&key(102)).await.unwrap());
        assert_eq!(index_len(&store), 101);
        assert_in_step(&store);
        // Interleaved, the first claim's entry is not the newest when it completes: it stays,
        // stale, and goes when due.
        let (first, second) = (
            claim(&store, &key(103), LONG).await,
            claim(&store, &key(104), LONG).await,
        );
        store.complete(&first, done(RETENTION)).await.unwrap();
        store.complete(&second, done(RETENTION)).await.unwrap();
        assert_eq!(index_len(&store), 101 + 3);
        assert_in_step(&store);
        clock.advance(LONG * 2);
        assert_eq!(store.prune_expired(1000).await.unwrap(), 103);
        assert_eq!((store.len(), index_len(&store)), (0, 0));
    }

    /// Stale entries are dropped as they come due, never counted as freed records, and never
    /// make a batch come back short while expired records remain.
    #[tokio::test]
    async fn stale_entries_neither_count_nor_cut_a_batch_short() {
        let clock = ManualClock::new();
        let store = indexed(&clock);
        // 300 records claimed, then completed with a 1 s retention: 299 lease entries (stale
        // once completed, due at 0.5 s; only the newest is taken back) and 300 retention entries.
        let mut claims = Vec::new();
        for i in 0..300 {
            claims.push(claim(&store, &key(i), Duration::from_millis(500)).await);
        }
        for c in &claims {
            store.complete(c, done(RETENTION)).await.unwrap();
        }
        assert_eq!(index_len(&store), 599);
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.prune_expired(100).await.unwrap(), 100);
        assert_eq!(store.prune_expired(100).await.unwrap(), 100);
        assert_eq!(store.prune_expired(100).await.unwrap(), 100);
        assert_eq!(store.prune_expired(100).await.unwrap(), 0);
        assert_eq!((store.len(), index_len(&store)), (0, 0));
    }

    /// A queue emptied by a take-back keeps its slot (the next claim of that duration reuses
    /// it), and hands the slot to a new duration when all are taken; expiry order holds across
    /// the handed-over slot and the sorted set.
    #[tokio::test]
    async fn an_emptied_queue_keeps_its_slot_until_another_duration_needs_it() {
        let clock = ManualClock::new();
        let store = indexed(&clock);
        // One record for each of QUEUES leases (2 s, 4 s, …); the 2 s claim then completes with
        // a 1 h retention, which takes its lease entry back and empties the 2 s queue.
        let mut first = None;
        for i in 1..=QUEUES as u64 {
            let c = claim(&store, &key(i), Duration::from_secs(2 * i)).await;
            first.get_or_insert(c);
        }
        let first = first.unwrap();
        store.complete(&first, done(LONG)).await.unwrap();
        {
            let records = store.lock();
            let index = &records.by_expiry;
            // The retention took the slot emptied by the take-back (all were taken).
            assert_eq!(index.queues.len(), QUEUES);
            assert!(index.queues.iter().any(|(d, q)| *d == LONG && q.len() == 1));
            assert!(index
                .queues
                .iter()
                .all(|(d, _)| *d != Duration::from_secs(2)));
            assert!(index.others.is_empty());
        }
        // A new lease of 3 s finds no free slot: the sorted set.
        claim(&store, &key(100), Duration::from_secs(3)).await;
        assert_eq!(store.lock().by_expiry.others.len(), 1);
        assert_in_step(&store);
        // Freed in expiry order: 3 s (set), 4 s, 6 s, … (queues); the completed one lasts.
        clock.advance(Duration::from_secs(3));
        assert_eq!(store.prune_expired(100).await.unwrap(), 1);
        assert!(store.get(&key(100)).await.unwrap().is_none());
        for i in 2..=QUEUES as u64 {
            clock.advance(Duration::from_secs(2) - Duration::from_secs(u64::from(i == 2)));
            assert_eq!(
                store.prune_expired(100).await.unwrap(),
                1,
                "lease {} s",
                2 * i
            );
            assert!(store.get(&key(i)).await.unwrap().is_none());
        }
        assert!(store.get(&key(1)).await.unwrap().is_some());
        assert_eq!((store.len(), index_len(&store)), (1, 1));
    }

    /// Durations beyond the first few share a sorted set, and records of every duration are
    /// freed in expiry order across queues and set.
    #[tokio::test]
    async fn many_durations_expire_in_order() {
        let clock = ManualClock::new();
        let store = indexed(&clock);
        // 40 distinct leases, longest first: 1 s ..= 40 s, given in reverse.
        for i in (1..=40u64).rev() {
            claim(&store, &key(i), Duration::from_secs(i)).await;
        }
        assert_eq!(store.lock().by_expiry.queues.len(), QUEUES);
        assert_eq!(store.lock().by_expiry.others.len(), 40 - QUEUES);
        for second in 1..=40u64 {
            clock.advance(Duration::from_secs(1));
            assert_eq!(store.prune_expired(100).await.unwrap(), 1, "at {second} s");
            assert!(store.get(&key(second)).await.unwrap().is_none());
            if second < 40 {
                assert!(
                    store.lock().shards[shard_of(&key(second + 1))].contains_key(&key(second + 1))
                );
            }
        }
        assert_eq!((store.len(), index_len(&store)), (0, 0));
    }

    /// Claims of keys `0..n`, with the lease `lease(i)`, put straight into the records (a million
    /// calls through the trait would only be slower); the count of examined index entries starts
    /// at zero.
    fn fill(store: &MemoryStore, n: u64, lease: impl Fn(u64) -> Duration) {
        let now = store.clock.now();
        let mut records = store.lock();
        for i in 0..n {
            assert!(records.claim(key(i), now, lease(i), None, false).is_ok());
        }
        records.examined = 0;
    }

    /// `prune_expired(100)` among a million live records removes exactly the 6 expired ones and
    /// looks at them and the first live one, nothing more: it cost 22 ms of lock time when it
    /// scanned the map.
    #[tokio::test]
    async fn prune_does_not_scan_live_records() {
        let clock = ManualClock::new();
        let store = indexed(&clock);
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
        let store = indexed(&clock);
        fill(&store, EXPIRED, |_| Duration::from_millis(10));
        clock.advance(Duration::from_millis(20));

        let fresh = key(EXPIRED);
        let c = claim(&store, &fresh, LONG).await;
        assert_eq!(store.lock().examined, SWEEP);
        assert_eq!(store.len(), (EXPIRED as usize) - SWEEP + 1);
        store.complete(&c, done(LONG)).await.unwrap();
        assert_eq!(store.lock().examined, 2 * SWEEP);
        // A replay frees its few as well, and reads the record in one lookup.
        assert!(matches!(
            store.claim(ClaimRequest::new(&fresh, LONG)).await.unwrap(),
            ClaimOutcome::Completed(_)
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
            store.complete(&c, done(RETENTION)).await.unwrap();
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
            store.complete(&c, done(LONG)).await.unwrap();
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
            store.complete(&c, done(RETENTION)).await.unwrap();
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
                    store.claim(ClaimRequest::new(&key(i), LONG)).await.unwrap(),
                    ClaimOutcome::Completed(_)
                ),
                "key {i} is still retained"
            );
        }
        assert!(matches!(
            store
                .claim(ClaimRequest::new(&key(now_expiring), LONG))
                .await
                .unwrap(),
            ClaimOutcome::Claimed(_)
        ));
    }
}
