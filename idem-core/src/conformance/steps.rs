//! The rules of steps (docs/steps.md): through the [`Store`] trait's step methods, and through
//! the engine's [`Steps`](crate::Steps) handle. A store whose harness says it keeps no steps
//! ([`Harness::keeps_steps`]) must refuse them with [`Error::StepsUnsupported`], storing nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::{Claim, ClaimOutcome, ClaimRequest, Error, Idempotency, Outcome, StepLog, StepState};
use crate::{StepWrite, Store};

use super::store::{claim, done, key, long, past_short, short, wait};
use super::Harness;

fn finished<'a>(
    name: &'a str,
    position: u32,
    result: &'a [u8],
    retention: Duration,
) -> StepWrite<'a> {
    StepWrite {
        name,
        position,
        result: Some(result),
        retention,
        on_lapse: None,
    }
}

fn begun(name: &str, position: u32, retention: Duration) -> StepWrite<'_> {
    StepWrite {
        name,
        position,
        result: None,
        retention,
        on_lapse: None,
    }
}

async fn begin(store: &dyn Store, claim: &Claim) -> StepLog {
    store.begin_steps(claim, long()).await.unwrap()
}

/// The (name, state) of each step of `log`, by position.
fn shown(log: &StepLog) -> Vec<(String, StepState)> {
    log.steps
        .iter()
        .map(|s| (s.name.clone(), s.state.clone()))
        .collect()
}

/// For a harness whose store keeps no steps: it refuses them, typed, and stores nothing.
/// Returns whether the rule should go on.
async fn keeps_steps(h: &impl Harness) -> bool {
    if h.keeps_steps() {
        return true;
    }
    let s = h.store();
    let c = claim(&*s, &key("no-steps"), long()).await;
    let begun = s.begin_steps(&c, long()).await;
    assert!(matches!(begun, Err(Error::StepsUnsupported)), "{begun:?}");
    let written = s.write_step(&c, finished("a", 0, b"1", long())).await;
    assert!(
        matches!(written, Err(Error::StepsUnsupported)),
        "{written:?}"
    );
    false
}

/// Each claim that begins an operation's steps is its next attempt (the same claim beginning
/// again is the same attempt), and the steps stored by one attempt, finished or begun, are what
/// the next finds, in order, after the first released its claim.
pub async fn steps_resume_across_attempts(h: impl Harness) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let k = key("steps");
    let first = claim(&*s, &k, long()).await;
    let log = begin(&*s, &first).await;
    assert_eq!((log.attempt, log.steps.len()), (1, 0), "{log:?}");
    s.write_step(&first, finished("ride", 0, b"41", long()))
        .await
        .unwrap();
    s.write_step(&first, begun("charge", 1, long()))
        .await
        .unwrap();
    assert_eq!(begin(&*s, &first).await.attempt, 1, "the same claim again");
    s.abort(&first).await.unwrap();

    let second = claim(&*s, &k, long()).await;
    let log = begin(&*s, &second).await;
    assert_eq!(log.attempt, 2);
    assert_eq!(
        shown(&log),
        [
            ("ride".to_owned(), StepState::Finished(b"41".to_vec())),
            ("charge".to_owned(), StepState::Begun),
        ]
    );
    s.write_step(&second, finished("charge", 1, b"\"ch_1\"", long()))
        .await
        .unwrap();
    s.complete(&second, done(b"ok", long())).await.unwrap();
}

