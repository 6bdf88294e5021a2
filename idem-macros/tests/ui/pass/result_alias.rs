// A `Result` alias, `?` and an early `return` in the body behave as in the original function.
use idem::{idempotent, Idempotency, MemoryStore};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error("bad number: {0}")]
    Parse(#[from] std::num::ParseIntError),
}

type Result<T> = std::result::Result<T, AppError>;

#[idempotent(key = id, scope = "parse", engine = engine)]
async fn parse(engine: &Idempotency, id: &str, text: &str) -> Result<u32> {
    if text.is_empty() {
        return Ok(0);
    }
    let n: u32 = text.parse()?;
    Ok(n)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let engine = Idempotency::new(MemoryStore::new());
    assert_eq!(parse(&engine, "a", "").await.unwrap(), 0);
    assert!(matches!(
        parse(&engine, "b", "x").await,
        Err(AppError::Parse(_))
    ));
    // The failure was not stored: the same key runs again.
    assert_eq!(parse(&engine, "b", "7").await.unwrap(), 7);
    assert_eq!(parse(&engine, "b", "7").await.unwrap(), 7);
}
