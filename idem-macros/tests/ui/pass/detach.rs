//! `detach = true` on a free function taking owned arguments, on one whose borrowed arguments
//! only the attribute uses (the engine and the key are read before the body starts), and on a
//! method on `Arc<Self>`.
use std::sync::Arc;

use idem::{idempotent, Idempotency, MemoryStore};

#[idempotent(key = id, engine = idem, detach = true)]
async fn charge(idem: Idempotency, id: String, cents: u64) -> Result<u64, idem::Error> {
    Ok(cents)
}

#[idempotent(key = id, engine = idem, detach = true)]
async fn refund(idem: &Idempotency, id: &str, cents: u64) -> Result<u64, idem::Error> {
    Ok(cents)
}

struct Shop {
    idem: Idempotency,
}

impl Shop {
    #[idempotent(key = id, engine = self.idem, detach = true)]
    async fn order(self: Arc<Self>, id: String) -> Result<String, idem::Error> {
        Ok(format!("order {id}"))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::new(MemoryStore::new());
    assert_eq!(charge(idem.clone(), "c-1".into(), 5).await.unwrap(), 5);
    assert_eq!(charge(idem.clone(), "c-1".into(), 5).await.unwrap(), 5);
    assert!(matches!(
        charge(idem.clone(), "c-1".into(), 9).await,
        Err(idem::Error::KeyReused)
    ));
    assert_eq!(refund(&idem, "r-1", 3).await.unwrap(), 3);
    let shop = Arc::new(Shop { idem });
    assert_eq!(shop.clone().order("o-1".into()).await.unwrap(), "order o-1");
}
