// An `Option` key: `None` runs every time, `Some` deduplicates.
use idem::{idempotent, Idempotency, MemoryStore};

// `runs` counts the calls; it is not part of the request, so there is no fingerprint.
#[idempotent(key = key, scope = "count", engine = engine, fingerprint = ())]
async fn count(
    engine: &Idempotency,
    key: Option<String>,
    runs: &std::cell::Cell<u32>,
) -> Result<u32, idem::Error> {
    runs.set(runs.get() + 1);
    Ok(runs.get())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = std::cell::Cell::new(0);
    assert_eq!(count(&engine, None, &runs).await.unwrap(), 1);
    assert_eq!(count(&engine, None, &runs).await.unwrap(), 2);
    assert_eq!(count(&engine, Some("k".into()), &runs).await.unwrap(), 3);
    assert_eq!(count(&engine, Some("k".into()), &runs).await.unwrap(), 3);
    assert_eq!(runs.get(), 3);
}
