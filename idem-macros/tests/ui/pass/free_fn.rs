// A free function: the engine comes in as an argument, the default scope is the function's path,
// and the default fingerprint is the amount (the arguments but the engine and the key).
use std::sync::atomic::{AtomicU32, Ordering};

use idem::{idempotent, Idempotency, MemoryStore};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = order_id, engine = engine)]
async fn charge(engine: &Idempotency, order_id: &str, cents: u64) -> Result<u64, idem::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(cents)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    assert_eq!(charge(&engine, "order-1", 500).await.unwrap(), 500);
    // Same key and amount: the first result is replayed and the body does not run again.
    assert_eq!(charge(&engine, "order-1", 500).await.unwrap(), 500);
    // Same key, another amount: another request, refused.
    assert!(matches!(
        charge(&engine, "order-1", 999).await,
        Err(idem::Error::KeyReused)
    ));
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    // The default scope is the function's path: the module path and the name.
    let scope = concat!(module_path!(), "::charge");
    let key = idem::Key::derive(scope, "", "order-1").unwrap();
    assert!(engine.store().get(&key).await.unwrap().is_some());
}
