//! What a store keeps of an operation's steps: one record per (operation key, step name), and
//! per operation the number of attempts that ran its steps. The engine's
//! [`Steps`](crate::Steps) handle reads and writes them through [`Store`](crate::Store)'s step
//! methods; docs/steps.md says what they promise.

use std::time::Duration;

use crate::error::Error;
use crate::key::Key;
use crate::store::check_duration;

/// One step of an operation as a store keeps it, keyed by the operation's key and
/// [`name`](Self::name).
///
/// ```
/// use idem::{StepRecord, StepState};
/// let charged = StepRecord { name: "charge".into(), position: 1, state: StepState::Finished(b"\"ch_1\"".to_vec()) };
/// assert!(matches!(charged.state, StepState::Finished(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// The step's name, unique within its operation.
    pub name: String,
    /// Where the step came in its operation: 0 for the first step the work ran.
    pub position: u32,
    /// Begun, or finished with its result.
    pub state: StepState,
}

/// Whether a step has its result.
///
/// ```
/// use idem::StepState;
/// assert_ne!(StepState::Begun, StepState::Finished(Vec::new()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepState {
    /// An at-most-once step was about to run and its result was never stored: the attempt that
    /// began it stopped inside it (or failed before storing it).
    Begun,
    /// The step's result, encoded by the engine's codec.
    Finished(Vec<u8>),
}

/// What [`Store::begin_steps`](crate::Store::begin_steps) found: which attempt this claim is,
/// and the steps stored so far, in the order they ran.
///
/// ```
/// use idem::StepLog;
/// let first = StepLog { attempt: 1, steps: Vec::new() };
/// assert!(first.steps.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepLog {
    /// 1 for the first claim that ran this operation's steps, 2 for the next, and so on.
    pub attempt: u32,
    /// The stored steps, by position.
    pub steps: Vec<StepRecord>,
}

impl StepLog {
    /// What a first attempt finds: attempt 1, no steps.
    pub(crate) fn first() -> StepLog {
        StepLog {
            attempt: 1,
            steps: Vec::new(),
        }
    }
}

/// A step to store: that it begins (an at-most-once step, before it runs) or its result, and
/// how long to keep the operation's steps.
///
/// ```
/// use std::time::Duration;
/// use idem::StepWrite;
/// let begun = StepWrite::new("charge", 1, None, Duration::from_secs(60));
/// assert!(begun.result.is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepWrite<'a> {
    /// The step's name.
    pub name: &'a str,
    /// Its position in the operation.
    pub position: u32,
    /// `None` to record that it begins; `Some` with its encoded result once it finished.
    pub result: Option<&'a [u8]>,
    /// How long the operation's step records are kept, from now.
    pub retention: Duration,
    /// When `Some`, the write also sets what the operation's record becomes if its claim lapses
    /// (the same fence): the engine writes [`OnLapse::Uncertain`](crate::OnLapse::Uncertain)
    /// with an at-most-once step's begin, so a holder that dies inside it leaves the operation
    /// uncertain, and the call's own choice back with that step's result.
    pub on_lapse: Option<crate::record::OnLapse>,
}

impl<'a> StepWrite<'a> {
    /// A write of step `name` at `position`: its begin (`result` `None`) or its result, keeping
    /// the operation's steps for `retention`, leaving what the record becomes on lapse as it is.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::StepWrite;
    /// let charged = StepWrite::new("charge", 0, Some(b"7"), Duration::from_secs(60));
    /// assert_eq!(charged.on_lapse, None);
    /// ```
    pub fn new(
        name: &'a str,
        position: u32,
        result: Option<&'a [u8]>,
        retention: Duration,
    ) -> StepWrite<'a> {
        StepWrite {
            name,
            position,
            result,
            retention,
            on_lapse: None,
        }
    }

    /// Refuses a retention out of range (under 1 ms or over ten years) with
    /// [`Error::InvalidConfig`]: what every store checks first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Error, StepWrite};
    /// let none = StepWrite::new("charge", 0, None, Duration::ZERO);
    /// assert!(matches!(none.check(), Err(Error::InvalidConfig(_))));
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        check_duration("retention", self.retention)
    }
}

/// Which abandoned operations [`Store::find_abandoned`](crate::Store::find_abandoned) returns:
/// up to `limit`, in key order, with keys greater than `after` (all keys when `None`).
///
/// ```
/// use idem::AbandonedQuery;
/// let first_page = AbandonedQuery { after: None, limit: 100 };
/// assert_eq!(first_page.after, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbandonedQuery<'a> {
    /// The last key of the previous page; `None` for the first page.
    pub after: Option<&'a Key>,
    /// The most operations a page holds.
    pub limit: u32,
}

impl AbandonedQuery<'_> {
    /// The first page: up to `limit` operations, from the smallest key.
    ///
    /// ```
    /// use idem::AbandonedQuery;
    /// assert_eq!(AbandonedQuery::first(10), AbandonedQuery { after: None, limit: 10 });
    /// ```
    pub fn first(limit: u32) -> AbandonedQuery<'static> {
        AbandonedQuery { after: None, limit }
    }

    /// The page after `key` (the last key of the previous page): up to `limit` operations.
    ///
    /// ```
    /// use idem::{AbandonedQuery, Key};
    /// let last = Key::derive("rides", "", "r-9")?;
    /// assert_eq!(AbandonedQuery::after(&last, 10).after, Some(&last));
    /// # Ok::<(), idem::KeyError>(())
    /// ```
    pub fn after(key: &Key, limit: u32) -> AbandonedQuery<'_> {
        AbandonedQuery {
            after: Some(key),
            limit,
        }
    }
}

