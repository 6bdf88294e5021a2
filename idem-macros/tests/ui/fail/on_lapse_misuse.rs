use idem::{idempotent, Idempotency};

// Neither `uncertain` nor `release`.
#[idempotent(key = id, engine = engine, on_lapse = maybe)]
async fn charge(engine: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id);
    Ok(1)
}

// A string, not the word.
#[idempotent(key = id, engine = engine, on_lapse = "uncertain")]
async fn charge_quoted(engine: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id);
    Ok(1)
}

// Not a whole number that fits a u32.
#[idempotent(key = id, engine = engine, policy = "2")]
async fn versioned(engine: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id);
    Ok(1)
}

#[idempotent(key = id, engine = engine, policy = 4294967296)]
async fn too_far(engine: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, id);
    Ok(1)
}

fn main() {}
