// Other receivers and stores: `&mut self`, `self` by value, an `Arc` engine, a generic function.
use std::sync::Arc;

use idem::{idempotent, Idempotency, MemoryStore};

struct Counter {
    idem: Arc<Idempotency>,
    count: u32,
}

impl Counter {
    #[idempotent(key = id, scope = "bump", engine = self.idem)]
    async fn bump(&mut self, id: &str) -> Result<u32, idem::Error> {
        self.count += 1;
        Ok(self.count)
    }

    #[idempotent(key = id, scope = "finish", engine = self.idem)]
    async fn finish(self, id: &str) -> Result<u32, idem::Error> {
        Ok(self.count)
    }
}

// Neither `K` nor `V` is bound `Serialize`, so the arguments cannot be the fingerprint: with
// `fingerprint = ()` a reused key replays whatever the value.
#[idempotent(key = id.as_ref(), scope = "generic", engine = engine, fingerprint = ())]
async fn generic<K: AsRef<str>, V>(
    engine: Arc<Idempotency>,
    id: K,
    value: V,
) -> Result<String, idem::Error>
where
    V: std::fmt::Display + Send,
{
    Ok(value.to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Arc::new(Idempotency::new(MemoryStore::new()));
    let mut counter = Counter {
        idem: engine.clone(),
        count: 0,
    };
    assert_eq!(counter.bump("b-1").await.unwrap(), 1);
    assert_eq!(counter.bump("b-1").await.unwrap(), 1);
    assert_eq!(counter.bump("b-2").await.unwrap(), 2);
    assert_eq!(counter.finish("f-1").await.unwrap(), 2);
    assert_eq!(generic(engine.clone(), "g", 5).await.unwrap(), "5");
    assert_eq!(generic(engine, String::from("g"), 6).await.unwrap(), "5");
}
