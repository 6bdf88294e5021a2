// A name given twice in `skip(…)` is reported on the second one, and so is a second `skip`.
use idem::{idempotent, Idempotency};

#[idempotent(key = order_id, engine = engine, skip(client, trace, client))]
async fn charge(
    engine: &Idempotency,
    client: &str,
    trace: u64,
    order_id: &str,
) -> Result<u64, idem::Error> {
    let _ = (engine, client, trace, order_id);
    Ok(1)
}

#[idempotent(key = id, engine = engine, skip(client), skip(trace))]
async fn refund(engine: &Idempotency, id: &str, client: &str, trace: u64) -> Result<u64, idem::Error> {
    let _ = (engine, id, client, trace);
    Ok(2)
}

fn main() {}
