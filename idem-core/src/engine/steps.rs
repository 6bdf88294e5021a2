//! Steps: named parts of one guarded operation whose results are stored under the operation's
//! key, so a retry replays the finished ones and continues at the first unfinished one
//! (docs/steps.md).

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::Idempotency;
use crate::codec::{Codec, JsonCodec};
use crate::error::Error;
use crate::record::{Claim, OnLapse};
use crate::step::{
    StepLog, StepRecord, StepState, StepWrite, INPUT_STEP, MAX_STEP_NAME_LEN, RESERVED_PREFIX,
};

/// The handle a [`Call::run_steps`](crate::Call::run_steps) work receives: runs its named steps,
/// each at most once per operation while it finishes (at least once if the process dies inside
/// it, unless it is [`at_most_once`](Step::at_most_once)), and says which attempt this is.
/// Cheap to clone (one `Arc`).
///
/// Steps run one after another, in the same order on every attempt: a step is known by its
/// name and its position, and a retry that reaches another name at a position an earlier
/// attempt stored gets [`Error::StepMismatch`].
///
/// ```
/// use idem::{Error, Idempotency, Key, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let key = Key::derive("ride", "rider-7", "req-1")?;
/// let out = engine
///     .call(key)
///     .run_steps(|steps| async move {
///         let ride: u64 = steps.run("create ride", || async { Ok::<_, Error>(41) }).await?;
///         let charge: String = steps.run("charge", || async { Ok::<_, Error>("ch_1".to_owned()) }).await?;
///         Ok::<_, Error>((ride, charge))
///     })
///     .await?;
/// assert_eq!(out.into_inner(), (41, "ch_1".to_owned()));
/// # Ok(()) }
/// ```
pub struct Steps<C = JsonCodec> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for Steps<C> {
    fn clone(&self) -> Self {
        Steps {
            inner: self.inner.clone(),
        }
    }
}

impl<C> fmt::Debug for Steps<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Steps")
            .field("attempt", &self.inner.attempt)
            .finish_non_exhaustive()
    }
}

struct Inner<C> {
    engine: Idempotency<C>,
    /// `None` for a call without a key: every step runs, nothing is stored.
    claim: Option<Claim>,
    retention: Duration,
    /// What the call's key becomes on lapse: an at-most-once step sets
    /// [`OnLapse::Uncertain`] while it runs, and this back once it stored its result.
    on_lapse: OnLapse,
    /// Whether at-most-once steps begun by an earlier attempt run again: the operation was
    /// resolved as failed since.
    rerun: bool,
    attempt: Attempt,
    progress: Mutex<Progress>,
}

/// The steps stored by earlier attempts, and how far this attempt has come.
struct Progress {
    stored: Vec<StepRecord>,
    next: u32,
    names: HashSet<String>,
}

/// Which attempt of an operation is running: what [`Steps::attempt`] tells the work.
///
/// ```
/// use idem::Attempt;
/// let first = Attempt { number: 1, resumed: false };
/// assert!(!first.resumed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first claim that ran this operation's steps; each claim after it (a retry
    /// after a crash, a lost lease, a failure) counts one more.
    pub number: u32,
    /// Whether an earlier attempt stored steps this one replays: it stopped (crashed, lost its
    /// lease, failed or was cancelled) after them.
    pub resumed: bool,
}

impl<C: Codec> Steps<C> {
    /// The handle of a claimed operation, from what the store holds of it.
    pub(crate) fn new(
        engine: Idempotency<C>,
        claim: Option<Claim>,
        retention: Duration,
        on_lapse: OnLapse,
        mut log: StepLog,
    ) -> Steps<C> {
        // The attempt before this one resolved the operation as failed (see `Idempotency::settle`):
        // the at-most-once steps it found begun did not take effect, and run again.
        let rerun = log.attempt > 1 && {
            let resolved = crate::step::rerun_step(log.attempt - 1);
            log.steps.iter().any(|s| s.name == resolved)
        };
        // The operation's input (`Call::run_steps_with`) is no step of the work's.
        log.steps.retain(|s| !s.name.starts_with(RESERVED_PREFIX));
        let attempt = Attempt {
            number: log.attempt,
            resumed: log
                .steps
                .iter()
                .any(|s| matches!(s.state, StepState::Finished(_))),
        };
        Steps {
            inner: Arc::new(Inner {
                engine,
                claim,
                retention,
                on_lapse,
                rerun,
                attempt,
                progress: Mutex::new(Progress {
                    stored: log.steps,
                    next: 0,
                    names: HashSet::new(),
                }),
            }),
        }
    }

