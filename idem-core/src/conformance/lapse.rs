//! Past the lease (`docs/architecture.md`, "Past the lease"): uncertain claims, their fenced
//! resolution, tombstones and policy versions, checked against the `Store` trait and through
//! the engine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::{
    AbandonedQuery, CallClaim, Claim, ClaimOutcome, ClaimRequest, Completion, Error, Fingerprint,
    Idempotency, Key, OnLapse, Outcome, RecordState, Resolution, StepWrite, Store,
};

use super::store::{assert_pages, claim, done, key, long, past_short, short, wait};
use super::{scaled, Harness};

/// How long after a reconciler gave an operation back it reads as uncertain on every store:
/// its 1 ms lease, plus DynamoDB's clock-skew margin (100 ms in our harness) and room to spare.
const GIVEN_BACK: Duration = Duration::from_millis(300);

/// A claim of `key` for `lease` that becomes uncertain if it lapses.
async fn uncertain_claim(store: &dyn Store, key: &Key, lease: Duration) -> Claim {
    let request = ClaimRequest::new(key, lease).on_lapse(OnLapse::Uncertain);
    match store.claim(request).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// What a claim of `key` (an ordinary one, with a long lease) gets.
async fn claim_of(store: &dyn Store, key: &Key) -> ClaimOutcome {
    store.claim(ClaimRequest::new(key, long())).await.unwrap()
}

/// `key` is uncertain: a claim gets `Uncertain`, `get` reads it with `token` and the same
/// `since` (its lease's end, on the store's clock), and `find_uncertain` lists it with both.
async fn assert_uncertain(store: &dyn Store, key: &Key, token: crate::Token) {
    let since = match claim_of(store, key).await {
        ClaimOutcome::Uncertain { since } => since,
        other => panic!("expected Uncertain, got {other:?}"),
    };
    match store.get(key).await.unwrap().map(|r| r.state) {
        Some(RecordState::Uncertain { token: t, since: s }) => assert_eq!((t, s), (token, since)),
        other => panic!("get of an uncertain key read {other:?}"),
    }
    let listed = store
        .find_uncertain(AbandonedQuery::first(100))
        .await
        .unwrap();
    assert!(
        listed
            .iter()
            .any(|op| op.key == *key && op.token == token && op.since == since),
        "find_uncertain does not list it: {listed:?}"
    );
}

/// A [`Completion`] of `response` for a long retention with a tombstone of `key_retention`.
fn with_tombstone(response: &[u8], retention: Duration, key_retention: Duration) -> Completion<'_> {
    Completion {
        key_retention,
        ..done(response, retention)
    }
}

/// **Uncertain, not free**: a claim made with `OnLapse::Uncertain` locks its key while its lease
/// runs (and is not listed); once the lease ends with no completion, no claim takes it over,
/// every claim gets `Uncertain`, `find_uncertain` lists it, and neither `prune_expired` nor the
/// backend's own expiry removes it.
pub async fn uncertain_lapse_is_never_taken_over(h: impl Harness) {
    let s = h.store();
    let k = key("uncertain");
    let c = uncertain_claim(&*s, &k, short()).await;
    assert!(matches!(
        claim_of(&*s, &k).await,
        ClaimOutcome::Locked { .. }
    ));
    let listed = s.find_uncertain(AbandonedQuery::first(10)).await.unwrap();
    assert!(
        listed.is_empty(),
        "a live claim is not uncertain: {listed:?}"
    );
    wait(past_short()).await;
    assert_uncertain(&*s, &k, c.token()).await;
    let _ = s.prune_expired(1000).await.unwrap();
    assert_uncertain(&*s, &k, c.token()).await;
    // An ordinary claim's lapse is still free: taken over at once.
    let free = key("released");
    claim(&*s, &free, short()).await;
    wait(past_short()).await;
    assert!(matches!(
        claim_of(&*s, &free).await,
        ClaimOutcome::Claimed(_)
    ));
    assert_uncertain(&*s, &k, c.token()).await;
}

