// `detach = true` with a borrowed argument that the body uses: the error is on that argument,
// names `detach` and says what to take instead. (A borrowed engine or key that only the
// attribute uses is fine: see ui/pass/detach.rs.)
use idem::{idempotent, Idempotency};

#[idempotent(key = id, engine = engine, detach = true)]
async fn charge(engine: Idempotency, id: String, note: &str) -> Result<String, idem::Error> {
    let _ = (engine, id);
    Ok(format!("charged: {note}"))
}

fn main() {}
