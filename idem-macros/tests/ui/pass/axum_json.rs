// An axum handler answering `Json<T>` (and `(StatusCode, Json<T>)`): the idempotent function
// returns the value itself, `Result<T, E>` with `T: Serialize + DeserializeOwned`, and the
// handler wraps it. (axum's `Json<T>` is neither `Serialize` nor `Deserialize`, so it cannot be
// the stored value.)
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem::{idempotent, Idempotency, MemoryStore};
use serde::{Deserialize, Serialize};

// `Serialize` too: the request is the default fingerprint of `create_order`.
#[derive(Serialize, Deserialize)]
struct NewOrder {
    cents: u64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Order {
    order_no: u64,
    cents: u64,
}

#[derive(Debug, thiserror::Error)]
enum ApiError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error("missing Idempotency-Key header")]
    MissingKey,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::Idem(idem::Error::Locked { .. }) => StatusCode::CONFLICT,
            ApiError::Idem(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::MissingKey => StatusCode::BAD_REQUEST,
        };
        (status, self.to_string()).into_response()
    }
}

struct App {
    idem: Idempotency,
    orders: AtomicU64,
}

#[idempotent(key = request_id, scope = "create-order", engine = app.idem)]
async fn create_order(app: &App, request_id: &str, order: NewOrder) -> Result<Order, ApiError> {
    let order_no = app.orders.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(Order {
        order_no,
        cents: order.cents,
    })
}

/// The handler: the stored value is the `Order`; the response wraps it.
async fn post_order(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<Order>), ApiError> {
    let request_id = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .ok_or(ApiError::MissingKey)?;
    let order = create_order(&app, request_id, order).await?;
    Ok((StatusCode::CREATED, Json(order)))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let app = Arc::new(App {
        idem: Idempotency::new(MemoryStore::new()),
        orders: AtomicU64::new(0),
    });
    let _router: Router = Router::new()
        .route("/orders", post(post_order))
        .with_state(app.clone());

    let mut headers = HeaderMap::new();
    headers.insert("idempotency-key", "req-1".parse().unwrap());
    for _retry in 0..2 {
        let (status, Json(order)) = post_order(
            State(app.clone()),
            headers.clone(),
            Json(NewOrder { cents: 500 }),
        )
        .await
        .unwrap();
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(
            order,
            Order {
                order_no: 1,
                cents: 500
            }
        );
    }
    let missing = post_order(State(app), HeaderMap::new(), Json(NewOrder { cents: 1 })).await;
    assert_eq!(
        missing.unwrap_err().into_response().status(),
        StatusCode::BAD_REQUEST
    );
}
