// Methods of an `#[async_trait]` impl. `#[async_trait]` on the impl rewrites each method into a
// plain `fn` returning a boxed future before `#[idempotent]` on the method runs; the attribute
// takes that form as it is, with the arguments, `self` and the default scope as written.
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use idem::{idempotent, Idempotency, MemoryStore};

#[derive(Debug, thiserror::Error)]
enum HandleError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error("empty message")]
    Empty,
}

#[async_trait]
trait Handler {
    async fn handle(&self, message_id: &str, body: String) -> Result<u32, HandleError>;
    async fn handle_owned(&self, message_id: String) -> Result<u32, HandleError>;
}

struct Consumer {
    idem: Idempotency,
    handled: AtomicU32,
}

#[async_trait]
impl Handler for Consumer {
    #[idempotent(key = message_id, scope = "consume", engine = self.idem)]
    async fn handle(&self, message_id: &str, body: String) -> Result<u32, HandleError> {
        if body.is_empty() {
            return Err(HandleError::Empty);
        }
        Ok(self.handled.fetch_add(1, Ordering::SeqCst) + 1)
    }

    // The attribute may come first or after other attributes of the method; without `scope`
    // the scope is the method's path, `<Consumer as Handler>::handle_owned`.
    #[allow(clippy::needless_pass_by_value)]
    #[idempotent(key = message_id, engine = self.idem, retention = "1h")]
    async fn handle_owned(&self, message_id: String) -> Result<u32, HandleError> {
        let _moved = message_id; // the key was read before the body took the argument
        Ok(self.handled.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let consumer = Consumer {
        idem: Idempotency::new(MemoryStore::new()),
        handled: AtomicU32::new(0),
    };
    let call = consumer.handle("m-1", "hello".into());
    assert_send(&call);
    assert_eq!(call.await.unwrap(), 1);
    assert_eq!(consumer.handle("m-1", "hello".into()).await.unwrap(), 1);
    // An error is not stored: the same key runs again.
    assert!(matches!(
        consumer.handle("m-2", String::new()).await,
        Err(HandleError::Empty)
    ));
    assert_eq!(consumer.handle("m-2", "hi".into()).await.unwrap(), 2);

    assert_eq!(consumer.handle_owned("m-1".into()).await.unwrap(), 3);
    assert_eq!(consumer.handle_owned("m-1".into()).await.unwrap(), 3);
    let scope = format!(
        "<{0}::Consumer as {0}::Handler>::handle_owned",
        module_path!()
    );
    let key = idem::Key::derive(&scope, "", "m-1").unwrap();
    assert!(consumer.idem.store().get(&key).await.unwrap().is_some());
}
