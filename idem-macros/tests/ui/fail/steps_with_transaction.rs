use idem::{idempotent, SqliteStore, Transactional};
use sqlx::{Sqlite, Transaction};

#[idempotent(key = id, engine = idem, transaction = tx, steps = steps)]
async fn credit(
    idem: &Transactional<SqliteStore>,
    tx: &mut Transaction<'_, Sqlite>,
    id: &str,
) -> Result<u64, idem::Error> {
    let _ = (idem, tx, id);
    Ok(1)
}

fn main() {}