/// **A late holder still completes** an uncertain claim nobody resolved: its result replays,
/// and the key is no longer listed.
pub async fn uncertain_holder_still_completes(h: impl Harness) {
    let s = h.store();
    let k = key("late");
    let c = uncertain_claim(&*s, &k, short()).await;
    wait(past_short()).await;
    assert_uncertain(&*s, &k, c.token()).await;
    s.complete(&c, done(b"charged", long())).await.unwrap();
    match claim_of(&*s, &k).await {
        ClaimOutcome::Completed(r) => assert_eq!(r.response.as_deref(), Some(&b"charged"[..])),
        other => panic!("expected the holder's result, got {other:?}"),
    }
    let listed = s.find_uncertain(AbandonedQuery::first(10)).await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}

/// **Resolution, fenced**: `take_uncertain` refuses (changing nothing) a live claim, an
/// ordinary lapsed one, an absent key and a wrong token; with the lapsed claim's token it takes
/// the key over once, and a second resolver with the same token is refused. The old holder is
/// then fenced out, and the resolver's completion replays.
pub async fn take_uncertain_is_fenced(h: impl Harness) {
    let s = h.store();
    let k = key("fenced");
    let refused = |r: Result<Claim, Error>| match r {
        Err(Error::NotUncertain { operation }) => assert_eq!(operation, k),
        other => panic!("expected NotUncertain, got {other:?}"),
    };
    refused(s.take_uncertain(&k, crate::Token::random(), long()).await);
    let holder = uncertain_claim(&*s, &k, short()).await;
    refused(s.take_uncertain(&k, holder.token(), long()).await);
    wait(past_short()).await;
    refused(s.take_uncertain(&k, crate::Token::random(), long()).await);
    let resolver = s.take_uncertain(&k, holder.token(), long()).await.unwrap();
    assert_eq!(resolver.key(), &k);
    assert_ne!(resolver.token(), holder.token());
    refused(s.take_uncertain(&k, holder.token(), long()).await);
    // The resolver's lease is live: the key is locked, not uncertain.
    assert!(matches!(
        claim_of(&*s, &k).await,
        ClaimOutcome::Locked { .. }
    ));
    assert!(matches!(
        s.complete(&holder, done(b"late", long())).await,
        Err(Error::LeaseLost)
    ));
    s.complete(&resolver, done(b"resolved", long()))
        .await
        .unwrap();
    match claim_of(&*s, &k).await {
        ClaimOutcome::Completed(r) => assert_eq!(r.response.as_deref(), Some(&b"resolved"[..])),
        other => panic!("expected the resolution, got {other:?}"),
    }
    // An ordinary claim that lapsed is free, not uncertain: not for `take_uncertain`.
    let ordinary = key("ordinary");
    let c = claim(&*s, &ordinary, short()).await;
    wait(past_short()).await;
    match s.take_uncertain(&ordinary, c.token(), long()).await {
        Err(Error::NotUncertain { .. }) => {}
        other => panic!("expected NotUncertain, got {other:?}"),
    }
}

/// A resolution as *failed* (`abort` through the resolver's claim) frees the key: the next
/// claim runs. A resolver that itself lapses leaves the key uncertain again, under its token.
pub async fn uncertain_resolutions_free_or_lapse_again(h: impl Harness) {
    let s = h.store();
    let k = key("failed");
    let holder = uncertain_claim(&*s, &k, short()).await;
    wait(past_short()).await;
    let resolver = s.take_uncertain(&k, holder.token(), long()).await.unwrap();
    s.abort(&resolver).await.unwrap();
    assert!(matches!(claim_of(&*s, &k).await, ClaimOutcome::Claimed(_)));

    let k = key("resolver-died");
    let holder = uncertain_claim(&*s, &k, short()).await;
    wait(past_short()).await;
    let resolver = s.take_uncertain(&k, holder.token(), short()).await.unwrap();
    wait(past_short()).await;
    assert_uncertain(&*s, &k, resolver.token()).await;
}

