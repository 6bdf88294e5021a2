// Keys of other types: integers, UUIDs, `&str`, `String`, and an `Option` of a reference.
use idem::{idempotent, Idempotency, MemoryStore};
use uuid::Uuid;

#[idempotent(key = message_id, engine = engine)]
async fn by_number(engine: &Idempotency, message_id: u64) -> Result<u64, idem::Error> {
    Ok(message_id * 2)
}

#[idempotent(key = event_id, engine = engine)]
async fn by_uuid(engine: &Idempotency, event_id: Uuid) -> Result<String, idem::Error> {
    Ok(event_id.to_string())
}

#[idempotent(key = header.as_deref(), scope = "by_header", engine = engine)]
async fn by_header(engine: &Idempotency, header: Option<String>) -> Result<bool, idem::Error> {
    Ok(header.is_some())
}

// Runs once whatever the value: `fingerprint = ()` keeps the value out of the fingerprint.
#[idempotent(key = "constant", scope = "once", engine = engine, fingerprint = ())]
async fn once(engine: &Idempotency, value: i32) -> Result<i32, idem::Error> {
    Ok(value)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    assert_eq!(by_number(&engine, 21).await.unwrap(), 42);
    let id = Uuid::new_v4();
    assert_eq!(by_uuid(&engine, id).await.unwrap(), id.to_string());
    assert!(by_header(&engine, Some("h-1".into())).await.unwrap());
    assert!(!by_header(&engine, None).await.unwrap());
    assert_eq!(once(&engine, 1).await.unwrap(), 1);
    assert_eq!(once(&engine, 2).await.unwrap(), 1);
    // The number key is stored under its decimal text.
    let scope = concat!(module_path!(), "::by_number");
    let key = idem::Key::derive(scope, "", "21").unwrap();
    assert!(engine.store().get(&key).await.unwrap().is_some());
}
