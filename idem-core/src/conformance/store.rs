//! The store rules (`docs/architecture.md`, "The store rules"), checked against the `Store`
//! trait directly.

use std::time::Duration;

use crate::StoredResult;
use crate::{
    Claim, ClaimOutcome, ClaimRequest, Completion, Error, Fingerprint, Key, RecordState, Store,
};

use super::{scaled, Harness};

/// A lease that outlives any rule: 30 s, [`scaled`] like the waits.
pub(super) fn long() -> Duration {
    scaled(Duration::from_secs(30))
}

/// A lease or retention short enough to wait out: 300 ms, [`scaled`].
pub(super) fn short() -> Duration {
    scaled(Duration::from_millis(300))
}

/// Comfortably past [`short`]: 150 ms more. Unscaled, as a wait that starts once the claim has
/// answered ends past its lease however slow the machine; the margin covers the store's clock
/// (the database's, or DynamoDB's skew margin of 100 ms in our harness).
pub(super) fn past_short() -> Duration {
    short() + Duration::from_millis(150)
}

pub(super) fn key(name: &str) -> Key {
    Key::derive("conformance", "", name).unwrap()
}

pub(super) fn done(response: &[u8], retention: Duration) -> Completion<'_> {
    Completion {
        response: Some(response),
        is_error: false,
        retention,
        key_retention: Duration::ZERO,
    }
}

pub(super) async fn claim(store: &dyn Store, key: &Key, lease: Duration) -> Claim {
    match store.claim(ClaimRequest::new(key, lease)).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// The harness's store, the key `a`, and a claim on it for `lease`.
async fn claimed(h: &impl Harness, lease: Duration) -> (std::sync::Arc<dyn Store>, Key, Claim) {
    let s = h.store();
    let k = key("a");
    let c = claim(&*s, &k, lease).await;
    (s, k, c)
}

pub(super) async fn replayed(store: &dyn Store, key: &Key) -> StoredResult {
    match store.claim(ClaimRequest::new(key, long())).await.unwrap() {
        ClaimOutcome::Completed(c) => c,
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// `key` replays `response`.
async fn assert_replays(store: &dyn Store, key: &Key, response: &[u8]) {
    assert_eq!(
        replayed(store, key).await.response.as_deref(),
        Some(response)
    );
}

/// A live claim holds `key`: a start is refused.
async fn assert_locked(store: &dyn Store, key: &Key) {
    let start = store.claim(ClaimRequest::new(key, long())).await.unwrap();
    assert!(matches!(start, ClaimOutcome::Locked { .. }), "{start:?}");
}

/// Bad input was refused as such.
#[track_caller]
fn assert_invalid<T: std::fmt::Debug>(result: Result<T, Error>) {
    assert!(matches!(result, Err(Error::InvalidConfig(_))), "{result:?}");
}

/// A fenced operation was refused: the claim no longer owns its record.
#[track_caller]
fn assert_lease_lost(result: Result<(), Error>) {
    assert!(matches!(result, Err(Error::LeaseLost)), "{result:?}");
}

/// Reads five keys, `keys` (sorted), through a paged listing `find` (given the last key of the
/// previous page, `None` for the first) two a page, and checks that the pages hold them in order,
/// the third one short, and that a page after the last key is empty.
pub(super) async fn assert_pages<F, Fut>(keys: &[Key], find: F)
where
    F: Fn(Option<Key>) -> Fut,
    Fut: std::future::Future<Output = Vec<Key>>,
{
    let first = find(None).await;
    let second = find(first.get(1).copied()).await;
    let third = find(second.get(1).copied()).await;
    let seen: Vec<Key> = first.iter().chain(&second).chain(&third).copied().collect();
    assert_eq!(seen, keys);
    assert_eq!(third.len(), 1, "the last page is short");
    assert!(find(keys.last().copied()).await.is_empty());
}

pub(super) async fn wait(d: Duration) {
    tokio::time::sleep(d).await;
}

/// A new key is started, and the claim names it.
pub async fn new_key_starts(h: impl Harness) {
    let (_, k, c) = claimed(&h, long()).await;
    assert_eq!(c.key(), &k);
}

/// **Atomic claim**: of 64 concurrent starts of one key exactly one is `Started`, the rest `Locked`.
pub async fn concurrent_starts_claim_once(h: impl Harness) {
    let s = h.store();
    let k = key("race");
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.claim(ClaimRequest::new(&k, long())).await.unwrap() })
        })
        .collect();
    let mut started = 0;
    for t in tasks {
        match t.await.unwrap() {
            ClaimOutcome::Claimed(_) => started += 1,
            ClaimOutcome::Locked { .. } => {}
            other => panic!("nothing completed or lapsed, yet got {other:?}"),
        }
    }
    assert_eq!(
        started, 1,
        "exactly one of 64 concurrent starts owns the key"
    );
}

