use idem::{idempotent, Idempotency};

type IoResult<T> = Result<T, std::io::Error>;

#[idempotent(key = id, scope = "read", engine = engine)]
async fn read(engine: &Idempotency, id: &str) -> IoResult<u64> {
    let _ = (engine, id);
    Ok(1)
}

fn main() {}
