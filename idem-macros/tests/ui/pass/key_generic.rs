// A function generic over its key, bounded by the public `idem::KeyPart`: every string form,
// integer and UUID is accepted, and the same text is the same key whatever its type.
use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{idempotent, Idempotency, KeyPart, MemoryStore};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = id, caller = tenant, scope = "ship", engine = engine)]
async fn ship<K: KeyPart, C: KeyPart + Send>(
    engine: &Idempotency,
    tenant: C,
    id: K,
) -> Result<u32, idem::Error> {
    Ok(RUNS.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    assert_eq!(ship(&engine, "acme", "o-1").await.unwrap(), 1);
    assert_eq!(ship(&engine, "acme", String::from("o-1")).await.unwrap(), 1);
    assert_eq!(
        ship(&engine, Arc::<str>::from("acme"), Box::<str>::from("o-1"))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        ship(&engine, "acme", Cow::Borrowed("o-1")).await.unwrap(),
        1
    );
    assert_eq!(
        ship(&engine, "acme", &&String::from("o-1")).await.unwrap(),
        1
    );
    assert_eq!(ship(&engine, "acme", 7_u64).await.unwrap(), 2);
    assert_eq!(ship(&engine, "acme", "7").await.unwrap(), 2);
    assert_eq!(ship(&engine, "acme", None::<&str>).await.unwrap(), 3);
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
}
