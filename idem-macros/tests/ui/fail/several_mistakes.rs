use idem::{idempotent, Idempotency};

#[idempotent(engine = engine)]
fn charge(engine: &Idempotency, id: &str) -> u64 {
    let _ = (engine, id);
    1
}

fn main() {}
