//! Encryption at rest (docs/encryption.md): an [`EncryptedStore`] over the store under test
//! leaves no plaintext in what the store keeps, replays across a key rotation, and refuses,
//! typed and without running the work, a value under a missing key, a wrong key, or copied
//! onto another record.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::{
    Abandoned, AbandonedQuery, ClaimOutcome, ClaimRequest, EncryptedStore, EncryptionKey, Error,
    Idempotency, Key, KeyRing, RecordState, StepState, StepWrite, Store, StoreErrorKind,
    INPUT_STEP,
};

use super::store::{claim, done, key, long, past_short, short, wait};
use super::Harness;

/// The card number every plaintext of these rules carries: no byte string the store keeps may
/// contain it.
const CARD: &[u8] = b"4111111111111111";

fn ring(id: &str, byte: u8) -> KeyRing {
    KeyRing::new(id, EncryptionKey::from_bytes([byte; 32])).unwrap()
}

fn encrypted(s: &Arc<dyn Store>, keys: KeyRing) -> EncryptedStore<Arc<dyn Store>> {
    EncryptedStore::new(s.clone(), keys)
}

/// `what` the store keeps holds no copy of [`CARD`].
fn assert_no_card(what: &str, bytes: &[u8]) {
    assert!(
        !bytes.windows(CARD.len()).any(|w| w == CARD),
        "{what} keeps the plaintext: {:?}",
        String::from_utf8_lossy(bytes)
    );
}

fn plain(what: &str) -> Vec<u8> {
    let mut out = format!("{what}: card ").into_bytes();
    out.extend_from_slice(CARD);
    out
}

/// The kind of the store error `result` failed with.
fn refused_kind<T: std::fmt::Debug>(result: Result<T, Error>) -> StoreErrorKind {
    match result {
        Err(Error::Store(e)) => e.kind(),
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// An engine call of `k` over `store` fails with a store error of `kind` and does not run.
async fn engine_refuses(store: EncryptedStore<Arc<dyn Store>>, k: Key, kind: StoreErrorKind) {
    let engine = Idempotency::new(store);
    let runs = AtomicUsize::new(0);
    let got = engine
        .call(k)
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("ran again".to_owned())
        })
        .await;
    assert_eq!(refused_kind(got), kind);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the work ran again");
}

