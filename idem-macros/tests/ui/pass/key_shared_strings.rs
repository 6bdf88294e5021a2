// Keys and callers held as shared or boxed strings: `Arc<str>`, `Rc<str>`, `Box<str>`,
// `Cow<str>`, and an `Option` of one. Each derives the same key as the same text in a `&str`.
use std::borrow::Cow;
use std::rc::Rc;
use std::sync::Arc;

use idem::{idempotent, Idempotency, Key, MemoryStore};

#[idempotent(key = id, caller = tenant, scope = "arc", engine = engine)]
async fn by_arc(
    engine: &Idempotency,
    tenant: Arc<str>,
    id: Arc<str>,
) -> Result<String, idem::Error> {
    Ok(format!("{tenant}/{id}"))
}

#[idempotent(key = id, scope = "rc", engine = engine)]
async fn by_rc(engine: &Idempotency, id: Rc<str>) -> Result<usize, idem::Error> {
    Ok(id.len())
}

// Held in a struct, as a request type would hold them (`Serialize`: as the argument that `key`
// and `caller` are taken from, it is the default fingerprint).
#[derive(serde::Serialize)]
struct Request {
    tenant: Box<str>,
    id: Box<str>,
}

#[idempotent(key = req.id, caller = req.tenant, scope = "boxed", engine = engine)]
async fn by_box(engine: &Idempotency, req: &Request) -> Result<String, idem::Error> {
    Ok(format!("{}/{}", req.tenant, req.id))
}

// `runs` counts the calls; it is not part of the request, so there is no fingerprint.
#[idempotent(key = id, scope = "cow", engine = engine, fingerprint = ())]
async fn by_cow(
    engine: &Idempotency,
    id: Cow<'_, str>,
    runs: &std::cell::Cell<u32>,
) -> Result<u32, idem::Error> {
    runs.set(runs.get() + 1);
    Ok(runs.get())
}

#[idempotent(key = id, scope = "maybe", engine = engine, fingerprint = ())]
async fn maybe(
    engine: &Idempotency,
    id: Option<Arc<str>>,
    runs: &std::cell::Cell<u32>,
) -> Result<u32, idem::Error> {
    runs.set(runs.get() + 1);
    Ok(runs.get())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    let stored = |scope: &str, caller: &str, id: &str| {
        let key = Key::derive(scope, caller, id).unwrap();
        let store = engine.store();
        async move { store.get(&key).await.unwrap().is_some() }
    };

    let tenant: Arc<str> = Arc::from("acme");
    assert_eq!(
        by_arc(&engine, tenant.clone(), Arc::from("a-1"))
            .await
            .unwrap(),
        "acme/a-1"
    );
    assert!(stored("arc", "acme", "a-1").await);

    assert_eq!(by_rc(&engine, Rc::from("r-1")).await.unwrap(), 3);
    assert!(stored("rc", "", "r-1").await);

    let req = Request {
        tenant: "acme".into(),
        id: "b-1".into(),
    };
    assert_eq!(by_box(&engine, &req).await.unwrap(), "acme/b-1");
    assert!(stored("boxed", "acme", "b-1").await);

    // Borrowed or owned, a `Cow` keys by its text: the second call replays the first.
    let runs = std::cell::Cell::new(0);
    assert_eq!(
        by_cow(&engine, Cow::Borrowed("c-1"), &runs).await.unwrap(),
        1
    );
    assert_eq!(
        by_cow(&engine, Cow::Owned("c-1".into()), &runs)
            .await
            .unwrap(),
        1
    );
    assert_eq!(runs.get(), 1);
    assert!(stored("cow", "", "c-1").await);

    let runs = std::cell::Cell::new(0);
    assert_eq!(maybe(&engine, None, &runs).await.unwrap(), 1);
    assert_eq!(maybe(&engine, None, &runs).await.unwrap(), 2);
    assert_eq!(
        maybe(&engine, Some(Arc::from("m-1")), &runs).await.unwrap(),
        3
    );
    assert_eq!(
        maybe(&engine, Some(Arc::from("m-1")), &runs).await.unwrap(),
        3
    );
}
