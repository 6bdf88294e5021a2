//! Resolving an uncertain operation (docs/architecture.md, "Past the lease"): what an operator
//! decides (`idem resolve`, idem-server's admin routes) and a reconciler learns from a provider,
//! applied through one fenced takeover and the store's own completion or release.

use std::time::Duration;

use crate::codec::Codec;
use crate::envelope;
use crate::error::Error;
use crate::key::Key;
use crate::record::{Claim, Completion, RecordState, UncertainOperation};
use crate::step::{Abandoned, AbandonedQuery, StepState, INPUT_STEP};

use super::Idempotency;

/// What a [`Completer`](crate::Completer)'s reconciler learned from the provider about an
/// uncertain operation (see [`Completer::reconciler`](crate::Completer::reconciler)).
///
/// ```
/// use idem::Reconciled;
/// let charged: Reconciled<String> = Reconciled::Completed("ch_1".into());
/// assert!(matches!(charged, Reconciled::Completed(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled<T> {
    /// The effect happened, with this result: the operation completes with it, and every retry
    /// replays it.
    Completed(T),
    /// The effect did not happen: the operation's key is freed, and the next retry runs it.
    Failed,
    /// The provider cannot tell yet: the operation stays uncertain, for the next run (or an
    /// operator).
    Unknown,
}

/// What an uncertain operation's effect turned out to be, as
/// [`Idempotency::resolve`] records it.
///
/// ```
/// use idem::Resolution;
/// let charged = Resolution::Completed(br#"{"charge":"ch_1"}"#.to_vec());
/// assert!(matches!(charged, Resolution::Completed(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// It happened: every retry replays this result, encoded as the engine that runs the key
    /// stores its results (JSON with the default codec; the HTTP layer's own format for its
    /// keys), for the policy's retention.
    Completed(Vec<u8>),
    /// It did not happen: the key is freed, and the next retry runs the work.
    Failed,
    /// Neither, and it must not run again: retries get [`Error::Abandoned`] with this reason
    /// until the policy's retention ends.
    Abandoned(String),
}

