use async_trait::async_trait;
use idem::{idempotent, SqliteStore, Transactional};
use sqlx::{Sqlite, Transaction};

#[async_trait]
trait Bank {
    async fn deposit(&self, tx: &mut Transaction<'_, Sqlite>, id: &str) -> Result<u64, idem::Error>;
}

struct Teller {
    idem: Transactional<SqliteStore>,
}

#[async_trait]
impl Bank for Teller {
    #[idempotent(key = id, scope = "deposit", engine = self.idem, transaction = tx)]
    async fn deposit(&self, tx: &mut Transaction<'_, Sqlite>, id: &str) -> Result<u64, idem::Error> {
        let _ = (tx, id);
        Ok(1)
    }
}

fn main() {}