/// `find_uncertain` pages by key, as `find_abandoned` does.
pub async fn uncertain_pages_by_key(h: impl Harness) {
    let s = h.store();
    let mut keys: Vec<Key> = (0..5).map(|i| key(&format!("page-{i}"))).collect();
    for k in &keys {
        uncertain_claim(&*s, k, short()).await;
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
            let page = s.find_uncertain(query).await.unwrap();
            page.into_iter().map(|op| op.key).collect()
        }
    })
    .await;
}

/// A step write with `on_lapse` sets what the operation's record becomes on lapse: an
/// at-most-once step's begin (`Uncertain`) leaves a holder that dies inside it uncertain; its
/// result (`Release`) frees the key again on lapse. Fenced as any step write.
pub async fn step_writes_set_what_a_lapse_leaves(h: impl Harness) {
    if !h.keeps_steps() {
        return;
    }
    let s = h.store();
    let day = scaled(Duration::from_secs(86_400));
    let step = |result, on_lapse| StepWrite {
        on_lapse: Some(on_lapse),
        ..StepWrite::new("charge", 0, result, day)
    };
    let k = key("inside-the-charge");
    let c = claim(&*s, &k, short()).await;
    s.begin_steps(&c, day).await.unwrap();
    s.write_step(&c, step(None, OnLapse::Uncertain))
        .await
        .unwrap();
    wait(past_short()).await;
    assert_uncertain(&*s, &k, c.token()).await;

    let k = key("after-the-charge");
    let c = claim(&*s, &k, short()).await;
    s.begin_steps(&c, day).await.unwrap();
    s.write_step(&c, step(None, OnLapse::Uncertain))
        .await
        .unwrap();
    s.write_step(&c, step(Some(b"ch_1"), OnLapse::Release))
        .await
        .unwrap();
    wait(past_short()).await;
    assert!(matches!(claim_of(&*s, &k).await, ClaimOutcome::Claimed(_)));
    // A stale claim's write changes nothing.
    assert!(matches!(
        s.write_step(&c, step(None, OnLapse::Uncertain)).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        claim_of(&*s, &k).await,
        ClaimOutcome::Locked { .. }
    ));
}

/// **Tombstones**: a completion with a `key_retention` replays during its retention; then every
/// claim gets `Expired` (since the retention's end) and `get` reads the tombstone, pruned or
/// not; once `key_retention` has passed too, the key is free.
pub async fn tombstone_answers_expired_then_frees(h: impl Harness) {
    let s = h.store();
    let k = key("tombstone");
    let kept = scaled(Duration::from_secs(1));
    let c = claim(&*s, &k, long()).await;
    s.complete(&c, with_tombstone(b"paid", short(), kept))
        .await
        .unwrap();
    assert!(matches!(
        claim_of(&*s, &k).await,
        ClaimOutcome::Completed(_)
    ));
    wait(past_short()).await;
    let _ = s.prune_expired(1000).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        match claim_of(&*s, &k).await {
            ClaimOutcome::Expired { since } => seen.push(since),
            other => panic!("expected Expired, got {other:?}"),
        }
    }
    match s.get(&k).await.unwrap().map(|r| r.state) {
        Some(RecordState::Expired { since }) => seen.push(since),
        other => panic!("get of a tombstone read {other:?}"),
    }
    assert!(
        seen.windows(2).all(|w| w[0] == w[1]),
        "one retention end: {seen:?}"
    );
    // A tombstone keeps the fingerprint rule too: but none was given here.
    wait(kept + Duration::from_millis(1100)).await;
    assert!(matches!(claim_of(&*s, &k).await, ClaimOutcome::Claimed(_)));
}

