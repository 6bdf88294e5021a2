// Every argument at once: caller, fingerprint, lease, retention and on_locked.
use std::time::Duration;

use idem::{idempotent, Idempotency, MemoryStore, OnLocked};
use serde::Serialize;

#[derive(Serialize)]
struct Transfer {
    id: String,
    from: String,
    to: String,
    cents: u64,
}

#[derive(Debug, thiserror::Error)]
enum TransferError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

#[idempotent(
    key = t.id,
    caller = user_id,
    scope = "transfer",
    engine = engine,
    fingerprint = t,
    lease = "10s",
    retention = "1h30m",
    on_locked = OnLocked::Wait { timeout: Duration::from_secs(5) },
)]
async fn transfer(
    engine: &Idempotency,
    user_id: u64,
    t: Transfer,
) -> Result<String, TransferError> {
    Ok(format!("{} -> {}: {}", t.from, t.to, t.cents))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    let t = |cents| Transfer {
        id: "t-1".into(),
        from: "a".into(),
        to: "b".into(),
        cents,
    };
    assert_eq!(transfer(&engine, 7, t(5)).await.unwrap(), "a -> b: 5");
    assert_eq!(transfer(&engine, 7, t(5)).await.unwrap(), "a -> b: 5");
    // Same key, other payload: the fingerprint differs.
    let reused = transfer(&engine, 7, t(6)).await;
    assert!(matches!(
        reused,
        Err(TransferError::Idem(idem::Error::KeyReused))
    ));
    // Another caller has its own keys.
    assert_eq!(transfer(&engine, 8, t(6)).await.unwrap(), "a -> b: 6");
}