    /// The key to pass to a provider that takes an idempotency key of its own for the effect
    /// of step `step` ([`Key::provider_key`](crate::Key::provider_key)): the same on every
    /// attempt and after a takeover, so a step retried after a crash inside it charges once,
    /// and a reconciler can ask the provider about it. `None` when the call has no key.
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("rides", "", "r-1")?;
    /// let charged_with = engine
    ///     .call(key)
    ///     .run_steps(|steps| async move { Ok::<_, Error>(steps.provider_key("charge")) })
    ///     .await?
    ///     .into_inner();
    /// assert_eq!(charged_with, Some(key.provider_key(Some("charge"))));
    /// # Ok(()) }
    /// ```
    pub fn provider_key(&self, step: &str) -> Option<String> {
        let claim = self.inner.claim.as_ref()?;
        Some(claim.key().provider_key(Some(step)))
    }

    /// Which attempt of the operation this is.
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("ride", "", "r-1")?;
    /// let out = engine.call(key).run_steps(|steps| async move {
    ///     Ok::<_, Error>(steps.attempt().number)
    /// }).await?;
    /// assert_eq!(out.into_inner(), 1);
    /// # Ok(()) }
    /// ```
    pub fn attempt(&self) -> Attempt {
        self.inner.attempt
    }

    /// The step `name`, to set how it runs before running it.
    ///
    /// ```
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("ride", "", "r-2")?;
    /// engine.call(key).run_steps(|steps| async move {
    ///     steps.step("charge").at_most_once().run(|| async { Ok::<_, Error>(4200) }).await
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn step<'s>(&'s self, name: &'s str) -> Step<'s, C> {
        Step {
            steps: self,
            name,
            at_most_once: false,
        }
    }

    /// Runs the step `name` (see [`Step::run`]): `self.step(name).run(work)`.
    pub async fn run<T, E, F, Fut>(&self, name: &str, work: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        self.step(name).run(work).await
    }

    /// Takes the next position for `name` and says what to do there, from what earlier attempts
    /// stored.
    fn plan(&self, name: &str) -> Result<Plan, Error> {
        check_step_name(name)?;
        let mut progress = self
            .inner
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if progress.names.contains(name) {
            return Err(Error::InvalidStep(format!(
                "the step {name:?} runs twice in one operation: give each step its own name"
            )));
        }
        let position = progress.next;
        let at_position = progress.stored.iter().find(|s| s.position == position);
        let by_name = progress.stored.iter().find(|s| s.name == name);
        let plan = match (at_position, by_name) {
            (Some(stored), _) if stored.name != name => Err(Error::StepMismatch {
                position,
                stored: stored.name.clone(),
                called: name.to_owned(),
            }),
            (None, Some(stored)) => Err(Error::StepMismatch {
                position: stored.position,
                stored: stored.name.clone(),
                called: format!("{name} (at position {position})"),
            }),
            (Some(stored), _) => Ok(match &stored.state {
                StepState::Finished(bytes) => Plan::Replay(bytes.clone()),
                StepState::Begun => Plan::Begun(position),
            }),
            (None, None) => Ok(Plan::Run(position)),
        }?;
        progress.names.insert(name.to_owned());
        progress.next += 1;
        Ok(plan)
    }

    /// Runs an atomic step (a store crate's through [`atomic_step`]: `SqlSteps::tx`, `DynamoSteps::dynamo_tx`): its replayed value if an earlier
    /// attempt committed it, else `run`, given how to make the step's record from its encoded
    /// result. An atomic step records no beginning: begun means an at-most-once step of older
    /// code; it was never committed with writes of its own, so it runs.
    async fn atomic<'n, T, E, R, Fut>(&self, name: &'n str, run: R) -> Result<T, E>
    where
        R: FnOnce(StepAt<'n>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: DeserializeOwned,
        E: From<Error>,
    {
        match self.plan(name)? {
            Plan::Replay(bytes) => Ok(self
                .inner
                .engine
                .codec()
                .decode(&bytes)
                .map_err(Error::Codec)?),
            Plan::Begun(position) | Plan::Run(position) => {
                let retention = self.inner.retention;
                run(StepAt {
                    name,
                    position,
                    retention,
                })
                .await
            }
        }
    }

    /// `value` encoded by the engine's codec.
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, Error> {
        self.inner
            .engine
            .codec()
            .encode(value)
            .map_err(Error::Codec)
    }

    /// Stores the step `name` at `position` for this attempt's claim, begun (`result` `None`)
    /// or finished (nothing without a key), setting what the key becomes on lapse when
    /// `on_lapse` is `Some`.
    async fn write(
        &self,
        name: &str,
        position: u32,
        result: Option<&[u8]>,
        on_lapse: Option<OnLapse>,
    ) -> Result<(), Error> {
        let Some(claim) = &self.inner.claim else {
            return Ok(());
        };
        let step = StepWrite {
            name,
            position,
            result,
            retention: self.inner.retention,
            on_lapse,
        };
        self.inner.engine.store().write_step(claim, step).await
    }
}

