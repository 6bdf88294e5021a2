// What does not go with `transaction`, and what `transaction` must name: one function a mistake,
// each reported on its own.
use idem::{idempotent, SqliteStore, Transactional};

type Engine = Transactional<SqliteStore>;
type Tx<'c> = sqlx::Transaction<'c, sqlx::Sqlite>;

#[idempotent(key = id, engine = idem, transaction = tx, detach = true)]
async fn detached(idem: &Engine, tx: &mut Tx<'_>, id: &str) -> Result<u64, idem::Error> {
    let _ = (idem, tx, id);
    Ok(1)
}

#[idempotent(key = id, engine = idem, transaction = &mut *tx)]
async fn not_a_name(idem: &Engine, tx: &mut Tx<'_>, id: &str) -> Result<u64, idem::Error> {
    let _ = (idem, tx, id);
    Ok(1)
}

#[idempotent(key = id, engine = idem, transaction = txn)]
async fn unknown(idem: &Engine, tx: &mut Tx<'_>, id: &str) -> Result<u64, idem::Error> {
    let _ = (idem, tx, id);
    Ok(1)
}

#[idempotent(key = id, engine = idem, transaction = tx, lease = "10s", retention = "1h")]
async fn leased(idem: &Engine, tx: &mut Tx<'_>, id: &str) -> Result<u64, idem::Error> {
    let _ = (idem, tx, id);
    Ok(1)
}

#[idempotent(key = id, engine = idem, transaction = tx, on_lapse = uncertain)]
async fn uncertain(idem: &Engine, tx: &mut Tx<'_>, id: &str) -> Result<u64, idem::Error> {
    let _ = (idem, tx, id);
    Ok(1)
}

#[idempotent(
    key = id,
    engine = idem,
    transaction = tx,
    on_locked = idem::OnLocked::Wait { timeout: std::time::Duration::from_secs(5) },
)]
async fn waiting(idem: &Engine, tx: &mut Tx<'_>, id: &str) -> Result<u64, idem::Error> {
    let _ = (idem, tx, id);
    Ok(1)
}

fn main() {}
