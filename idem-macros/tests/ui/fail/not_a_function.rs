use idem::idempotent;

#[idempotent(key = id, engine = engine)]
struct Charge {
    id: String,
}

fn main() {}
