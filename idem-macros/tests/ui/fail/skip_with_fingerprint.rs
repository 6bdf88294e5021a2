// `skip` trims the default fingerprint; with `fingerprint = …` (or `()`) there is none to trim.
use idem::{idempotent, Idempotency};

#[idempotent(key = order_id, engine = engine, fingerprint = cents, skip(client))]
async fn charge(
    engine: &Idempotency,
    client: &str,
    order_id: &str,
    cents: u64,
) -> Result<u64, idem::Error> {
    let _ = (engine, client, order_id);
    Ok(cents)
}

#[idempotent(key = order_id, engine = engine, skip(client), fingerprint = ())]
async fn refund(engine: &Idempotency, client: &str, order_id: &str) -> Result<u64, idem::Error> {
    let _ = (engine, client, order_id);
    Ok(1)
}

fn main() {}
