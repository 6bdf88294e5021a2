//! The rules of the completer's store query (docs/steps.md, "Completer"):
//! [`Store::find_abandoned`] finds exactly the operations in progress past their lease whose
//! steps keep an input, by key, a page at a time; and a [`Completer`](crate::Completer) on the
//! store finishes them through the engine. A store whose harness says it cannot
//! ([`Harness::finds_abandoned`]) must refuse, typed, with [`Error::CompleterUnsupported`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::step::INPUT_POSITION;
use crate::{
    Abandoned, AbandonedQuery, Claim, Completer, CompleterConfig, Error, Idempotency, Key, Outcome,
    StepWrite, Store, INPUT_STEP,
};

use super::store::{assert_pages, claim, done, key, long, past_short, short, wait};
use super::Harness;

/// Begins the steps of the operation `c` holds and stores `input` under `scope` as
/// [`Call::run_steps_with`](crate::Call::run_steps_with) does.
async fn store_input(s: &dyn Store, c: &Claim, scope: &str, input: &[u8]) {
    s.begin_steps(c, long()).await.unwrap();
    let stored = Abandoned::encode_input(scope, input);
    let step = StepWrite {
        name: INPUT_STEP,
        position: INPUT_POSITION,
        result: Some(&stored),
        retention: long(),
        on_lapse: None,
    };
    s.write_step(c, step).await.unwrap();
}

/// Claims `k` for `lease` and stores `input` under the scope `rides` ([`store_input`]), with
/// one finished step `a`.
async fn with_input(s: &dyn Store, k: &Key, lease: std::time::Duration, input: &[u8]) -> Claim {
    let c = claim(s, k, lease).await;
    store_input(s, &c, "rides", input).await;
    let a = StepWrite {
        name: "a",
        position: 0,
        result: Some(b"1"),
        retention: long(),
        on_lapse: None,
    };
    s.write_step(&c, a).await.unwrap();
    c
}

/// For a harness whose store cannot find abandoned operations: the query and a completer on
/// it refuse, typed. Returns whether the rule should go on.
async fn finds_abandoned(h: &impl Harness) -> bool {
    if h.finds_abandoned() {
        return true;
    }
    let s = h.store();
    let found = s.find_abandoned(AbandonedQuery::first(10)).await;
    assert!(
        matches!(found, Err(Error::CompleterUnsupported)),
        "{found:?}"
    );
    let completer = Completer::new(Idempotency::from_arc(s), CompleterConfig::new()).unwrap();
    let run = completer.run_once().await;
    assert!(matches!(run, Err(Error::CompleterUnsupported)), "{run:?}");
    false
}

/// `find_abandoned` finds an operation whose steps keep an input once its lease has ended (its
/// record freed or not), or once its claim was released without a failure, with its scope and
/// input, and nothing else: not one whose lease runs, nor one with steps but no input, nor a
/// completed one, nor one whose latest attempt failed, nor one taken over again.
pub async fn abandoned_found_when_unheld_only(h: impl Harness) {
    if !finds_abandoned(&h).await {
        return;
    }
    let s = h.store();
    let abandoned = key("abandoned");
    with_input(&*s, &abandoned, short(), b"to the station").await;
    let live = key("live");
    with_input(&*s, &live, long(), b"live").await;
    assert!(s
        .find_abandoned(AbandonedQuery::first(10))
        .await
        .unwrap()
        .is_empty());
    // Steps without an input (run_steps): nothing a completer could run.
    let plain = key("no-input");
    let c = claim(&*s, &plain, short()).await;
    s.begin_steps(&c, long()).await.unwrap();
    // Completed, and released, after storing an input.
    let completed = key("completed");
    let c = with_input(&*s, &completed, short(), b"c").await;
    s.complete(&c, done(b"ok", long())).await.unwrap();
    // Released after its work failed (the engine marks the attempt failed first): its
    // caller got the failure.
    let failed = key("failed");
    let c = with_input(&*s, &failed, short(), b"f").await;
    let mark = crate::step::failed_step(1);
    let step = StepWrite {
        name: &mark,
        position: INPUT_POSITION,
        result: Some(b""),
        retention: long(),
        on_lapse: None,
    };
    s.write_step(&c, step).await.unwrap();
    s.abort(&c).await.unwrap();
    // Released without a failure (a cancelled call): abandoned too, at once.
    let cancelled = key("cancelled");
    let c = with_input(&*s, &cancelled, long(), b"c").await;
    s.abort(&c).await.unwrap();
    // Abandoned, then taken over by a live claim.
    let retried = key("retried");
    with_input(&*s, &retried, short(), b"t").await;

    wait(past_short()).await;
    claim(&*s, &retried, long()).await;
    let found = s.find_abandoned(AbandonedQuery::first(10)).await.unwrap();
    let mut expected = vec![
        Abandoned {
            key: abandoned,
            scope: "rides".into(),
            input: b"to the station".to_vec(),
        },
        Abandoned {
            key: cancelled,
            scope: "rides".into(),
            input: b"c".to_vec(),
        },
    ];
    expected.sort_by_key(|a| a.key);
    assert_eq!(found, expected);
}

