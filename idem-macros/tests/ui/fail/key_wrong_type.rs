use idem::{idempotent, Idempotency};

struct RequestId(u64);

#[idempotent(key = id, engine = engine)]
async fn charge(engine: &Idempotency, id: RequestId) -> Result<u64, idem::Error> {
    let _ = engine;
    Ok(id.0)
}

fn main() {}
