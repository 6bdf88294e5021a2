//! A stored result carries a checksum: a byte flipped in the database (a damaged page, a bad
//! disk) makes the replay a typed `Corrupt` store error, never the replay of another value. And
//! a completion reads the clock once: without a tombstone its key ends exactly when its result.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

use std::sync::Arc;

use idem_core::{Error, Idempotency, Key, Store, StoreErrorKind};
use idem_sql::SqliteStore;

/// Stores a result, flips one byte of every stored response with `flip`, and replays.
async fn flipped_byte_is_a_typed_error(
    store: Arc<dyn Store>,
    flip: impl std::future::Future<Output = ()>,
) {
    let engine = Idempotency::from_arc(store);
    let k = Key::derive("stored-results", "", "k1").unwrap();
    let first = engine
        .call(k)
        .run(async { Ok::<_, Error>(4200u64) })
        .await
        .unwrap();
    assert!(!first.is_replayed());
    flip.await;
    let replay = engine.call(k).run(async { Ok::<_, Error>(9999u64) }).await;
    match replay {
        Err(Error::Store(e)) => {
            assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
            assert!(e.to_string().contains("damaged"), "{e}");
        }
        other => panic!("a damaged record replayed as {other:?}"),
    }
}

#[tokio::test]
async fn sqlite_flipped_byte_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    let pool = store.pool().clone();
    // The last byte of the payload: the JSON "4200" becomes "4201".
    let flip = async move {
        sqlx::query(
            "UPDATE idem_records SET response = substr(response, 1, length(response) - 1) || x'31'",
        )
        .execute(&pool)
        .await
        .unwrap();
    };
    flipped_byte_is_a_typed_error(Arc::new(store), flip).await;
}

#[tokio::test]
async fn postgres_flipped_byte_is_a_typed_error() {
    let Some(url) = idem_test_support::postgres::pg_url("postgres_flipped_byte_is_a_typed_error")
    else {
        return;
    };
    let store = idem_test_support::postgres::fresh_store(&url, |b| b).await;
    let pool = store.pool().clone();
    let t = store.table().to_owned();
    let flip = async move {
        sqlx::query(&format!(
            "UPDATE \"{t}\" SET response = set_byte(response, length(response) - 1, 49)"
        ))
        .execute(&pool)
        .await
        .unwrap();
    };
    flipped_byte_is_a_typed_error(Arc::new(store.clone()), flip).await;
    idem_test_support::postgres::drop_store_tables(&store).await;
}

/// Whether a completion with no tombstone (`key_retention` zero) ends its key exactly when its
/// result (`read`: whether the row has a result's end, and whether it equals the key's end, as
/// the database compares them). A completion that read the clock twice would leave the key a
/// moment longer: a tombstone of a few microseconds, and an entry in the table's index of
/// tombstones, for every key.
async fn completed_without_tombstone(
    store: Arc<dyn Store>,
    read: impl std::future::Future<Output = (bool, bool)>,
) {
    let engine = Idempotency::builder_from_arc(store)
        .key_retention(std::time::Duration::ZERO)
        .build()
        .unwrap();
    let k = Key::derive("stored-results", "", "one-instant").unwrap();
    let first = engine
        .call(k)
        .run(async { Ok::<_, Error>(7u64) })
        .await
        .unwrap();
    assert!(!first.is_replayed());
    let (set, equal) = read.await;
    assert!(set, "the completed row has no result_until");
    assert!(
        equal,
        "the key outlives its result: the completion read the clock twice"
    );
}

#[tokio::test]
async fn sqlite_a_completion_ends_its_key_exactly_when_its_result() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    let pool = store.pool().clone();
    let read = async move {
        sqlx::query_as::<_, (bool, bool)>(
            "SELECT result_until IS NOT NULL, result_until = expires_at FROM idem_records \
             WHERE state = 1",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    completed_without_tombstone(Arc::new(store), read).await;
}

#[tokio::test]
async fn postgres_a_completion_ends_its_key_exactly_when_its_result() {
    let Some(url) = idem_test_support::postgres::pg_url(
        "postgres_a_completion_ends_its_key_exactly_when_its_result",
    ) else {
        return;
    };
    let store = idem_test_support::postgres::fresh_store(&url, |b| b).await;
    let pool = store.pool().clone();
    let t = store.table().to_owned();
    let read = async move {
        sqlx::query_as::<_, (bool, bool)>(&format!(
            "SELECT result_until IS NOT NULL, result_until = expires_at FROM \"{t}\" \
             WHERE state = 1"
        ))
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    completed_without_tombstone(Arc::new(store.clone()), read).await;
    idem_test_support::postgres::drop_store_tables(&store).await;
}
