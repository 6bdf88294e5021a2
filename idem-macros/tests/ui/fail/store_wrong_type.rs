use idem::{idempotent, MemoryStore};

#[idempotent(key = id, engine = store)]
async fn charge(store: &MemoryStore, id: &str) -> Result<u64, idem::Error> {
    let _ = (store, id);
    Ok(1)
}

fn main() {}