/// [`Store::claim_steps`] is a claim and, when the store returns a log beside it, that claim's
/// `begin_steps`: a new key is attempt 1 with no steps (and the same claim beginning again is
/// the same attempt); after an attempt that wrote steps and released its claim, the next is
/// attempt 2 and finds them; a key another claim holds, or that completed, comes with no log
/// and no attempt counted.
pub async fn claim_steps_begins_as_begin_steps_would(h: impl Harness) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let k = key("claim-steps");
    let claim_steps = || s.claim_steps(ClaimRequest::new(&k, long()), long());
    let (outcome, log) = claim_steps().await.unwrap();
    let ClaimOutcome::Claimed(first) = outcome else {
        panic!("a new key is claimed: {outcome:?}")
    };
    let log = match log {
        Some(log) => log,
        None => begin(&*s, &first).await,
    };
    assert_eq!((log.attempt, log.steps.len()), (1, 0), "{log:?}");
    assert_eq!(begin(&*s, &first).await.attempt, 1, "the same claim again");
    s.write_step(&first, finished("ride", 0, b"41", long()))
        .await
        .unwrap();
    let (held, log) = claim_steps().await.unwrap();
    assert!(matches!(held, ClaimOutcome::Locked { .. }), "{held:?}");
    assert!(log.is_none(), "a log beside a refusal: {log:?}");
    assert_eq!(
        begin(&*s, &first).await.attempt,
        1,
        "a refused claim counts nothing"
    );
    s.abort(&first).await.unwrap();

    let (outcome, log) = claim_steps().await.unwrap();
    let ClaimOutcome::Claimed(second) = outcome else {
        panic!("a released key is claimed: {outcome:?}")
    };
    let log = match log {
        Some(log) => log,
        None => begin(&*s, &second).await,
    };
    assert_eq!(log.attempt, 2, "{log:?}");
    assert_eq!(
        shown(&log),
        [("ride".to_owned(), StepState::Finished(b"41".to_vec()))]
    );
    assert_eq!(begin(&*s, &second).await.attempt, 2, "the same claim again");
    let stale = s
        .write_step(&first, finished("late", 1, b"1", long()))
        .await;
    assert!(matches!(stale, Err(Error::LeaseLost)), "{stale:?}");
    s.complete(&second, done(b"ok", long())).await.unwrap();
    let (replay, log) = claim_steps().await.unwrap();
    assert!(matches!(replay, ClaimOutcome::Completed(_)), "{replay:?}");
    assert!(log.is_none(), "a log beside a replay: {log:?}");
}

/// Step writes are fenced by the operation's claim: a claim whose lease ended and was taken
/// over can neither begin nor write steps, nor can one whose operation completed; the claim
/// that took over is the next attempt and does not see the stale claim's writes.
pub async fn stale_claim_cannot_write_steps(h: impl Harness) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let k = key("fenced-steps");
    let stale = claim(&*s, &k, short()).await;
    begin(&*s, &stale).await;
    wait(past_short()).await;
    let current = claim(&*s, &k, long()).await;
    assert_eq!(begin(&*s, &current).await.attempt, 2);
    let written = s
        .write_step(&stale, finished("charge", 0, b"1", long()))
        .await;
    assert!(matches!(written, Err(Error::LeaseLost)), "{written:?}");
    let begun_again = s.begin_steps(&stale, long()).await;
    assert!(
        matches!(begun_again, Err(Error::LeaseLost)),
        "{begun_again:?}"
    );
    assert!(begin(&*s, &current).await.steps.is_empty());

    s.complete(&current, done(b"ok", long())).await.unwrap();
    let late = s
        .write_step(&current, finished("late", 0, b"1", long()))
        .await;
    assert!(matches!(late, Err(Error::LeaseLost)), "{late:?}");
}

/// A finished step keeps its first result: writing it again (a write retried after a lost
/// answer) is `Ok` and changes nothing, and a begun mark does not undo it.
pub async fn finished_step_keeps_its_first_result(h: impl Harness) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let c = claim(&*s, &key("first-result"), long()).await;
    s.write_step(&c, finished("charge", 0, b"1", long()))
        .await
        .unwrap();
    s.write_step(&c, finished("charge", 0, b"2", long()))
        .await
        .unwrap();
    s.write_step(&c, begun("charge", 0, long())).await.unwrap();
    assert_eq!(
        shown(&begin(&*s, &c).await),
        [("charge".to_owned(), StepState::Finished(b"1".to_vec()))]
    );
}

/// Evicting an operation deletes its steps: the next run starts at attempt 1 with none.
pub async fn evict_deletes_steps(h: impl Harness) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let k = key("evicted-steps");
    let c = claim(&*s, &k, long()).await;
    s.write_step(&c, finished("charge", 0, b"1", long()))
        .await
        .unwrap();
    assert!(s.evict(&k).await.unwrap());
    let again = claim(&*s, &k, long()).await;
    let log = begin(&*s, &again).await;
    assert_eq!((log.attempt, log.steps.len()), (1, 0), "{log:?}");
}

/// Steps end with their retention: a released operation's steps then read as absent (the next
/// run is attempt 1 with none), and `prune_expired` deletes them unless the store expires them
/// itself.
pub async fn steps_end_with_their_retention(h: impl Harness) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let k = key("ended-steps");
    let c = claim(&*s, &k, long()).await;
    s.begin_steps(&c, short()).await.unwrap();
    s.write_step(&c, finished("charge", 0, b"1", short()))
        .await
        .unwrap();
    s.abort(&c).await.unwrap();
    wait(past_short()).await;
    let pruned = s.prune_expired(100).await.unwrap();
    if !h.expires_by_itself() {
        assert!(pruned >= 1, "pruned {pruned}: the ended steps were kept");
    }
    let again = claim(&*s, &k, long()).await;
    let log = begin(&*s, &again).await;
    assert_eq!((log.attempt, log.steps.len()), (1, 0), "{log:?}");
}

