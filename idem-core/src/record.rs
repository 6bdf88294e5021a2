//! The record a store keeps per key, and the outcomes of the store's operations.

use std::time::{Duration, SystemTime};

use crate::envelope::{self, Kept};
use crate::error::Error;
use crate::key::{Fingerprint, Key, Token};
use crate::store::check_duration;

/// Proof that this caller owns a key until its lease ends: the key and the fencing token.
///
/// Returned by [`Store::claim`](crate::Store::claim) as [`ClaimOutcome::Claimed`]; `complete`, `abort`
/// and `renew` succeed only while the stored record still carries this token.
///
/// ```
/// use idem::{Claim, Key, Token};
/// let claim = Claim::new(Key::derive("s", "", "k")?, Token::random());
/// assert_eq!(claim.key(), &Key::derive("s", "", "k")?);
/// # Ok::<(), idem::KeyError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    key: Key,
    token: Token,
}

impl Claim {
    /// A claim on `key` fenced by `token` (stores build these; callers receive them).
    pub fn new(key: Key, token: Token) -> Claim {
        Claim { key, token }
    }

    /// The claimed key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The fencing token.
    pub fn token(&self) -> Token {
        self.token
    }
}

/// A completed record: the stored response, replayed to every later call with the same key.
///
/// ```
/// use idem::StoredResult;
/// let c = StoredResult {
///     response: Some(b"42".to_vec()),
///     is_error: false,
///     expires_at: std::time::SystemTime::now(),
///     not_retained: None,
/// };
/// assert_eq!(c.response.as_deref(), Some(&b"42"[..]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    /// The encoded response; `None` when the work completed without one.
    pub response: Option<Vec<u8>>,
    /// Whether the response is a stored error rather than a success.
    pub is_error: bool,
    /// When the retention ends and the key may run again.
    pub expires_at: SystemTime,
    /// Why the result was not kept, when the store reports that rather than an engine's record
    /// of it: `RemoteStore`, for a key whose result idem-server's engine did not retain.
    /// `None` for every store that keeps what an engine wrote (an engine's own "not retained"
    /// is in `response`, in its envelope). [`result`](Self::result) reads either as
    /// [`Error::ResultNotRetained`]. Boxed, as it is rare: a call's future holds a
    /// `StoredResult`, and every byte of it is moved with every call.
    pub not_retained: Option<Box<str>>,
}

impl StoredResult {
    /// The encoded result as an engine stored it, with its checksum checked: what the engine
    /// replays (JSON with the default codec; an HTTP response in the layer's own format). For
    /// tools and tests that read records directly.
    ///
    /// Errors: [`Error::ResultNotRetained`] when the work completed but its result was not kept
    /// (too large, not encodable), with the reason; a [`StoreErrorKind::Corrupt`] store error
    /// when the bytes are damaged or were not written by an engine. A record completed through
    /// the raw [`Store`](crate::Store) API without a response reads as `null`.
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, MemoryStore, RecordState, Store};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("charge", "", "c-1")?;
    /// engine.call(key).run(async { Ok::<_, Error>(4200) }).await?;
    /// let Some(RecordState::Completed(cached)) = engine.store().get(&key).await?.map(|r| r.state) else {
    ///     unreachable!("the call completed");
    /// };
    /// assert_eq!(cached.result()?, b"4200");
    /// # Ok(()) }
    /// ```
    ///
    /// [`StoreErrorKind::Corrupt`]: crate::StoreErrorKind::Corrupt
    pub fn result(&self) -> Result<&[u8], Error> {
        if let Some(reason) = &self.not_retained {
            return Err(Error::ResultNotRetained {
                reason: reason.to_string(),
            });
        }
        let Some(stored) = &self.response else {
            return Ok(b"null");
        };
        match envelope::open(stored)? {
            Kept::Result(bytes) => Ok(bytes),
            Kept::NotRetained(reason) => Err(Error::ResultNotRetained {
                reason: reason.to_owned(),
            }),
            Kept::Abandoned(reason) => Err(Error::Abandoned {
                reason: reason.to_owned(),
            }),
        }
    }
}

/// What [`Store::claim`](crate::Store::claim) claims: a key, the fingerprint of the request
/// (if any) and the lease a claim gets.
///
/// ```
/// use std::time::Duration;
/// use idem::{Fingerprint, Key, ClaimRequest};
/// let key = Key::derive("deposit", "alice", "req-1")?;
/// let fingerprint = Fingerprint::from_bytes([7; 32]);
/// let request = ClaimRequest::new(&key, Duration::from_secs(30)).fingerprint(Some(&fingerprint));
/// assert_eq!(request.fingerprint, Some(&fingerprint));
/// # Ok::<(), idem::KeyError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRequest<'a> {
    /// The key to claim.
    pub key: &'a Key,
    /// The fingerprint of the request; a live record with another one refuses the claim with
    /// [`Error::KeyReused`].
    pub fingerprint: Option<&'a Fingerprint>,
    /// How long the claim holds the key unless renewed.
    pub lease: Duration,
    /// What the key becomes if the lease ends with no completion: free to claim again
    /// ([`OnLapse::Release`], the default) or [`OnLapse::Uncertain`].
    pub on_lapse: OnLapse,
}

