use idem::idempotent;

#[idempotent(key = id, scope = "charge")]
async fn charge(id: &str) -> Result<u64, idem::Error> {
    let _ = id;
    Ok(1)
}

fn main() {}