/// A tombstone is removed by `prune_expired` (or the backend's expiry) once its `key_retention`
/// has passed, as a completed record without one is at its retention's end.
pub async fn tombstone_is_pruned_after_key_retention(h: impl Harness) {
    let s = h.store();
    let k = key("pruned-tombstone");
    let kept = scaled(Duration::from_secs(1));
    let c = claim(&*s, &k, long()).await;
    s.complete(&c, with_tombstone(b"paid", short(), kept))
        .await
        .unwrap();
    wait(past_short() + kept + Duration::from_millis(1100)).await;
    let mut pruned = 0;
    for _ in 0..10 {
        pruned += s.prune_expired(1000).await.unwrap();
    }
    assert!(s.get(&k).await.unwrap().is_none());
    if !h.expires_by_itself() {
        assert!(pruned >= 1, "the tombstone was not pruned");
    }
}

/// **Policy versions**: a record stored under one policy version, met by a request of another
/// digest under another version, is `PolicyChanged` (in progress or completed), never
/// `KeyReused`; the same digest under another version replays; another digest under the same
/// version is `KeyReused`. Nothing is changed.
pub async fn policy_change_is_not_key_reused(h: impl Harness) {
    let s = h.store();
    let k = key("policy");
    let v1 = Fingerprint::of_bytes(b"amount=5").with_policy(1);
    let v2_other = Fingerprint::of_bytes(b"amount=5;currency=eur").with_policy(2);
    let v1_other = Fingerprint::of_bytes(b"amount=6").with_policy(1);
    let v2_same = Fingerprint::of_bytes(b"amount=5").with_policy(2);
    let with = |f| ClaimRequest::new(&k, long()).fingerprint(Some(f));
    let ClaimOutcome::Claimed(c) = s.claim(with(&v1)).await.unwrap() else {
        panic!("a new key is claimed")
    };
    let changed = |r: Result<ClaimOutcome, Error>| match r {
        Err(Error::PolicyChanged { stored, current }) => assert_eq!((stored, current), (1, 2)),
        other => panic!("expected PolicyChanged, got {other:?}"),
    };
    changed(s.claim(with(&v2_other)).await);
    assert!(matches!(
        s.claim(with(&v2_same)).await,
        Ok(ClaimOutcome::Locked { .. })
    ));
    s.complete(&c, done(b"ok", long())).await.unwrap();
    changed(s.claim(with(&v2_other)).await);
    assert!(matches!(
        s.claim(with(&v1_other)).await,
        Err(Error::KeyReused)
    ));
    match s.claim(with(&v2_same)).await.unwrap() {
        ClaimOutcome::Completed(r) => assert_eq!(r.response.as_deref(), Some(&b"ok"[..])),
        other => panic!("the same request under another version replays, got {other:?}"),
    }
    match s.get(&k).await.unwrap() {
        Some(record) => assert_eq!(record.fingerprint.map(|f| f.policy()), Some(1)),
        None => panic!("the record is gone"),
    }
}