impl<'a> ClaimRequest<'a> {
    /// A claim of `key` for `lease`, without a fingerprint.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Key, ClaimRequest};
    /// let key = Key::derive("s", "", "k")?;
    /// assert_eq!(ClaimRequest::new(&key, Duration::from_secs(30)).fingerprint, None);
    /// # Ok::<(), idem::KeyError>(())
    /// ```
    pub fn new(key: &'a Key, lease: Duration) -> ClaimRequest<'a> {
        ClaimRequest {
            key,
            fingerprint: None,
            lease,
            on_lapse: OnLapse::Release,
        }
    }

    /// The same claim, becoming `on_lapse` if its lease ends with no completion.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{ClaimRequest, Key, OnLapse};
    /// let key = Key::derive("charge", "", "c-1")?;
    /// let request = ClaimRequest::new(&key, Duration::from_secs(30)).on_lapse(OnLapse::Uncertain);
    /// assert_eq!(request.on_lapse, OnLapse::Uncertain);
    /// # Ok::<(), idem::KeyError>(())
    /// ```
    pub fn on_lapse(self, on_lapse: OnLapse) -> ClaimRequest<'a> {
        ClaimRequest { on_lapse, ..self }
    }

    /// The same claim with the request's `fingerprint` (`None` for none).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Fingerprint, Key, ClaimRequest};
    /// let key = Key::derive("s", "", "k")?;
    /// let fingerprint = Fingerprint::from_bytes([1; 32]);
    /// let request = ClaimRequest::new(&key, Duration::from_secs(30)).fingerprint(Some(&fingerprint));
    /// assert!(request.fingerprint.is_some());
    /// # Ok::<(), idem::KeyError>(())
    /// ```
    pub fn fingerprint(self, fingerprint: Option<&'a Fingerprint>) -> ClaimRequest<'a> {
        ClaimRequest {
            fingerprint,
            ..self
        }
    }

    /// Refuses a lease out of range (under 1 ms or over ten years) with
    /// [`Error::InvalidConfig`]: what every store checks first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Error, Key, ClaimRequest};
    /// let key = Key::derive("s", "", "k")?;
    /// assert!(ClaimRequest::new(&key, Duration::from_secs(30)).check().is_ok());
    /// let refused = ClaimRequest::new(&key, Duration::ZERO).check();
    /// assert!(matches!(refused, Err(Error::InvalidConfig(_))));
    /// # Ok::<(), idem::KeyError>(())
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        check_duration("lease", self.lease)
    }
}

/// What to store when a claim completes, and for how long.
///
/// ```
/// use std::time::Duration;
/// use idem::Completion;
/// let c = Completion::new(Some(b"{}"), Duration::from_secs(3600));
/// assert!(!c.is_error);
/// assert_eq!(c.key_retention, Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion<'a> {
    /// The encoded response, if any.
    pub response: Option<&'a [u8]>,
    /// Whether the response is an error result.
    pub is_error: bool,
    /// How long the completed record replays the response: its retention, from now.
    pub retention: Duration,
    /// How long the key is kept after the retention ends, as a tombstone without the response
    /// ([`ClaimOutcome::Expired`]): a claim meets it instead of running the work again. Zero
    /// for none: the key is free when the retention ends. Stores keep it in whole seconds,
    /// rounded up (docs/architecture.md, "Past the lease").
    pub key_retention: Duration,
}

impl<'a> Completion<'a> {
    /// A completion that keeps `response` (not an error) for `retention`, with no tombstone
    /// after it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::Completion;
    /// let c = Completion::new(None, Duration::from_secs(60));
    /// assert_eq!(c.retention, Duration::from_secs(60));
    /// ```
    pub fn new(response: Option<&'a [u8]>, retention: Duration) -> Completion<'a> {
        Completion {
            response,
            is_error: false,
            retention,
            key_retention: Duration::ZERO,
        }
    }

    /// Refuses a retention out of range (under 1 ms or over ten years) with
    /// [`Error::InvalidConfig`]: what every store checks first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Completion, Error};
    /// let forever = Completion { response: None, is_error: false, retention: Duration::MAX, key_retention: Duration::ZERO };
    /// assert!(matches!(forever.check(), Err(Error::InvalidConfig(_))));
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        check_duration("retention", self.retention)?;
        if !self.key_retention.is_zero() {
            check_duration("key_retention", self.key_retention)?;
        }
        Ok(())
    }
}

