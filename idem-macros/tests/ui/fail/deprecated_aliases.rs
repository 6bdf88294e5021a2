#![deny(deprecated)]
use idem::{idempotent, Idempotency};

#[idempotent(key = id, store = engine, ttl = "24h")]
async fn charge(engine: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id);
    Ok(1)
}

fn main() {}
