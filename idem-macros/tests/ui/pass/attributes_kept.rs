// Doc comments, other attributes, visibility and inner attributes of the function are kept.
#![deny(missing_docs)]
//! A crate with a documented public idempotent function.

use idem::{idempotent, Idempotency};

/// Sends the welcome mail once per user.
#[idempotent(key = user_id, scope = "welcome", engine = engine, retention = "7d")]
#[must_use = "the mail may not have been sent"]
pub async fn send_welcome(engine: &Idempotency, user_id: u64) -> Result<(), idem::Error> {
    #![allow(unused_variables)]
    let unused = user_id;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(idem::MemoryStore::new());
    send_welcome(&engine, 1).await.unwrap();
    send_welcome(&engine, 1).await.unwrap();
}
