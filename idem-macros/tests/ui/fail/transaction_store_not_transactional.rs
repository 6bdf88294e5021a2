use idem::{idempotent, Idempotency};
use sqlx::{Sqlite, Transaction};

#[idempotent(key = id, engine = engine, transaction = tx)]
async fn deposit(
    engine: &Idempotency,
    tx: &mut Transaction<'_, Sqlite>,
    id: &str,
) -> Result<u64, idem::Error> {
    let _ = (engine, tx, id);
    Ok(1)
}

fn main() {}
