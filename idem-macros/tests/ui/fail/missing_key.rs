use idem::{idempotent, Idempotency};

#[idempotent(scope = "charge", engine = engine)]
async fn charge(engine: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id);
    Ok(1)
}

fn main() {}
