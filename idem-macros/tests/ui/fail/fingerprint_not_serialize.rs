// Without `fingerprint = …`, the arguments but the engine and the key are hashed: one that is not
// `Serialize` is reported on it, and the error says how to name another fingerprint or none.
use idem::{idempotent, Idempotency};

struct Card {
    number: String,
}

#[idempotent(key = order_id, engine = engine)]
async fn charge(
    engine: &Idempotency,
    order_id: &str,
    card: Card,
    cents: u64,
) -> Result<u64, idem::Error> {
    let _ = card.number;
    Ok(cents)
}

fn main() {}
