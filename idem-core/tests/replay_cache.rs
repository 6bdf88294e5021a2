//! The replay cache: a hot key replays with no round trip, and the cache never changes what a
//! call returns.

use std::time::Duration;

use idem_core::{Error, Fingerprint, Idempotency, Key, ReplayCache};
use idem_sql::SqliteStore;

/// With the cache on, a completed key replays after the database is gone: zero round trips.
/// Another key, which needs the database, fails: the pool is really closed.
#[tokio::test]
async fn a_cached_replay_needs_no_database() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    let engine = Idempotency::builder(store.clone())
        .replay_cache(ReplayCache::new(100, 1 << 20))
        .build()
        .unwrap();
    let key = Key::derive("charge", "", "order-1").unwrap();
    let fp = Fingerprint::of_json(&("EUR", 4200)).unwrap();
    let first = engine
        .call(key)
        .fingerprint(fp)
        .run(async { Ok::<_, Error>(4200u64) })
        .await
        .unwrap();
    assert!(!first.is_replayed());
    // A key completed elsewhere is cached on its first replay from the store.
    let other = Key::derive("charge", "", "order-2").unwrap();
    let writer = Idempotency::new(store.clone());
    writer
        .call(other)
        .run(async { Ok::<_, Error>(99u64) })
        .await
        .unwrap();
    let read = engine
        .call(other)
        .run(async { Ok::<_, Error>(0u64) })
        .await
        .unwrap();
    assert!(read.is_replayed());

    store.pool().close().await;
    for _ in 0..3 {
        let again = engine
            .call(key)
            .fingerprint(fp)
            .run(async { Ok::<_, Error>(1u64) })
            .await
            .unwrap();
        assert!(again.is_replayed());
        assert_eq!(again.into_inner(), 4200);
        let again = engine
            .call(other)
            .run(async { Ok::<_, Error>(1u64) })
            .await
            .unwrap();
        assert_eq!(again.into_inner(), 99);
    }
    // The cache still refuses a reused key with another request.
    let reused = engine
        .call(key)
        .fingerprint(Fingerprint::of_json(&("EUR", 1)).unwrap())
        .run(async { Ok::<_, Error>(1u64) })
        .await;
    assert!(matches!(reused, Err(Error::KeyReused)));
    let uncached = Key::derive("charge", "", "order-3").unwrap();
    let down = engine
        .call(uncached)
        .run(async { Ok::<_, Error>(1u64) })
        .await;
    assert!(matches!(down, Err(Error::Store(_))), "{down:?}");
}

/// An entry leaves with its record's retention: the key then runs again (no tombstone here:
/// `key_retention` zero). The store and the cache read one clock (tokio's, paused).
#[tokio::test(start_paused = true)]
async fn a_cached_entry_ends_with_its_retention() {
    let clock = idem_core::TokioClock::new();
    let engine = Idempotency::builder(idem_core::MemoryStore::with_clock(clock.clone()))
        .retention(Duration::from_secs(2))
        .key_retention(Duration::ZERO)
        .replay_cache(ReplayCache::new(100, 1 << 20).clock(clock))
        .build()
        .unwrap();
    let key = Key::derive("charge", "", "order-1").unwrap();
    engine
        .call(key)
        .run(async { Ok::<_, Error>(1u64) })
        .await
        .unwrap();
    let replay = engine
        .call(key)
        .run(async { Ok::<_, Error>(2u64) })
        .await
        .unwrap();
    assert!(replay.is_replayed());
    tokio::time::advance(Duration::from_secs(2)).await;
    let fresh = engine
        .call(key)
        .run(async { Ok::<_, Error>(3u64) })
        .await
        .unwrap();
    assert!(!fresh.is_replayed());
    assert_eq!(fresh.into_inner(), 3);
}
