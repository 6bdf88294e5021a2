use idem::{idempotent, Idempotency};

#[idempotent(key = id, engine = idem, detach = "yes")]
async fn charge(idem: &Idempotency, id: &str) -> Result<u64, idem::Error> {
    let _ = (idem, id);
    Ok(1)
}

fn main() {}
