// `skip` takes argument names in parentheses, at least one.
use idem::{idempotent, Idempotency};

#[derive(serde::Serialize)]
struct Payment {
    id: String,
    cents: u64,
}

#[idempotent(key = payment.id, engine = engine, skip = payment)]
async fn equals(engine: &Idempotency, payment: Payment) -> Result<u64, idem::Error> {
    let _ = engine;
    Ok(payment.cents)
}

#[idempotent(key = payment.id, engine = engine, skip(payment.cents))]
async fn field(engine: &Idempotency, payment: Payment) -> Result<u64, idem::Error> {
    let _ = engine;
    Ok(payment.cents)
}

#[idempotent(key = payment.id, engine = engine, skip())]
async fn empty(engine: &Idempotency, payment: Payment) -> Result<u64, idem::Error> {
    let _ = engine;
    Ok(payment.cents)
}

fn main() {}
