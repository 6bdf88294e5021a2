use idem::{idempotent, Idempotency};

#[idempotent(key = id, store = engine)]
async fn charge(engine: &Idempotency, id: &str) {
    let _ = (engine, id);
}

fn main() {}
