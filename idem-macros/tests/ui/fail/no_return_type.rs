use idem::{idempotent, Idempotency};

#[idempotent(key = id, engine = engine)]
async fn charge(engine: &Idempotency, id: &str) {
    let _ = (engine, id);
}

fn main() {}
