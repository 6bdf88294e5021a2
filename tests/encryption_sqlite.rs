//! Encryption at rest on disk: an engine over an `EncryptedStore` around SQLite stores a
//! result, an operation's input and its steps' results that all carry a card number, and not
//! one byte of the database's files (the main file and the write-ahead log, read after the pool
//! is closed and after every write is on disk) holds it; the operation replays it.
#![cfg(all(feature = "sqlite", feature = "encryption"))]

use idem::{EncryptedStore, EncryptionKey, Error, Idempotency, Key, KeyRing, SqliteStore, Steps};

const CARD: &str = "4111111111111111";

async fn charge(steps: Steps, input: Vec<u8>) -> Result<String, Error> {
    let card = String::from_utf8_lossy(&input).into_owned();
    let auth: String = steps
        .run("authorize", || async {
            Ok::<_, Error>(format!("auth of {card}"))
        })
        .await?;
    steps
        .run("capture", || async {
            Ok::<_, Error>(format!("captured {auth}"))
        })
        .await
}

#[tokio::test]
async fn no_byte_of_the_database_files_holds_the_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::builder()
        .pruner(None)
        .open(dir.path().join("idem.db"))
        .await
        .unwrap();
    let keys = KeyRing::new("k1", EncryptionKey::from_bytes([5; 32])).unwrap();
    let engine = Idempotency::new(EncryptedStore::new(store.clone(), keys));
    let input = format!("card {CARD}").into_bytes();
    let key = Key::derive("payments", "shop-1", "order-1").unwrap();
    let first = engine
        .call(key)
        .run_steps_with("payments", input.clone(), |steps| {
            charge(steps, input.clone())
        })
        .await
        .unwrap();
    let plain = Key::derive("cards", "shop-1", "card-1").unwrap();
    engine
        .call(plain)
        .run(async { Ok::<_, Error>(CARD.to_owned()) })
        .await
        .unwrap();
    let again = engine
        .call(key)
        .run_steps_with("payments", Vec::new(), |steps| charge(steps, Vec::new()))
        .await
        .unwrap();
    assert!(again.is_replayed());
    assert_eq!(again.into_inner(), first.into_inner());
    assert!(first_contains_card(&engine, plain).await);

    // Everything the log held checkpointed into the database file, then every connection
    // closed. SQLite removes the `-wal` and `-shm` files as the last connection closes, on the
    // connection's own thread: a file listed here can be gone when it is read, and what it held
    // is in the database file by then.
    store.close().await.unwrap();
    let mut read = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let bytes = match std::fs::read(entry.unwrap().path()) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("reading a database file: {e}"),
        };
        read += bytes.len();
        assert!(
            !bytes.windows(CARD.len()).any(|w| w == CARD.as_bytes()),
            "a database file holds the card number"
        );
    }
    assert!(read > 4096, "the database files were read ({read} bytes)");
}

/// The card replays from the encrypted record.
async fn first_contains_card(engine: &Idempotency, key: Key) -> bool {
    let replayed = engine
        .call(key)
        .run(async { Ok::<_, Error>(String::new()) })
        .await
        .unwrap();
    replayed.is_replayed() && replayed.into_inner() == CARD
}
