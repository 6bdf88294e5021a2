use idem::{idempotent, Idempotency};

#[idempotent(key, engine = engine)]
async fn charge(engine: &Idempotency, key: &str) -> Result<u64, idem::Error> {
    let _ = (engine, key);
    Ok(1)
}

fn main() {}