/// **No plaintext at rest.** Through an [`EncryptedStore`], an operation's input, a step's
/// result and the completed result reach the store as ciphertext: what the store hands back
/// (`begin_steps` after a takeover, `find_abandoned`, `claim`, `get`) holds none of them, while
/// the encrypted store reads each back as written.
pub async fn encrypted_store_keeps_no_plaintext(h: impl Harness) {
    let s = h.store();
    let e = encrypted(&s, ring("k1", 1));
    let k = key("encrypted");
    let (input, step, result) = (plain("input"), plain("step"), plain("result"));
    let c = claim(&e, &k, short()).await;
    if h.keeps_steps() {
        e.begin_steps(&c, long()).await.unwrap();
        let stored_input = Abandoned::encode_input("cards", &input);
        let writes = [
            (INPUT_STEP, crate::step::INPUT_POSITION, &stored_input[..]),
            ("charge", 0, &step[..]),
        ];
        for (name, position, bytes) in writes {
            let write = StepWrite::new(name, position, Some(bytes), long());
            e.write_step(&c, write).await.unwrap();
        }
        wait(past_short()).await;
        if h.finds_abandoned() {
            let raw = s.find_abandoned(AbandonedQuery::first(10)).await.unwrap();
            let found = raw.iter().find(|a| a.key == k).expect("abandoned");
            assert_eq!(found.scope, "cards", "the scope stays in clear");
            assert_no_card("find_abandoned's input", &found.input);
            let opened = e.find_abandoned(AbandonedQuery::first(10)).await.unwrap();
            assert!(opened.iter().any(|a| a.key == k && a.input == input));
        }
    } else {
        wait(past_short()).await;
    }
    let c = claim(&s, &k, long()).await;
    if h.keeps_steps() {
        let raw = s.begin_steps(&c, long()).await.unwrap();
        assert_eq!(raw.steps.len(), 2, "{raw:?}");
        for kept in &raw.steps {
            let StepState::Finished(bytes) = &kept.state else {
                panic!("{kept:?}");
            };
            assert_no_card(&kept.name, bytes);
        }
        let opened = e.begin_steps(&c, long()).await.unwrap();
        let results: Vec<_> = opened.steps.iter().map(|s| s.state.clone()).collect();
        assert!(results.contains(&StepState::Finished(step.clone())));
        let stored_input = Abandoned::encode_input("cards", &input);
        assert!(results.contains(&StepState::Finished(stored_input)));
    }
    e.complete(&c, done(&result, long())).await.unwrap();
    let ClaimOutcome::Completed(raw) = s.claim(ClaimRequest::new(&k, long())).await.unwrap() else {
        panic!("completed");
    };
    assert_no_card(
        "the completed result",
        raw.response.as_deref().unwrap_or_default(),
    );
    match s.get(&k).await.unwrap().map(|r| r.state) {
        Some(RecordState::Completed(raw)) => {
            assert_no_card("get's result", raw.response.as_deref().unwrap_or_default())
        }
        other => panic!("expected Completed, got {other:?}"),
    }
    let ClaimOutcome::Completed(opened) = e.claim(ClaimRequest::new(&k, long())).await.unwrap()
    else {
        panic!("completed");
    };
    assert_eq!(opened.response, Some(result.clone()));
    match e.get(&k).await.unwrap().map(|r| r.state) {
        Some(RecordState::Completed(opened)) => assert_eq!(opened.response, Some(result)),
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// **Rotation.** A record sealed under key `k1` replays after the current key becomes `k2`
/// (with `k1` kept to open), a new record names `k2`, and once `k1` is dropped the old record
/// is [`StoreErrorKind::KeyUnavailable`]: the engine does not run its work again, and the
/// record is unchanged.
pub async fn encrypted_store_rotates_keys(h: impl Harness) {
    let s = h.store();
    let old = key("sealed-under-k1");
    let first = encrypted(&s, ring("k1", 1));
    let c = claim(&first, &old, long()).await;
    first.complete(&c, done(b"under k1", long())).await.unwrap();

    let rotated = encrypted(
        &s,
        ring("k2", 2)
            .with_old("k1", EncryptionKey::from_bytes([1; 32]))
            .unwrap(),
    );
    let ClaimOutcome::Completed(kept) = rotated
        .claim(ClaimRequest::new(&old, long()))
        .await
        .unwrap()
    else {
        panic!("completed");
    };
    assert_eq!(kept.response.as_deref(), Some(&b"under k1"[..]));
    let new = key("sealed-under-k2");
    let c = claim(&rotated, &new, long()).await;
    rotated
        .complete(&c, done(b"under k2", long()))
        .await
        .unwrap();
    let ClaimOutcome::Completed(raw) = s.claim(ClaimRequest::new(&new, long())).await.unwrap()
    else {
        panic!("completed");
    };
    assert_eq!(
        raw.response.as_deref().map(|r| &r[1..4]),
        Some(&b"\x02k2"[..])
    );

    let dropped = encrypted(&s, ring("k2", 2));
    assert_eq!(
        refused_kind(dropped.claim(ClaimRequest::new(&old, long())).await),
        StoreErrorKind::KeyUnavailable
    );
    engine_refuses(dropped, old, StoreErrorKind::KeyUnavailable).await;
    assert!(matches!(
        s.get(&old).await.unwrap().map(|r| r.state),
        Some(RecordState::Completed(_))
    ));
}

/// **Moved or wrong, refused.** A sealed result copied onto another key's record, a step's
/// result copied onto another step of its record, and a record read under a different key
/// with the same id are all [`StoreErrorKind::Undecryptable`]; the engine runs none of them.
pub async fn encrypted_store_refuses_moved_and_wrong_keys(h: impl Harness) {
    let s = h.store();
    let e = encrypted(&s, ring("k1", 1));
    let from = key("sealed-here");
    let c = claim(&e, &from, long()).await;
    e.complete(&c, done(b"for this key only", long()))
        .await
        .unwrap();
    let ClaimOutcome::Completed(sealed) = s.claim(ClaimRequest::new(&from, long())).await.unwrap()
    else {
        panic!("completed");
    };
    let to = key("copied-here");
    let c = claim(&s, &to, long()).await;
    let copied = sealed.response.unwrap_or_default();
    s.complete(&c, done(&copied, long())).await.unwrap();
    assert_eq!(
        refused_kind(e.claim(ClaimRequest::new(&to, long())).await),
        StoreErrorKind::Undecryptable
    );
    engine_refuses(
        encrypted(&s, ring("k1", 1)),
        to,
        StoreErrorKind::Undecryptable,
    )
    .await;

    let wrong = encrypted(&s, ring("k1", 7));
    assert_eq!(
        refused_kind(wrong.get(&from).await),
        StoreErrorKind::Undecryptable
    );
    engine_refuses(wrong, from, StoreErrorKind::Undecryptable).await;

    if h.keeps_steps() {
        let k = key("steps-moved");
        let c = claim(&e, &k, long()).await;
        e.begin_steps(&c, long()).await.unwrap();
        let first = StepWrite::new("a", 0, Some(b"step a's"), long());
        e.write_step(&c, first).await.unwrap();
        let raw = s.begin_steps(&c, long()).await.unwrap();
        let Some(StepState::Finished(sealed)) = raw.steps.first().map(|s| s.state.clone()) else {
            panic!("{raw:?}");
        };
        s.write_step(&c, StepWrite::new("b", 1, Some(&sealed), long()))
            .await
            .unwrap();
        assert_eq!(
            refused_kind(e.begin_steps(&c, long()).await),
            StoreErrorKind::Undecryptable
        );
    }
}