/// What a claim's key becomes when its lease ends with no completion (its holder crashed,
/// stalled or lost the store).
///
/// ```
/// use idem::OnLapse;
/// assert_eq!(OnLapse::default(), OnLapse::Release);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum OnLapse {
    /// The key is free: the next claim takes it over and runs the work again. Right for work
    /// whose effects are all in the store's database, or safe to repeat.
    #[default]
    Release,
    /// The key becomes uncertain: nobody runs it again, and every claim gets
    /// [`ClaimOutcome::Uncertain`] until it is resolved (`Idempotency::resolve`, `idem
    /// resolve`, a reconciler). For work with an effect outside the store that must not repeat
    /// (a charge, an email). The holder may still complete it while nobody has resolved it.
    Uncertain,
}

/// An uncertain operation, as [`Store::find_uncertain`](crate::Store::find_uncertain) lists it:
/// a claim made with [`OnLapse::Uncertain`] whose lease ended with no completion.
///
/// ```
/// use std::time::SystemTime;
/// use idem::{Key, Token, UncertainOperation};
/// let op = UncertainOperation { key: Key::derive("charge", "", "c-1")?, token: Token::random(), since: SystemTime::now() };
/// assert_eq!(op.key, Key::derive("charge", "", "c-1")?);
/// # Ok::<(), idem::KeyError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncertainOperation {
    /// The operation's key.
    pub key: Key,
    /// The token of the claim that lapsed: what
    /// [`Store::take_uncertain`](crate::Store::take_uncertain) is fenced by.
    pub token: Token,
    /// When its lease ended.
    pub since: SystemTime,
}

/// The result of [`Store::claim`](crate::Store::claim).
///
/// ```
/// use idem::ClaimOutcome;
/// fn describe(s: &ClaimOutcome) -> &'static str {
///     match s {
///         ClaimOutcome::Claimed(_) => "run the work",
///         ClaimOutcome::Completed(_) => "replay",
///         ClaimOutcome::Locked { .. } => "busy",
///         ClaimOutcome::Uncertain { .. } => "ask an operator",
///         ClaimOutcome::Expired { .. } => "too late to replay",
///     }
/// }
/// assert_eq!(describe(&ClaimOutcome::Locked { retry_after: std::time::Duration::ZERO }), "busy");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a Claimed outcome's claim must be completed or aborted"]
pub enum ClaimOutcome {
    /// The key was absent, its lease had expired or its retention was over: this caller owns it.
    Claimed(Claim),
    /// The key completed earlier: replay the stored response.
    Completed(StoredResult),
    /// Another claim holds a live lease on the key.
    Locked {
        /// Time left on the other claim's lease.
        retry_after: Duration,
    },
    /// A claim made with [`OnLapse::Uncertain`] lapsed with no completion: whether its work
    /// took effect is unknown, so nobody runs it again until it is resolved.
    Uncertain {
        /// When the lapsed claim's lease ended.
        since: SystemTime,
    },
    /// The key completed, and its result's retention ended at `since`; the key is kept as a
    /// tombstone (its completion's `key_retention`), so the work does not run again.
    Expired {
        /// When the result's retention ended.
        since: SystemTime,
    },
}

/// The state of a live record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// A claim is running.
    InProgress {
        /// The owner's fencing token.
        token: Token,
        /// When the owner's lease ends unless renewed.
        lease_until: SystemTime,
    },
    /// The work completed.
    Completed(StoredResult),
    /// A claim made with [`OnLapse::Uncertain`] lapsed with no completion
    /// ([`ClaimOutcome::Uncertain`]).
    Uncertain {
        /// The lapsed claim's token, which
        /// [`Store::take_uncertain`](crate::Store::take_uncertain) is fenced by.
        token: Token,
        /// When its lease ended.
        since: SystemTime,
    },
    /// The result's retention ended; the key is kept as a tombstone
    /// ([`ClaimOutcome::Expired`]).
    Expired {
        /// When the result's retention ended.
        since: SystemTime,
    },
}

/// A record as [`Store::get`](crate::Store::get) returns it (records that ended read as absent;
/// uncertain ones and tombstones are live).
///
/// ```
/// use idem::{Record, RecordState};
/// fn in_progress(r: &Record) -> bool { matches!(r.state, RecordState::InProgress { .. }) }
/// # let _ = in_progress;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The record's key.
    pub key: Key,
    /// The fingerprint of the request that claimed it, if one was given.
    pub fingerprint: Option<Fingerprint>,
    /// In progress or completed.
    pub state: RecordState,
}

impl Record {
    /// The record of `key`, as a store read it.
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use idem::{Key, Record, RecordState, Token};
    /// let key = Key::derive("s", "", "k")?;
    /// let running = RecordState::InProgress { token: Token::random(), lease_until: SystemTime::now() };
    /// assert_eq!(Record::new(key, None, running).key, key);
    /// # Ok::<(), idem::KeyError>(())
    /// ```
    pub fn new(key: Key, fingerprint: Option<Fingerprint>, state: RecordState) -> Record {
        Record {
            key,
            fingerprint,
            state,
        }
    }
}