/// `find_abandoned` pages by key: at most `limit` operations, in key order, each after the key
/// given; a short page is the last.
pub async fn abandoned_pages_by_key(h: impl Harness) {
    if !finds_abandoned(&h).await {
        return;
    }
    let s = h.store();
    let mut keys: Vec<Key> = (0..5).map(|i| key(&format!("page-{i}"))).collect();
    for k in &keys {
        with_input(&*s, k, short(), b"p").await;
    }
    keys.sort();
    wait(past_short()).await;
    assert_pages(&keys, |after: Option<Key>| {
        let s = s.clone();
        async move {
            let query = AbandonedQuery {
                after: after.as_ref(),
                limit: 2,
            };
            let page = s.find_abandoned(query).await.unwrap();
            page.into_iter().map(|a| a.key).collect()
        }
    })
    .await;
}

/// Through the engine: a completer finishes an abandoned operation with the handler of its
/// scope, which replays the finished step and runs the rest once; the operation is then
/// completed (not found again), a client's retry replays the completer's result, and an
/// operation of a scope without a handler is left as it is.
pub async fn engine_completer_finishes_abandoned(h: impl Harness) {
    if !finds_abandoned(&h).await {
        return;
    }
    let s = h.store();
    let engine = Idempotency::from_arc(s.clone());
    let k = key("complete-me");
    with_input(&*s, &k, short(), b"station").await;
    // Another scope, without a handler here.
    let other = key("other-scope");
    let c = claim(&*s, &other, short()).await;
    store_input(&*s, &c, "parcels", b"x").await;
    wait(past_short()).await;

    let runs = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let counted = runs.clone();
    let completer = Completer::new(engine.clone(), CompleterConfig::new())
        .unwrap()
        .handler("rides", move |steps, input| {
            let runs = counted.clone();
            async move {
                let a: u32 = steps
                    .run("a", || async {
                        runs.0.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Error>(99)
                    })
                    .await?;
                let b: String = steps
                    .run("b", || async {
                        runs.1.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Error>(String::from_utf8_lossy(&input).into_owned())
                    })
                    .await?;
                Ok((a, b, steps.attempt().number))
            }
        });
    let report = completer.run_once().await.unwrap();
    assert_eq!(
        (
            report.found,
            report.completed,
            report.unhandled,
            report.failed
        ),
        (2, 1, 1, 0),
        "{report:?}"
    );
    assert!(report.drained, "{report:?}");
    assert_eq!(
        runs.0.load(Ordering::SeqCst),
        0,
        "the finished step ran again"
    );
    assert_eq!(runs.1.load(Ordering::SeqCst), 1);
    let again = completer.run_once().await.unwrap();
    assert_eq!((again.found, again.completed), (1, 0), "{again:?}");
    let retry = engine
        .call(k)
        .run_steps_with("rides", b"station".to_vec(), |_| async {
            Err::<(u32, String, u32), _>(Error::InvalidConfig("must not run".into()))
        })
        .await
        .unwrap();
    assert_eq!(
        retry,
        Outcome::Replayed((1, "station".to_owned(), 2)),
        "the first step's stored result, the second's, and the completer's attempt"
    );
}
