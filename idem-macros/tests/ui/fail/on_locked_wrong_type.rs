use std::time::Duration;

use idem::{idempotent, Idempotency};

#[idempotent(key = id, engine = engine, on_locked = Duration::from_secs(5))]
async fn charge(engine: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id);
    Ok(1)
}

fn main() {}
