use idem::{idempotent, Idempotency};

#[idempotent(key = id, engine = engine, key = other)]
async fn charge(engine: &Idempotency, id: &str, other: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id, other);
    Ok(1)
}

fn main() {}
