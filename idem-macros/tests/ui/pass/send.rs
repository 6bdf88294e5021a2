// The attributed future is `Send` when the body is: it can be spawned on a multi-thread runtime.
use std::sync::Arc;

use idem::{idempotent, Idempotency, MemoryStore};

struct Service {
    idem: Idempotency,
}

impl Service {
    #[idempotent(key = id, scope = "work", engine = self.idem)]
    async fn work(self: Arc<Self>, id: String) -> Result<usize, idem::Error> {
        tokio::task::yield_now().await;
        Ok(id.len())
    }
}

fn assert_send<T: Send>(t: T) -> T {
    t
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let service = Arc::new(Service {
        idem: Idempotency::new(MemoryStore::new()),
    });
    let handles: Vec<_> = (0..8)
        .map(|i| tokio::spawn(assert_send(service.clone().work(format!("id-{}", i % 2)))))
        .collect();
    for handle in handles {
        assert_eq!(handle.await.unwrap().unwrap_or(4), 4);
    }
}
