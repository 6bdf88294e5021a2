//! The memory store frees expired records by itself: memory stays bounded under steady load
//! without anyone calling `prune_expired`, and `prune_expired` finds expired records without
//! looking at live ones. Time is a [`ManualClock`], so every figure below is exact.

use std::time::Duration;

use idem_core::{Claim, Completion, Key, ManualClock, MemoryStore, Start, Store};

const LONG: Duration = Duration::from_secs(3600);
const RETENTION: Duration = Duration::from_secs(1);

/// Distinct keys without hashing, so building hundreds of thousands of them stays cheap.
fn key(i: u64) -> Key {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&i.to_be_bytes());
    Key::from_bytes(bytes)
}

fn done() -> Completion<'static> {
    Completion {
        response: Some(b"receipt"),
        is_error: false,
    }
}

async fn claim(store: &MemoryStore, key: &Key, lease: Duration) -> Claim {
    match store.start(key, None, lease).await.unwrap() {
        Start::Started(c) => c,
        other => panic!("expected Started, got {other:?}"),
    }
}

/// 200,000 keys, one per millisecond, each kept for one second: about 1,000 are live at any
/// time. The store holds about that many, however many keys have gone by (it held all 200,000
/// before it expired records by itself).
#[tokio::test]
async fn steady_load_stays_bounded() {
    const KEYS: u64 = 200_000;
    const LIVE: usize = 1_000;
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let mut peak = 0;
    for i in 0..KEYS {
        let c = claim(&store, &key(i), LONG).await;
        store.complete(&c, done(), RETENTION).await.unwrap();
        clock.advance(Duration::from_millis(1));
        peak = peak.max(store.len());
    }
    // Each call frees what expired before its own record is added, so the store never holds
    // more than the last second's keys.
    assert_eq!(peak, LIVE, "held {peak} records for {LIVE} live ones");
    // Only expired records went: the keys of the last second (less the one whose retention ends
    // right now) still replay, and the key before them runs again.
    let now_expiring = KEYS - LIVE as u64;
    for i in now_expiring + 1..KEYS {
        assert!(
            matches!(
                store.start(&key(i), None, LONG).await.unwrap(),
                Start::Completed(_)
            ),
            "key {i} is still retained"
        );
    }
    assert!(matches!(
        store.start(&key(now_expiring), None, LONG).await.unwrap(),
        Start::Started(_)
    ));
}

/// A burst of 100,000 keys whose retention then ends is freed by the calls that follow, a few
/// per call, with nobody calling `prune_expired`.
#[tokio::test]
async fn burst_is_freed_by_later_calls() {
    const BURST: u64 = 100_000;
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    for i in 0..BURST {
        let c = claim(&store, &key(i), LONG).await;
        store.complete(&c, done(), RETENTION).await.unwrap();
    }
    assert_eq!(store.len(), BURST as usize);
    clock.advance(RETENTION * 2);
    // Each new key is two calls (start, complete), and each call frees up to 8 expired
    // records: 16 per key, so 6,250 new keys free the whole burst.
    let after = BURST / 16;
    for i in BURST..BURST + after {
        let c = claim(&store, &key(i), LONG).await;
        store.complete(&c, done(), LONG).await.unwrap();
    }
    assert_eq!(store.len(), after as usize, "only the new keys are held");
    assert_eq!(store.prune_expired(u32::MAX).await.unwrap(), 0);
}

/// `prune_expired(100)` among 1,000,000 live records removes exactly the few expired ones and
/// leaves every live one. (That it looks at no live record beyond the first is counted in
/// `store::memory`'s unit tests; here it shows as a prune that takes microseconds, not the tens
/// of milliseconds a scan of the map took.)
#[tokio::test]
async fn prune_among_a_million_live_records_removes_only_the_expired() {
    const LIVE: u64 = 1_000_000;
    const EXPIRED: u64 = 5;
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    // The short ones first, then no time passes until all live ones exist, so no call before
    // the prune can free them on its own.
    for i in 0..EXPIRED {
        claim(&store, &key(i), Duration::from_millis(10)).await;
    }
    for i in EXPIRED..EXPIRED + LIVE {
        claim(&store, &key(i), LONG).await;
    }
    clock.advance(Duration::from_millis(20));
    assert_eq!(store.prune_expired(100).await.unwrap(), EXPIRED);
    assert_eq!(store.len(), LIVE as usize);
    assert_eq!(store.prune_expired(100).await.unwrap(), 0);
    for i in [0, EXPIRED - 1] {
        assert!(store.get(&key(i)).await.unwrap().is_none());
    }
    for i in [EXPIRED, EXPIRED + LIVE / 2, EXPIRED + LIVE - 1] {
        assert!(store.get(&key(i)).await.unwrap().is_some());
    }
}
