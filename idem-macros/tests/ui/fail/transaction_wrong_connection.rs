use idem::{idempotent, SqliteStore, Transactional};

#[idempotent(key = id, engine = idem, transaction = conn)]
async fn deposit(
    idem: &Transactional<SqliteStore>,
    conn: &mut String,
    id: &str,
) -> Result<u64, idem::Error> {
    let _ = (idem, conn, id);
    Ok(1)
}

fn main() {}
