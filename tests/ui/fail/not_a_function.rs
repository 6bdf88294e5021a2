use idem::idempotent;

#[idempotent(key = id, store = engine)]
struct Charge {
    id: String,
}

fn main() {}