/// A live claim locks its key; `retry_after` is bounded by the lease and not far below it.
pub async fn live_claim_locks(h: impl Harness) {
    let s = h.store();
    let k = key("a");
    claim(&*s, &k, long()).await;
    match s.claim(ClaimRequest::new(&k, long())).await.unwrap() {
        ClaimOutcome::Locked { retry_after } => {
            assert!(
                retry_after <= long(),
                "retry_after {retry_after:?} exceeds the lease"
            );
            assert!(
                retry_after > long() / 2,
                "retry_after {retry_after:?} is far below the lease"
            );
        }
        other => panic!("expected Locked, got {other:?}"),
    }
}

/// A completed record replays its response and error flag, every time.
pub async fn completed_replays(h: impl Harness) {
    let (s, k, c) = claimed(&h, long()).await;
    s.complete(
        &c,
        Completion {
            response: Some(b"receipt"),
            is_error: true,
            retention: long(),
            key_retention: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    for _ in 0..3 {
        let cached = replayed(&*s, &k).await;
        assert_eq!(cached.response.as_deref(), Some(&b"receipt"[..]));
        assert!(cached.is_error);
    }
}

/// A record completed without a response replays as such.
pub async fn completed_without_response_replays(h: impl Harness) {
    let (s, k, c) = claimed(&h, long()).await;
    s.complete(
        &c,
        Completion {
            response: None,
            is_error: false,
            retention: long(),
            key_retention: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    let cached = replayed(&*s, &k).await;
    assert_eq!(cached.response, None);
    assert!(!cached.is_error);
}

/// A different fingerprint is `KeyReused`, in progress or completed, and changes nothing.
pub async fn fingerprint_mismatch_is_key_reused(h: impl Harness) {
    let s = h.store();
    let k = key("a");
    let f1 = Fingerprint::of_bytes(b"deposit 5");
    let f2 = Fingerprint::of_bytes(b"deposit 6");
    let ClaimOutcome::Claimed(c) = s
        .claim(ClaimRequest::new(&k, long()).fingerprint(Some(&f1)))
        .await
        .unwrap()
    else {
        panic!("not started")
    };
    assert!(matches!(
        s.claim(ClaimRequest::new(&k, long()).fingerprint(Some(&f2)))
            .await,
        Err(Error::KeyReused)
    ));
    s.complete(&c, done(b"r", long())).await.unwrap();
    assert!(matches!(
        s.claim(ClaimRequest::new(&k, long()).fingerprint(Some(&f2)))
            .await,
        Err(Error::KeyReused)
    ));
    let rec = s.get(&k).await.unwrap().unwrap();
    assert_eq!(rec.fingerprint, Some(f1), "a refused start changes nothing");
    assert!(matches!(rec.state, RecordState::Completed(_)));
}

/// The same fingerprint, or none, replays.
pub async fn matching_or_absent_fingerprint_replays(h: impl Harness) {
    let s = h.store();
    let k = key("a");
    let f = Fingerprint::of_bytes(b"req");
    let ClaimOutcome::Claimed(c) = s
        .claim(ClaimRequest::new(&k, long()).fingerprint(Some(&f)))
        .await
        .unwrap()
    else {
        panic!("not started")
    };
    s.complete(&c, done(b"r", long())).await.unwrap();
    assert!(matches!(
        s.claim(ClaimRequest::new(&k, long()).fingerprint(Some(&f)))
            .await
            .unwrap(),
        ClaimOutcome::Completed(_)
    ));
    assert!(matches!(
        s.claim(ClaimRequest::new(&k, long())).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
}

/// **Lease is not retention**: a claim whose lease ended is taken over, with a new token.
pub async fn expired_lease_is_taken_over(h: impl Harness) {
    let (s, k, first) = claimed(&h, short()).await;
    wait(past_short()).await;
    let second = claim(&*s, &k, long()).await;
    assert_ne!(first.token(), second.token());
}

/// **Fencing**: a claim taken over can neither renew, complete nor abort, before or after the new owner completes.
pub async fn stale_claim_is_fenced(h: impl Harness) {
    let (s, k, stale) = claimed(&h, short()).await;
    wait(past_short()).await;
    let owner = claim(&*s, &k, long()).await;
    assert_lease_lost(s.renew(&stale, long()).await);
    assert_lease_lost(s.complete(&stale, done(b"stale", long())).await);
    assert_lease_lost(s.abort(&stale).await);
    s.complete(&owner, done(b"owner", long())).await.unwrap();
    assert_lease_lost(s.complete(&stale, done(b"stale", long())).await);
    assert_lease_lost(s.abort(&stale).await);
    assert_replays(&*s, &k, b"owner").await;
}

/// Tokens are unique across a key's whole history: an aborted claim stays fenced after the key is claimed again.
pub async fn token_is_unique_across_abort_and_reclaim(h: impl Harness) {
    let (s, k, old) = claimed(&h, long()).await;
    s.abort(&old).await.unwrap();
    let new = claim(&*s, &k, long()).await;
    assert_ne!(old.token(), new.token());
    assert_lease_lost(s.complete(&old, done(b"old", long())).await);
    assert_lease_lost(s.renew(&old, long()).await);
    assert_lease_lost(s.abort(&old).await);
    s.complete(&new, done(b"new", long())).await.unwrap();
    assert_replays(&*s, &k, b"new").await;
}

/// Abort deletes the record, so the key can be claimed again.
pub async fn abort_frees_key(h: impl Harness) {
    let (s, k, c) = claimed(&h, long()).await;
    s.abort(&c).await.unwrap();
    assert!(s.get(&k).await.unwrap().is_none());
    claim(&*s, &k, long()).await;
}

/// Renewing extends a lease past its first end.
pub async fn renew_extends_lease(h: impl Harness) {
    let (s, k, c) = claimed(&h, short()).await;
    s.renew(&c, long()).await.unwrap();
    wait(past_short()).await;
    assert_locked(&*s, &k).await;
    s.complete(&c, done(b"r", long())).await.unwrap();
}

/// A claim whose lease ended may still complete while nobody took the key over.
pub async fn complete_after_lease_end_without_takeover(h: impl Harness) {
    // Nobody else claimed the key, so the record still carries this token: completing is safe.
    let (s, k, c) = claimed(&h, short()).await;
    wait(past_short()).await;
    s.complete(&c, done(b"late", long())).await.unwrap();
    assert_replays(&*s, &k, b"late").await;
}

/// **A late holder still completes**: a claim whose lease ended three leases ago, with the store
/// pruned since (and, on a store that expires records by itself, past any grace of a lease or
/// two), completes while nobody took the key over, and its result replays. The pruner is for
/// space: it never deletes what a late holder could still complete.
pub async fn lapsed_holder_completes_while_nobody_took_over(h: impl Harness) {
    let (s, k, c) = claimed(&h, short()).await;
    wait(past_short() * 3).await;
    // Bounded: one record, pruned in one call if at all.
    for _ in 0..3 {
        if s.prune_expired(100).await.unwrap() == 0 {
            break;
        }
    }
    assert!(
        s.get(&k).await.unwrap().is_none(),
        "a lapsed claim reads as absent"
    );
    s.complete(&c, done(b"late", long())).await.unwrap();
    assert_replays(&*s, &k, b"late").await;
}

/// A completed record replays until its retention ends; then the key starts again.
pub async fn retention_ends_then_runs_again(h: impl Harness) {
    let (s, k, c) = claimed(&h, long()).await;
    s.complete(&c, done(b"r", short())).await.unwrap();
    replayed(&*s, &k).await;
    wait(past_short()).await;
    claim(&*s, &k, long()).await;
}

/// `prune_expired` deletes ended retentions, and nothing live; a claim whose lease ended (it
/// reads as absent) stays for its holder to complete.
pub async fn prune_deletes_only_expired(h: impl Harness) {
    let s = h.store();
    let live_done = claim(&*s, &key("done-long"), long()).await;
    s.complete(&live_done, done(b"r", long())).await.unwrap();
    claim(&*s, &key("lease-long"), long()).await;
    let mut short_done = Vec::new();
    for i in 0..4 {
        short_done.push(claim(&*s, &key(&format!("done-short-{i}")), long()).await);
        claim(&*s, &key(&format!("lease-short-{i}")), short()).await;
    }
    // The short retentions begin last, at once, so that on a slow server (or a loaded machine)
    // the prune below still comes before the first of them ends.
    let (a, b, c, d) = tokio::join!(
        s.complete(&short_done[0], done(b"r", short())),
        s.complete(&short_done[1], done(b"r", short())),
        s.complete(&short_done[2], done(b"r", short())),
        s.complete(&short_done[3], done(b"r", short())),
    );
    for completed in [a, b, c, d] {
        completed.unwrap();
    }
    assert_eq!(
        s.prune_expired(100).await.unwrap(),
        0,
        "nothing has expired yet"
    );
    wait(past_short()).await;
    // The ended retentions; not the lapsed claims, which their holders may still complete.
    let expected = if h.expires_by_itself() { 0 } else { 4 };
    assert_eq!(s.prune_expired(100).await.unwrap(), expected);
    assert_eq!(s.prune_expired(100).await.unwrap(), 0);
    for i in 0..4 {
        for name in [format!("done-short-{i}"), format!("lease-short-{i}")] {
            assert!(
                s.get(&key(&name)).await.unwrap().is_none(),
                "{name} expired"
            );
        }
    }
    assert!(s.get(&key("done-long")).await.unwrap().is_some());
    assert!(s.get(&key("lease-long")).await.unwrap().is_some());
    replayed(&*s, &key("done-long")).await;
}

/// `prune_expired(limit)` deletes at most `limit` records per call.
pub async fn prune_respects_limit(h: impl Harness) {
    let s = h.store();
    for i in 0..5 {
        let c = claim(&*s, &key(&format!("k{i}")), long()).await;
        s.complete(&c, done(b"r", short())).await.unwrap();
    }
    wait(past_short()).await;
    let counts: &[u64] = if h.expires_by_itself() {
        &[0]
    } else {
        &[2, 2, 1, 0]
    };
    for &count in counts {
        assert_eq!(s.prune_expired(2).await.unwrap(), count);
    }
    for i in 0..5 {
        assert!(s.get(&key(&format!("k{i}"))).await.unwrap().is_none());
    }
}

/// `get` reports live records with key, fingerprint and state; an expired one reads as absent.
pub async fn get_reports_live_records_only(h: impl Harness) {
    let s = h.store();
    let k = key("a");
    let f = Fingerprint::of_bytes(b"req");
    assert!(s.get(&k).await.unwrap().is_none());
    let ClaimOutcome::Claimed(c) = s
        .claim(ClaimRequest::new(&k, short()).fingerprint(Some(&f)))
        .await
        .unwrap()
    else {
        panic!("not started")
    };
    let rec = s.get(&k).await.unwrap().unwrap();
    assert_eq!(rec.key, k);
    assert_eq!(rec.fingerprint, Some(f));
    match rec.state {
        RecordState::InProgress { token, .. } => assert_eq!(token, c.token()),
        other => panic!("expected InProgress, got {other:?}"),
    }
    wait(past_short()).await;
    assert!(
        s.get(&k).await.unwrap().is_none(),
        "an expired lease reads as absent"
    );
    let c = claim(&*s, &k, long()).await;
    s.complete(&c, done(b"r", long())).await.unwrap();
    match s.get(&k).await.unwrap().unwrap().state {
        RecordState::Completed(cached) => assert_eq!(cached.response.as_deref(), Some(&b"r"[..])),
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// `evict` deletes a record, fencing the claim that was running on it.
pub async fn evict_fences_running_claim(h: impl Harness) {
    let (s, k, c) = claimed(&h, long()).await;
    assert!(s.evict(&k).await.unwrap());
    assert!(!s.evict(&k).await.unwrap());
    assert_lease_lost(s.complete(&c, done(b"r", long())).await);
    assert!(s.get(&k).await.unwrap().is_none());
}

/// **Bounded input**: a zero lease or retention is `InvalidConfig` and changes nothing.
pub async fn bad_durations_change_nothing(h: impl Harness) {
    let s = h.store();
    let k = key("a");
    assert_invalid(s.claim(ClaimRequest::new(&k, Duration::ZERO)).await);
    assert!(s.get(&k).await.unwrap().is_none());
    let c = claim(&*s, &k, long()).await;
    assert_invalid(s.complete(&c, done(b"r", Duration::ZERO)).await);
    assert_invalid(s.renew(&c, Duration::ZERO).await);
    assert!(matches!(
        s.get(&k).await.unwrap().unwrap().state,
        RecordState::InProgress { .. }
    ));
    s.complete(&c, done(b"r", long())).await.unwrap();
}

/// A completion retried after its first attempt committed (its answer lost on the way back)
/// learns that it landed: `Ok`, and the first result stands. A completed claim can still be
/// neither aborted nor renewed.
pub async fn complete_twice_keeps_the_first_result(h: impl Harness) {
    let (s, k, c) = claimed(&h, long()).await;
    s.complete(&c, done(b"first", long())).await.unwrap();
    s.complete(&c, done(b"second", short())).await.unwrap();
    assert_lease_lost(s.abort(&c).await);
    assert_lease_lost(s.renew(&c, long()).await);
    // The second completion's shorter retention did not replace the first one's either.
    wait(past_short()).await;
    assert_replays(&*s, &k, b"first").await;
    // Another claim's record is still fenced off: completing the old claim is a lost lease.
    assert!(s.evict(&k).await.unwrap());
    let next = claim(&*s, &k, long()).await;
    assert_lease_lost(s.complete(&c, done(b"stale", long())).await);
    s.complete(&next, done(b"next", long())).await.unwrap();
    assert_replays(&*s, &k, b"next").await;
}
