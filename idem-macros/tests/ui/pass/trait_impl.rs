// An `async fn` in a trait implementation.
use idem::{idempotent, Idempotency, MemoryStore};

trait Handler {
    async fn handle(&self, message_id: &str) -> Result<u32, idem::Error>;
}

struct Consumer {
    idem: Idempotency,
    handled: std::sync::atomic::AtomicU32,
}

impl Handler for Consumer {
    #[idempotent(key = message_id, scope = "consume", engine = self.idem)]
    async fn handle(&self, message_id: &str) -> Result<u32, idem::Error> {
        Ok(self
            .handled
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let consumer = Consumer {
        idem: Idempotency::new(MemoryStore::new()),
        handled: Default::default(),
    };
    assert_eq!(consumer.handle("m-1").await.unwrap(), 1);
    assert_eq!(consumer.handle("m-1").await.unwrap(), 1);
    assert_eq!(consumer.handle("m-2").await.unwrap(), 2);
}
