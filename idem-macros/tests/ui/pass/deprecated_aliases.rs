// The old argument names `store` (now `engine`) and `ttl` (now `retention`) still work; they
// warn (see ui/fail/deprecated_aliases.rs), also when parameters bear the same names.
use idem::{idempotent, Idempotency, MemoryStore};

#[idempotent(key = id, scope = "old_names", store = store, ttl = "1h")]
async fn old_names(store: &Idempotency, id: &str, ttl: u32) -> Result<u32, idem::Error> {
    Ok(ttl)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    assert_eq!(old_names(&engine, "abc", 3).await.unwrap(), 3);
    assert_eq!(old_names(&engine, "abc", 3).await.unwrap(), 3);
}
