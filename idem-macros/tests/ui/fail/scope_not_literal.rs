use idem::{idempotent, Idempotency};

const SCOPE: &str = "charge";

#[idempotent(key = id, scope = SCOPE, engine = engine)]
async fn charge(engine: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id, SCOPE);
    Ok(1)
}

fn main() {}
