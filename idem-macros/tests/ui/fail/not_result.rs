use idem::{idempotent, Idempotency};

#[idempotent(key = id, engine = engine)]
async fn charge(engine: &Idempotency, id: &str) -> Option<u64> {
    let _ = (engine, id);
    Some(1)
}

fn main() {}