/// Through the engine: a call made with `OnLapse::Uncertain` whose holder dies is never run
/// again; every retry gets `Error::Uncertain` naming its key; the engine lists it; resolved as
/// completed, retries replay the resolution, and a second resolution is refused.
pub async fn engine_uncertain_never_reruns(h: impl Harness) {
    let engine = Idempotency::builder(h.store())
        .lease(short())
        .on_lapse(OnLapse::Uncertain)
        .build()
        .unwrap();
    let k = key("charge");
    let CallClaim::Claimed(_dead) = engine.call(k).claim().await.unwrap() else {
        panic!("a new key is claimed")
    };
    wait(past_short()).await;
    let runs = AtomicUsize::new(0);
    let retry = || async {
        engine
            .call(k)
            .run(async { Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) as u32 + 100) })
            .await
    };
    for _ in 0..3 {
        match retry().await {
            Err(Error::Uncertain { operation, .. }) => assert_eq!(operation, k),
            other => panic!("expected Uncertain, got {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "an uncertain key never runs"
    );
    let listed = engine.uncertain(AbandonedQuery::first(10)).await.unwrap();
    assert_eq!(listed.iter().map(|op| op.key).collect::<Vec<_>>(), [k]);
    engine
        .resolve(&k, Resolution::Completed(b"7".to_vec()))
        .await
        .unwrap();
    assert_eq!(retry().await.unwrap(), Outcome::Replayed(7));
    assert!(matches!(
        engine.resolve(&k, Resolution::Failed).await,
        Err(Error::NotUncertain { .. })
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Through the engine: resolved as *failed*, the next retry runs (once); as *abandoned*,
/// retries get `Error::Abandoned` with the reason and never run.
pub async fn engine_uncertain_failed_or_abandoned(h: impl Harness) {
    let engine = Idempotency::builder(h.store())
        .lease(short())
        .on_lapse(OnLapse::Uncertain)
        .build()
        .unwrap();
    let runs = AtomicUsize::new(0);
    let retry = |k: Key| {
        let runs = &runs;
        let engine = &engine;
        async move {
            engine
                .call(k)
                .run(async { Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) as u32) })
                .await
        }
    };
    let (failed, abandoned) = (key("failed"), key("abandoned"));
    for k in [failed, abandoned] {
        let CallClaim::Claimed(_dead) = engine.call(k).claim().await.unwrap() else {
            panic!("a new key is claimed")
        };
    }
    wait(past_short()).await;
    engine.resolve(&failed, Resolution::Failed).await.unwrap();
    assert_eq!(retry(failed).await.unwrap(), Outcome::Fresh(0));
    assert_eq!(retry(failed).await.unwrap(), Outcome::Replayed(0));
    let why = "refunded by hand".to_string();
    engine
        .resolve(&abandoned, Resolution::Abandoned(why.clone()))
        .await
        .unwrap();
    for _ in 0..2 {
        match retry(abandoned).await {
            Err(Error::Abandoned { reason }) => assert_eq!(reason, why),
            other => panic!("expected Abandoned, got {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Through the engine: after the retention a retry gets `ResultExpired` (tombstones on, the
/// default), never a second run; after `key_retention` it runs.
pub async fn engine_tombstone_then_runs(h: impl Harness) {
    let kept = scaled(Duration::from_secs(1));
    let engine = Idempotency::builder(h.store())
        .retention(short())
        .key_retention(kept)
        .build()
        .unwrap();
    let k = key("expiring");
    let runs = AtomicUsize::new(0);
    let call = || async {
        engine
            .call(k)
            .run(async { Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst)) })
            .await
    };
    assert_eq!(call().await.unwrap(), Outcome::Fresh(0));
    wait(past_short()).await;
    for _ in 0..2 {
        assert!(
            matches!(call().await, Err(Error::ResultExpired { .. })),
            "a retry after the retention must not run"
        );
    }
    wait(kept + Duration::from_millis(1100)).await;
    assert_eq!(call().await.unwrap(), Outcome::Fresh(1));
}

/// Through a completer with a reconciler: of four uncertain operations (each a client that died
/// inside its work, claimed with `OnLapse::Uncertain` through `run_steps_with`), the one the
/// provider says went through completes with the provider's result (a retry replays it, never
/// runs), the one it says failed is freed (a retry runs it, once), the one it cannot tell about
/// stays uncertain, and one of a scope without a reconciler stays uncertain too. The
/// abandoned-operation pass never runs any of them. A second run finds only what is left.
pub async fn engine_reconciler_settles_uncertain_operations(h: impl Harness) {
    if !h.finds_abandoned() {
        return;
    }
    let engine = Idempotency::builder(h.store())
        .lease(short())
        .on_lapse(OnLapse::Uncertain)
        .build()
        .unwrap();
    let ops = [
        ("charges", "went-through"),
        ("charges", "declined"),
        ("charges", "no-answer"),
        ("refunds", "no-reconciler"),
    ];
    for (scope, name) in ops {
        let inside = tokio::sync::Semaphore::new(0);
        let client = engine.call(key(name)).run_steps_with(
            scope,
            name.as_bytes().to_vec(),
            |_steps| async {
                inside.add_permits(1);
                std::future::pending::<Result<String, Error>>().await
            },
        );
        // The client dies inside its work (its input stored): its claim is left to lapse.
        tokio::select! {
            _ = client => panic!("the client's work never ends"),
            _ = inside.acquire() => {}
        }
    }
    wait(past_short()).await;
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let heard = asked.clone();
    let completer = crate::Completer::new(engine.clone(), crate::CompleterConfig::new())
        .unwrap()
        .handler("charges", |_steps, _input| async {
            Err::<String, _>(Error::InvalidConfig(
                "the completer must not run these".into(),
            ))
        })
        .reconciler("charges", move |k: Key, input: Vec<u8>| {
            heard.lock().unwrap().push(k.provider_key(Some("charge")));
            async move {
                Ok::<_, Error>(match &input[..] {
                    b"went-through" => crate::Reconciled::Completed("ch_1".to_owned()),
                    b"declined" => crate::Reconciled::Failed,
                    _ => crate::Reconciled::Unknown,
                })
            }
        });
    let report = completer.run_once().await.unwrap();
    assert_eq!(
        (
            report.found,
            report.uncertain,
            report.reconciled,
            report.reconciled_failed,
            report.still_uncertain
        ),
        (0, 4, 1, 1, 2),
        "{report:?}"
    );
    assert_eq!(
        asked.lock().unwrap().len(),
        3,
        "asked once per operation of its scope"
    );
    let runs = AtomicUsize::new(0);
    let retry = |name: &'static str| {
        let (engine, runs) = (&engine, &runs);
        async move {
            engine
                .call(key(name))
                .run(async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(format!("charged {name}"))
                })
                .await
        }
    };
    assert_eq!(
        retry("went-through").await.unwrap(),
        Outcome::Replayed("ch_1".to_owned())
    );
    assert_eq!(
        retry("declined").await.unwrap(),
        Outcome::Fresh("charged declined".to_owned())
    );
    // Given back, the operations left lapse at once and are uncertain again, for the next run
    // (or an operator).
    wait(GIVEN_BACK).await;
    for name in ["no-answer", "no-reconciler"] {
        let again = retry(name).await;
        assert!(matches!(again, Err(Error::Uncertain { .. })), "{again:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let again = completer.run_once().await.unwrap();
    assert_eq!(
        (again.uncertain, again.still_uncertain),
        (2, 2),
        "{again:?}"
    );
    wait(GIVEN_BACK).await;
    let listed = engine.uncertain(AbandonedQuery::first(10)).await.unwrap();
    assert_eq!(listed.len(), 2);
}

/// An operation whose holder died inside an at-most-once step is uncertain; resolved as
/// *failed* (the step's effect did not happen), the next retry runs that step again, once,
/// instead of answering `StepInterrupted`, and replays after that.
pub async fn engine_failed_resolution_reruns_an_interrupted_step(h: impl Harness) {
    if !h.keeps_steps() {
        return;
    }
    let s = h.store();
    let engine = Idempotency::builder(s.clone()).build().unwrap();
    let k = key("rerun-the-charge");
    let day = scaled(Duration::from_secs(86_400));
    // The holder: began the charge (at most once) and died inside it.
    let c = claim(&*s, &k, short()).await;
    s.begin_steps(&c, day).await.unwrap();
    let begun = StepWrite {
        on_lapse: Some(OnLapse::Uncertain),
        ..StepWrite::new("charge", 0, None, day)
    };
    s.write_step(&c, begun).await.unwrap();
    wait(past_short()).await;
    let runs = AtomicUsize::new(0);
    let retry = || async {
        let runs = &runs;
        engine
            .call(k)
            .run_steps(|steps| async move {
                steps
                    .step("charge")
                    .at_most_once()
                    .run(|| async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Error>("ch_1".to_owned())
                    })
                    .await
            })
            .await
    };
    assert!(matches!(retry().await, Err(Error::Uncertain { .. })));
    engine.resolve(&k, Resolution::Failed).await.unwrap();
    assert_eq!(retry().await.unwrap(), Outcome::Fresh("ch_1".to_owned()));
    assert_eq!(retry().await.unwrap(), Outcome::Replayed("ch_1".to_owned()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