/// Through the engine: a failure after a step releases the operation; the retry is attempt 2,
/// replays the finished step without running it and runs the rest; a call after that replays
/// the operation.
pub async fn engine_steps_replay_finished_steps(h: impl Harness) {
    if !keeps_steps(&h).await {
        return;
    }
    let engine = Idempotency::from_arc(h.store());
    let k = key("engine-steps");
    let (charges, receipts) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let (charged, receipted) = (&charges, &receipts);
    let run = |fail: bool| {
        engine.call(k).run_steps(move |steps| {
            let (charges, receipts) = (charged, receipted);
            async move {
                let charge: usize = steps
                    .run("charge", || async {
                        Ok::<_, Error>(charges.fetch_add(1, Ordering::SeqCst) + 100)
                    })
                    .await?;
                if fail {
                    return Err(Error::InvalidConfig("the mail server is down".into()));
                }
                steps
                    .run("receipt", || async {
                        Ok::<_, Error>(receipts.fetch_add(1, Ordering::SeqCst))
                    })
                    .await?;
                Ok::<_, Error>((charge, steps.attempt().number))
            }
        })
    };
    assert!(matches!(run(true).await, Err(Error::InvalidConfig(_))));
    assert_eq!(run(false).await.unwrap(), Outcome::Fresh((100, 2)));
    assert_eq!(run(false).await.unwrap(), Outcome::Replayed((100, 2)));
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!(receipts.load(Ordering::SeqCst), 1);
}

/// A retry whose code reaches another step name where an earlier attempt stored one gets
/// `StepMismatch`, and the step does not run.
pub async fn engine_changed_step_is_a_mismatch(h: impl Harness) {
    if !keeps_steps(&h).await {
        return;
    }
    let engine = Idempotency::from_arc(h.store());
    let k = key("changed-steps");
    let first = engine
        .call(k)
        .run_steps(|steps| async move {
            steps.run("charge", || async { Ok::<_, Error>(1) }).await?;
            Err::<(), _>(Error::InvalidConfig("stop".into()))
        })
        .await;
    assert!(matches!(first, Err(Error::InvalidConfig(_))));
    let ran = AtomicUsize::new(0);
    let counted = &ran;
    let changed = engine
        .call(k)
        .run_steps(|steps| async move {
            steps
                .run("refund", || async {
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(2)
                })
                .await
        })
        .await;
    assert!(
        matches!(&changed, Err(Error::StepMismatch { position: 0, stored, called }) if stored == "charge" && called == "refund"),
        "{changed:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// An at-most-once step that began and stored no result is never run again: the next attempt
/// gets `StepInterrupted` with its number; an at-least-once step in the same place runs again.
pub async fn engine_interrupted_step_per_mode(h: impl Harness) {
    if !keeps_steps(&h).await {
        return;
    }
    let engine = Idempotency::from_arc(h.store());
    let ran = AtomicUsize::new(0);
    let run = |k, at_most_once: bool| {
        let ran = &ran;
        engine.call(k).run_steps(move |steps| async move {
            let step = steps.step("charge");
            let step = if at_most_once {
                step.at_most_once()
            } else {
                step
            };
            step.run(|| async {
                // The first run fails inside the step: it began and has no result.
                match ran.fetch_add(1, Ordering::SeqCst) {
                    0 | 2 => Err(Error::InvalidConfig("connection reset".into())),
                    n => Ok(n),
                }
            })
            .await
        })
    };
    let (once, least) = (key("at-most-once"), key("at-least-once"));
    assert!(matches!(
        run(once, true).await,
        Err(Error::InvalidConfig(_))
    ));
    let again = run(once, true).await;
    assert!(
        matches!(&again, Err(Error::StepInterrupted { step, attempt: 2 }) if step == "charge"),
        "{again:?}"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the at-most-once step ran again"
    );
    let _ = ran.fetch_add(1, Ordering::SeqCst);
    assert!(matches!(
        run(least, true).await,
        Err(Error::InvalidConfig(_))
    ));
    assert_eq!(run(least, false).await.unwrap(), Outcome::Fresh(3));
}