/// The longest step name, in bytes: names are stored next to each operation's key.
pub const MAX_STEP_NAME_LEN: usize = 255;

/// The reserved name of the step record that keeps an operation's input for the
/// [`Completer`](crate::Completer): written by
/// [`Call::run_steps_with`](crate::Call::run_steps_with) when it first begins the operation's
/// steps. A step of your own may not take it ([`Error::InvalidStep`](crate::Error::InvalidStep)).
///
/// ```
/// assert_eq!(idem::INPUT_STEP, "idem.input");
/// ```
pub const INPUT_STEP: &str = "idem.input";

/// The reserved name of the record that marks an attempt of an operation with an input as
/// failed (its work returned an error, which its caller got): `idem.failed.<attempt>`. A
/// completer leaves such an operation alone until another attempt begins.
pub fn failed_step(attempt: u32) -> String {
    format!("{FAILED_STEP_PREFIX}{attempt}")
}

/// The prefix of [`failed_step`]'s names.
pub const FAILED_STEP_PREFIX: &str = "idem.failed.";

/// The reserved name of the record that an uncertain operation, taken over by `attempt` to be
/// resolved, was resolved as failed: its effect did not happen, so the next attempt runs an
/// at-most-once step the lapsed attempt had begun (`idem.rerun.<attempt>`).
pub(crate) fn rerun_step(attempt: u32) -> String {
    format!("{RERUN_STEP_PREFIX}{attempt}")
}

/// The prefix of [`rerun_step`]'s names.
pub(crate) const RERUN_STEP_PREFIX: &str = "idem.rerun.";

/// Step names starting with this are idem's own ([`INPUT_STEP`], the failure marks).
pub(crate) const RESERVED_PREFIX: &str = "idem.";

/// The position of the [`INPUT_STEP`] record: past any step an operation runs (positions
/// count from 0), within the 31 bits every store keeps.
pub(crate) const INPUT_POSITION: u32 = i32::MAX as u32;

/// An operation abandoned with its steps unfinished: its steps keep an input (it ran through
/// [`Call::run_steps_with`](crate::Call::run_steps_with)), no claim holds it (its last holder's
/// lease ended, or the claim was released without the work failing: a cancelled call), it has
/// not completed, and its latest attempt did not fail. What
/// [`Store::find_abandoned`](crate::Store::find_abandoned) returns, and what a
/// [`Completer`](crate::Completer) hands the handler registered for [`scope`](Self::scope).
///
/// ```
/// use idem::{Abandoned, Key};
/// let key = Key::derive("rides", "rider-7", "req-1")?;
/// let stored = Abandoned::encode_input("rides", b"{\"from\":\"a\"}");
/// let found = Abandoned::decode(key, &stored)?;
/// assert_eq!((found.scope.as_str(), &found.input[..]), ("rides", &b"{\"from\":\"a\"}"[..]));
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abandoned {
    /// The operation's key.
    pub key: crate::Key,
    /// The scope its input was stored under: names the handler that finishes it.
    pub scope: String,
    /// The input's bytes, as the caller gave them.
    pub input: Vec<u8>,
}

impl Abandoned {
    /// The bytes of the [`INPUT_STEP`] record: the scope's length (one byte, a scope is at most
    /// 255 bytes), the scope, then the input.
    pub fn encode_input(scope: &str, input: &[u8]) -> Vec<u8> {
        // `check_scope` caps a scope at 255 bytes; a longer one is cut at its length byte's
        // reach and would read back as another scope, so callers check it first.
        let len = u8::try_from(scope.len()).unwrap_or(u8::MAX);
        let mut out = Vec::with_capacity(1 + scope.len() + input.len());
        out.push(len);
        out.extend_from_slice(&scope.as_bytes()[..usize::from(len)]);
        out.extend_from_slice(input);
        out
    }

    /// The operation `key` from its [`INPUT_STEP`] record's bytes; a store error of kind
    /// `Corrupt` when they do not parse.
    pub fn decode(key: crate::Key, stored: &[u8]) -> Result<Abandoned, crate::Error> {
        let corrupt = || {
            crate::Error::Store(crate::StoreError::new(
                crate::StoreErrorKind::Corrupt,
                "an operation's stored input does not parse (its scope is cut short or not UTF-8)",
            ))
        };
        let (&len, rest) = stored.split_first().ok_or_else(corrupt)?;
        let len = usize::from(len);
        if rest.len() < len {
            return Err(corrupt());
        }
        let (scope, input) = rest.split_at(len);
        let scope = std::str::from_utf8(scope).map_err(|_| corrupt())?;
        Ok(Abandoned {
            key,
            scope: scope.to_owned(),
            input: input.to_vec(),
        })
    }
}
