// The default fingerprint: the arguments but the engine (and what it is taken from), the key and
// the caller, bound by any pattern; `fingerprint = ()` leaves every argument out, so none need
// be `Serialize`.
use idem::{idempotent, Idempotency, MemoryStore};
use serde::Serialize;

/// Not `Serialize`: the engine is taken from it, so it is left out.
struct State {
    idem: Idempotency,
}

#[derive(Serialize)]
struct Line {
    sku: String,
    quantity: u32,
}

#[idempotent(key = order_id, caller = tenant, engine = state.idem)]
async fn order(
    state: &State,
    tenant: &str,
    order_id: &str,
    (first, second): (Line, Line),
    _: std::sync::Mutex<u8>,
) -> Result<u32, idem::Error> {
    Ok(first.quantity + second.quantity)
}

/// Not `Serialize`, and not hashed with `fingerprint = ()`.
struct Connection;

#[idempotent(key = id, engine = engine, fingerprint = ())]
async fn unchecked(
    engine: &Idempotency,
    id: &str,
    conn: Connection,
    cents: u64,
) -> Result<u64, idem::Error> {
    let Connection = conn;
    Ok(cents)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let state = State {
        idem: Idempotency::new(MemoryStore::new()),
    };
    let line = |quantity| Line {
        sku: "s-1".into(),
        quantity,
    };
    let lines = |a, b| (line(a), line(b));
    let mutex = || std::sync::Mutex::new(0);
    assert_eq!(order(&state, "acme", "o-1", lines(1, 2), mutex()).await.unwrap(), 3);
    assert_eq!(order(&state, "acme", "o-1", lines(1, 2), mutex()).await.unwrap(), 3);
    assert!(matches!(
        order(&state, "acme", "o-1", lines(1, 5), mutex()).await,
        Err(idem::Error::KeyReused)
    ));

    let engine = &state.idem;
    assert_eq!(unchecked(engine, "u-1", Connection, 5).await.unwrap(), 5);
    assert_eq!(unchecked(engine, "u-1", Connection, 9).await.unwrap(), 5);
}
