// Arguments the key is built from whole are left out of the default fingerprint, so a generic
// key type need not be `Serialize`: `key = id.as_ref()`, `key = format!(…)`. An argument whose
// field the key reads stays hashed.
use idem::{idempotent, Idempotency, MemoryStore};
use serde::Serialize;

/// A key type of the caller's own, not `Serialize`.
struct OrderId(String);

impl AsRef<str> for OrderId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[idempotent(key = id.as_ref(), scope = "ship", engine = engine)]
async fn ship<K: AsRef<str>>(engine: &Idempotency, id: K, cents: u64) -> Result<u64, idem::Error> {
    Ok(cents)
}

/// Not `Serialize`: both are written whole into the key.
struct Tenant(&'static str);

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

#[idempotent(key = format!("{tenant}-{}", n.to_string()), scope = "label", engine = engine)]
async fn label(engine: &Idempotency, tenant: Tenant, n: OrderNo, cents: u64) -> Result<u64, idem::Error> {
    Ok(cents)
}

struct OrderNo(u32);

impl std::fmt::Display for OrderNo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[derive(Serialize)]
struct Deposit {
    id: String,
    cents: u64,
}

/// `key = req.id`: the rest of `req` is the request, so `req` is hashed.
#[idempotent(key = req.id, scope = "deposit", engine = engine)]
async fn deposit(engine: &Idempotency, req: Deposit) -> Result<u64, idem::Error> {
    Ok(req.cents)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    assert_eq!(ship(&engine, OrderId("o-1".into()), 5).await.unwrap(), 5);
    assert_eq!(ship(&engine, String::from("o-1"), 5).await.unwrap(), 5);
    assert!(matches!(ship(&engine, "o-1", 6).await, Err(idem::Error::KeyReused)));

    assert_eq!(label(&engine, Tenant("acme"), OrderNo(1), 5).await.unwrap(), 5);
    assert!(matches!(
        label(&engine, Tenant("acme"), OrderNo(1), 6).await,
        Err(idem::Error::KeyReused)
    ));

    let req = |cents| Deposit { id: "d-1".into(), cents };
    assert_eq!(deposit(&engine, req(5)).await.unwrap(), 5);
    assert!(matches!(deposit(&engine, req(6)).await, Err(idem::Error::KeyReused)));
}