/// An atomic step about to run: its name and position, to make its record from its result.
pub(crate) struct StepAt<'n> {
    name: &'n str,
    position: u32,
    retention: Duration,
}

impl<'n> StepAt<'n> {
    /// The record of the step finished with `result`.
    fn finished<'r>(&self, result: &'r [u8]) -> StepWrite<'r>
    where
        'n: 'r,
    {
        StepWrite {
            name: self.name,
            position: self.position,
            result: Some(result),
            retention: self.retention,
            on_lapse: None,
        }
    }
}

/// An atomic step about to run, as [`atomic_step`] hands it to a store crate's step (DynamoDB's
/// `dynamo_tx`): what the step's record is made of, and the claim that fences it.
pub struct AtomicStep<'a, C> {
    steps: &'a Steps<C>,
    at: StepAt<'a>,
}

impl<'a, C: Codec> AtomicStep<'a, C> {
    /// The step's name.
    pub fn name(&self) -> &'a str {
        self.at.name
    }

    /// The operation's claim, which the step's record must be written under (fenced by its
    /// token); `None` for a call without a key, whose steps store nothing.
    pub fn claim(&self) -> Option<&'a Claim> {
        self.steps.inner.claim.as_ref()
    }

    /// `value` encoded by the engine's codec: the step's result, as its record keeps it.
    pub fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, Error> {
        self.steps.encode(value)
    }

    /// The record of the step finished with `result` (from [`encode`](Self::encode)), to write
    /// in the same transaction as the step's effect.
    pub fn finished<'r>(&self, result: &'r [u8]) -> StepWrite<'r>
    where
        'a: 'r,
    {
        self.at.finished(result)
    }
}

/// Runs the step `name` of `steps` as an atomic phase written by a store crate (idem-dynamodb's
/// `dynamo_tx`, the SQL stores' `SqlSteps::tx`): its replayed value if an earlier attempt
/// committed it, else `run`, which gets the [`AtomicStep`] to write the step's record with the
/// effect's writes in one transaction of its store. The name is checked and its position taken
/// as for any step; errors as [`Step::run`]'s, plus `run`'s.
///
/// A plain function returning the step's future, not an `async fn`: a state machine of its own
/// around it would make every caller's future larger by the step's (a consumer's handler runs
/// inside several such layers, and a debug build's thread stack is only 2 MiB).
pub fn atomic_step<'a, C, T, E, R, Fut>(
    steps: &'a Steps<C>,
    name: &'a str,
    run: R,
) -> impl Future<Output = Result<T, E>> + use<'a, C, T, E, R, Fut>
where
    C: Codec,
    R: FnOnce(AtomicStep<'a, C>) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: DeserializeOwned,
    E: From<Error>,
{
    steps.atomic(name, move |at| run(AtomicStep { steps, at }))
}

/// What a step does at its position.
enum Plan {
    /// An earlier attempt finished it: its stored result.
    Replay(Vec<u8>),
    /// An earlier attempt began it (an at-most-once step) and stored no result.
    Begun(u32),
    /// Nothing stored: run it.
    Run(u32),
}

/// One step of an operation, made by [`Steps::step`]: set how it runs, then
/// [`run`](Self::run) it.
#[must_use = "a step does nothing until it is run and awaited"]
pub struct Step<'s, C> {
    steps: &'s Steps<C>,
    name: &'s str,
    at_most_once: bool,
}

impl<C> fmt::Debug for Step<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("at_most_once", &self.at_most_once)
            .finish_non_exhaustive()
    }
}

