use idem::{idempotent, Idempotency};

#[idempotent(key = id, engine = engine, lease = 30)]
async fn charge(engine: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id);
    Ok(1)
}

fn main() {}