impl<C: Codec> Idempotency<C> {
    /// Resolves the uncertain operation of `key` (a claim made with
    /// [`OnLapse::Uncertain`](crate::OnLapse::Uncertain) that lapsed with no completion) as
    /// `resolution`. Three round trips: the record is read, taken over with
    /// [`Store::take_uncertain`](crate::Store::take_uncertain) (fenced by the lapsed claim's
    /// token, so of two resolutions only the first lands), then completed or released.
    ///
    /// Errors: [`Error::NotUncertain`] when the key is not uncertain (running, completed, free)
    /// or another resolution reached it first; nothing is changed. A store failure after the
    /// takeover leaves the key uncertain again once the takeover's lease ends: resolve again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Error, Idempotency, Key, ManualClock, MemoryStore, OnLapse, Resolution};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
    /// let clock = ManualClock::new();
    /// let engine = Idempotency::builder(MemoryStore::with_clock(clock.clone()))
    ///     .on_lapse(OnLapse::Uncertain)
    ///     .build()?;
    /// let key = Key::derive("charge", "", "c-1")?;
    /// // The holder claims, then dies mid-charge: its lease ends with no completion.
    /// let idem::CallClaim::Claimed(_dead) = engine.call(key).claim().await? else { unreachable!() };
    /// clock.advance(Duration::from_secs(31));
    /// let retry = engine.call(key).run(async { Ok::<_, Error>(1) }).await;
    /// assert!(matches!(retry, Err(Error::Uncertain { .. })));
    ///
    /// // The provider says the charge went through.
    /// engine.resolve(&key, Resolution::Completed(b"7".to_vec())).await?;
    /// let replayed = engine.call(key).run(async { Ok::<_, Error>(1) }).await?;
    /// assert_eq!(replayed.into_inner(), 7);
    /// // A second resolution is refused.
    /// let again = engine.resolve(&key, Resolution::Failed).await;
    /// assert!(matches!(again, Err(Error::NotUncertain { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn resolve(&self, key: &Key, resolution: Resolution) -> Result<(), Error> {
        let store = self.store();
        let not_uncertain = || Error::NotUncertain { operation: *key };
        let token = match store.get(key).await?.map(|r| r.state) {
            Some(RecordState::Uncertain { token, .. }) => token,
            _ => return Err(not_uncertain()),
        };
        let claim = store
            .take_uncertain(key, token, self.policy().lease())
            .await?;
        self.settle(&claim, resolution).await
    }

    /// Applies `resolution` through `claim`, a takeover of an uncertain operation
    /// ([`Store::take_uncertain`](crate::Store::take_uncertain)): completes it (with the result,
    /// or the note that it was abandoned) or releases it (failed).
    pub(crate) async fn settle(&self, claim: &Claim, resolution: Resolution) -> Result<(), Error> {
        let store = self.store();
        let policy = self.policy();
        let sealed = match resolution {
            Resolution::Failed => {
                self.mark_rerun(claim).await?;
                return store.abort(claim).await;
            }
            Resolution::Completed(result) => envelope::result(result),
            Resolution::Abandoned(reason) => envelope::abandoned(&reason),
        };
        let completion = Completion {
            response: Some(&sealed),
            is_error: false,
            retention: policy.retention(),
            key_retention: policy.key_retention(),
        };
        store.complete(claim, completion).await
    }

    /// Records, for an operation with steps, that the attempt `claim` holds resolved it as
    /// failed, so that the next attempt runs again the at-most-once steps the lapsed one had
    /// begun (which would otherwise answer `StepInterrupted`). Nothing for an operation
    /// without steps, or on a store that keeps none.
    async fn mark_rerun(&self, claim: &Claim) -> Result<(), Error> {
        let store = self.store();
        let retention = self.policy().retention();
        let log = match store.begin_steps(claim, retention).await {
            Ok(log) => log,
            Err(Error::StepsUnsupported) => return Ok(()),
            Err(e) => return Err(e),
        };
        if !log.steps.iter().any(|s| s.state == StepState::Begun) {
            return Ok(());
        }
        let name = crate::step::rerun_step(log.attempt);
        let mark =
            crate::step::StepWrite::new(&name, crate::step::INPUT_POSITION, Some(b""), retention);
        store.write_step(claim, mark).await
    }

    /// The scope and input an operation stored with its steps
    /// ([`Call::run_steps_with`](crate::Call::run_steps_with)), read through `claim`, a takeover
    /// of it: `None` for an operation that stored none (or on a store that keeps no steps).
    pub(crate) async fn input_of(&self, claim: &Claim) -> Result<Option<Abandoned>, Error> {
        let log = match self
            .store()
            .begin_steps(claim, self.policy().retention())
            .await
        {
            Ok(log) => log,
            Err(Error::StepsUnsupported) => return Ok(None),
            Err(e) => return Err(e),
        };
        log.steps
            .iter()
            .find_map(|s| match &s.state {
                StepState::Finished(input) if s.name == INPUT_STEP => Some(input),
                _ => None,
            })
            .map(|input| Abandoned::decode(*claim.key(), input))
            .transpose()
    }

    /// Gives a takeover of an uncertain operation back, still uncertain: its lease ends a
    /// millisecond from now, and the operation is uncertain again (since then), under the
    /// takeover's token. What a reconciler that could not tell does.
    pub(crate) async fn put_back(&self, claim: &Claim) -> Result<(), Error> {
        self.store().renew(claim, Duration::from_millis(1)).await
    }

    /// Up to `query.limit` uncertain operations with keys after `query.after`, by key: what
    /// `idem uncertain` lists ([`Store::find_uncertain`](crate::Store::find_uncertain)).
    ///
    /// ```
    /// use idem::{AbandonedQuery, Idempotency, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
    /// let engine = Idempotency::new(MemoryStore::new());
    /// assert!(engine.uncertain(AbandonedQuery::first(50)).await?.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn uncertain(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<UncertainOperation>, Error> {
        self.store().find_uncertain(query).await
    }
}
