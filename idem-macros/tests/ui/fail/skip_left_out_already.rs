// `skip` names only arguments the default fingerprint would hash: the receiver, the engine's
// argument, the key's, the caller's and the transaction are left out already, each reported
// with the reason.
use idem::{idempotent, Idempotency};

struct State {
    idem: Idempotency,
}

impl State {
    #[idempotent(key = id, engine = self.idem, skip(self))]
    async fn receiver(&self, id: &str) -> Result<u64, idem::Error> {
        let _ = id;
        Ok(1)
    }
}

#[idempotent(key = id.as_ref(), caller = tenant, engine = state.idem, skip(state, id, tenant))]
async fn arguments(state: &State, tenant: &str, id: String) -> Result<u64, idem::Error> {
    let _ = (state, tenant, id);
    Ok(1)
}

type Tx<'c> = sqlx::Transaction<'c, sqlx::Sqlite>;

#[idempotent(key = id, engine = idem, transaction = tx, skip(tx))]
async fn transactional(
    idem: &idem::Transactional<idem::SqliteStore>,
    tx: &mut Tx<'_>,
    id: &str,
) -> Result<u64, idem::Error> {
    let _ = (idem, tx, id);
    Ok(1)
}

fn main() {}
