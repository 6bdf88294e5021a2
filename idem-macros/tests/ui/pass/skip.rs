// `skip(…)` leaves arguments out of the default fingerprint, so they need not be `Serialize`:
// a reused key with a skipped argument changed replays, with a hashed one changed is refused.
use std::sync::atomic::{AtomicU32, Ordering};

use idem::{idempotent, Idempotency, MemoryStore};

/// Not `Serialize`: a handle the function uses, not part of the request.
struct Client {
    calls: AtomicU32,
}

#[idempotent(key = order_id, engine = engine, skip(client, deadline_ms))]
async fn charge(
    engine: &Idempotency,
    client: &Client,
    order_id: &str,
    cents: u64,
    deadline_ms: u64,
) -> Result<u64, idem::Error> {
    client.calls.fetch_add(1, Ordering::SeqCst);
    let _ = deadline_ms;
    Ok(cents)
}

/// Every argument left but the skipped one: no fingerprint, a reused key replays.
#[idempotent(key = id, engine = engine, skip(r#client))]
async fn ping(engine: &Idempotency, id: &str, client: Client) -> Result<u32, idem::Error> {
    Ok(client.calls.load(Ordering::SeqCst))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    let client = Client { calls: AtomicU32::new(0) };
    assert_eq!(charge(&engine, &client, "o-1", 100, 1_000).await.unwrap(), 100);
    assert_eq!(charge(&engine, &client, "o-1", 100, 2_000).await.unwrap(), 100);
    assert!(matches!(
        charge(&engine, &client, "o-1", 999, 1_000).await,
        Err(idem::Error::KeyReused)
    ));
    assert_eq!(client.calls.load(Ordering::SeqCst), 1);

    let client = || Client { calls: AtomicU32::new(7) };
    assert_eq!(ping(&engine, "p-1", client()).await.unwrap(), 7);
    assert_eq!(ping(&engine, "p-1", Client { calls: AtomicU32::new(9) }).await.unwrap(), 7);
}
