// A `Result` alias of any name, generic or not, and a `Result` from another module: the return
// type is checked by what it implements, not by its name.
use idem::{idempotent, Idempotency, MemoryStore};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

type AppResult<T> = Result<T, AppError>;
type Count = Result<u64, AppError>;

mod fallible {
    pub type Outcome<T, E = crate::AppError> = std::result::Result<T, E>;
}

#[idempotent(key = id, scope = "generic_alias", engine = engine)]
async fn generic_alias(engine: &Idempotency, id: &str) -> AppResult<String> {
    Ok(id.to_uppercase())
}

#[idempotent(key = id, scope = "plain_alias", engine = engine)]
async fn plain_alias(engine: &Idempotency, id: u64) -> Count {
    Ok(id * 2)
}

#[idempotent(key = id, scope = "default_parameter", engine = engine)]
async fn default_parameter(engine: &Idempotency, id: &str) -> fallible::Outcome<usize> {
    Ok(id.len())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    assert_eq!(generic_alias(&engine, "a").await.unwrap(), "A");
    assert_eq!(plain_alias(&engine, 21).await.unwrap(), 42);
    assert_eq!(default_parameter(&engine, "abc").await.unwrap(), 3);
}