impl<C: Codec> Step<'_, C> {
    /// Never runs this step twice: before it runs, the store records that it begins (one more
    /// round trip), and an attempt that finds it begun without a result (an earlier attempt
    /// died inside it, or the step failed) gets [`Error::StepInterrupted`] instead of running
    /// it again. Use it for an effect that must not repeat and that you can look up (a charge
    /// you can find by its reference). By default a step is at least once: an interrupted step
    /// runs again.
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// Runs the step: replays its result if an earlier attempt of the operation finished it;
    /// otherwise runs `work` and stores its `Ok` value (encoded by the engine's codec) under the
    /// operation's key and the step's name, fenced by the operation's claim. An `Err` from
    /// `work` is returned and nothing is stored (an at-most-once step stays begun: a retry gets
    /// [`Error::StepInterrupted`]; return a final answer such as "declined" as an `Ok` value to
    /// store it).
    ///
    /// Errors besides `work`'s: [`Error::StepMismatch`] (another step is stored at this
    /// position), [`Error::StepInterrupted`], [`Error::InvalidStep`] (a bad or repeated name),
    /// [`Error::LeaseLost`] (the operation was taken over: the step's effect may have happened
    /// twice), [`Error::Codec`], and store errors. A result the store failed to keep makes the
    /// step run again on a retry.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use idem::{Error, Idempotency, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let key = Key::derive("ride", "", "r-3")?;
    /// let charges = AtomicU32::new(0);
    /// let charges = &charges;
    /// for fail_receipt in [true, false] {
    ///     let _ = engine.call(key).run_steps(|steps| async move {
    ///         steps.run("charge", || async { Ok::<_, Error>(charges.fetch_add(1, Ordering::SeqCst)) }).await?;
    ///         if fail_receipt {
    ///             return Err(Error::InvalidConfig("mail server down".into()));
    ///         }
    ///         Ok(())
    ///     }).await;
    /// }
    /// assert_eq!(charges.load(Ordering::SeqCst), 1); // the retry replayed the charge
    /// # Ok(()) }
    /// ```
    pub async fn run<T, E, F, Fut>(self, work: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        let steps = self.steps;
        let codec = steps.inner.engine.codec();
        let position = match steps.plan(self.name)? {
            Plan::Replay(bytes) => return Ok(codec.decode(&bytes).map_err(Error::Codec)?),
            Plan::Begun(_) if self.at_most_once && !steps.inner.rerun => {
                return Err(Error::StepInterrupted {
                    step: self.name.to_owned(),
                    attempt: steps.inner.attempt.number,
                }
                .into())
            }
            // At least once: an interrupted step runs again.
            Plan::Begun(position) | Plan::Run(position) => position,
        };
        // While an at-most-once step runs, a holder that dies inside it leaves the key
        // uncertain, never free: its effect may have happened. Its result puts the call's own
        // choice back (nothing to write when the call is uncertain on lapse anyway).
        let raised = (self.at_most_once && steps.inner.on_lapse == OnLapse::Release)
            .then_some(OnLapse::Release);
        if self.at_most_once {
            let uncertain = raised.map(|_| OnLapse::Uncertain);
            steps.write(self.name, position, None, uncertain).await?;
        }
        let value = work().await?;
        let bytes = codec.encode(&value).map_err(Error::Codec)?;
        steps
            .write(self.name, position, Some(&bytes), raised)
            .await?;
        Ok(value)
    }
}

/// A step name is 1 to [`MAX_STEP_NAME_LEN`] bytes: else [`Error::InvalidStep`].
/// [`check_step_name`] for a step record written through the raw store API
/// ([`Idempotency::write_step`](crate::Idempotency::write_step): a transport relaying another
/// engine's store calls, as idem-server does for `RemoteStore`): idem's own records (the input,
/// an attempt's failure, a failed resolution's rerun) pass as well.
pub(crate) fn check_written_step_name(name: &str) -> Result<(), Error> {
    let own = name == INPUT_STEP
        || name.starts_with(crate::step::FAILED_STEP_PREFIX)
        || name.starts_with(crate::step::RERUN_STEP_PREFIX);
    if own && name.len() <= MAX_STEP_NAME_LEN {
        return Ok(());
    }
    check_step_name(name)
}

pub(crate) fn check_step_name(name: &str) -> Result<(), Error> {
    if name.starts_with(RESERVED_PREFIX) {
        return Err(Error::InvalidStep(format!(
            "step names starting with {RESERVED_PREFIX:?} are idem's own ({INPUT_STEP:?} keeps \
             the operation's input): {name:?} is one, choose another"
        )));
    }
    if name.is_empty() || name.len() > MAX_STEP_NAME_LEN {
        return Err(Error::InvalidStep(format!(
            "a step name is 1 to {MAX_STEP_NAME_LEN} bytes, {name:?} is {}",
            name.len()
        )));
    }
    Ok(())
}
