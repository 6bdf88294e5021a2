//! [`MemoryStore`]: records in a hash map, for tests and single-process services.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::key::{Fingerprint, Key, Token};
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

/// Records in process memory behind a mutex. Every operation is one lock, no I/O.
///
/// Records live as long as the process; use SQLite or PostgreSQL when a restart must not forget
/// completed work. Time comes from an injectable [`Clock`] ([`SystemClock`] by default).
///
/// ```
/// use idem_core::{ManualClock, MemoryStore};
/// let clock = ManualClock::new();
/// let store = MemoryStore::with_clock(clock.clone());
/// # let _ = store;
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    records: Arc<Mutex<HashMap<Key, Entry>>>,
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
    pub fn with_clock(clock: impl Clock) -> MemoryStore {
        MemoryStore {
            records: Arc::default(),
            clock: Arc::new(clock),
        }
    }

    /// How many records are held, live or expired.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        // A panic while holding the lock cannot leave an entry half-written: every mutation is a
        // single insert or remove, so the map is consistent and poisoning can be ignored.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `f` to the entry still carrying `claim`'s token, or fails with `LeaseLost`. With
    /// `in_progress`, a completed entry counts as lost too.
    fn with_owned<R>(
        &self,
        claim: &Claim,
        in_progress: bool,
        f: impl FnOnce(&mut HashMap<Key, Entry>) -> R,
    ) -> Result<R, Error> {
        let mut records = self.lock();
        match records.get(claim.key()) {
            Some(e)
                if e.token == claim.token()
                    && (!in_progress || matches!(e.state, RecordState::InProgress { .. })) =>
            {
                Ok(f(&mut records))
            }
            _ => Err(Error::LeaseLost),
        }
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
        let now = self.clock.now();
        let mut records = self.lock();
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
    }

    async fn complete(
        &self,
        claim: &Claim,
        completion: Completion<'_>,
        retention: Duration,
    ) -> Result<(), Error> {
        check_duration("retention", retention)?;
        let expires_at = self.clock.now() + retention;
        // Completing the same claim again succeeds and keeps the first result.
        self.with_owned(claim, false, |records| {
            if let Some(
                e @ Entry {
                    state: RecordState::InProgress { .. },
                    ..
                },
            ) = records.get_mut(claim.key())
            {
                e.state = RecordState::Completed(Cached {
                    response: completion.response.map(<[u8]>::to_vec),
                    is_error: completion.is_error,
                    expires_at,
                });
            }
        })
    }

    async fn abort(&self, claim: &Claim) -> Result<(), Error> {
        self.with_owned(claim, true, |records| {
            records.remove(claim.key());
        })
    }

    async fn renew(&self, claim: &Claim, lease: Duration) -> Result<(), Error> {
        check_duration("lease", lease)?;
        let until = self.clock.now() + lease;
        self.with_owned(claim, true, |records| {
            if let Some(Entry {
                state: RecordState::InProgress { lease_until, .. },
                ..
            }) = records.get_mut(claim.key())
            {
                *lease_until = until;
            }
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
        Ok(self.lock().remove(key).is_some())
    }

    async fn prune_expired(&self, limit: u32) -> Result<u64, Error> {
        let now = self.clock.now();
        let mut records = self.lock();
        let expired: Vec<Key> = records
            .iter()
            .filter(|(_, e)| e.expires_at() <= now)
            .map(|(k, _)| *k)
            .take(limit as usize)
            .collect();
        for k in &expired {
            records.remove(k);
        }
        Ok(expired.len() as u64)
    }
}
