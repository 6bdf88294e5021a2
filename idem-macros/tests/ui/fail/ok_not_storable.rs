// axum's `Json<T>` is not the stored value: the error is on the return type, and says what to do.
use axum::Json;
use idem::{idempotent, Idempotency};

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    cents: u64,
}

#[idempotent(key = id, scope = "charge", engine = engine)]
async fn charge(engine: &Idempotency, id: &str) -> Result<Json<Receipt>, idem::Error> {
    let _ = (engine, id);
    Ok(Json(Receipt { cents: 1 }))
}

fn main() {}
