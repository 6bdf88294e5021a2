//! An AWS Lambda function consuming an SQS queue of orders, each charged once however often SQS
//! and Lambda deliver it (docs/consumers.md). Build it for Lambda with cargo-lambda
//! (`cargo lambda build --release --example lambda_sqs --features lambda`) and turn on
//! `ReportBatchItemFailures` in the event source mapping.
//!
//! The idempotency store is named by `IDEM_STORE_URL` (any store URL this build has a feature
//! for: `dynamodb+https://dynamodb.eu-west-1.amazonaws.com` with `dynamodb`, a PostgreSQL URL
//! with `postgres`; `sqlite:///tmp/idem.db`, the default, keeps records only as long as the
//! execution environment). Orders are keyed by their `order_id`, so a producer's duplicate send
//! is caught as well as a redelivery.

use idem::consumer::lambda::aws_lambda_events::event::sqs::{
    SqsBatchResponse, SqsEvent, SqsMessage,
};
use idem::consumer::lambda::{lambda_runtime, Lambda};
use idem::consumer::Consumer;
use idem::store::url::{ConnectOptions, StoreUrl};
use idem::Idempotency;
use lambda_runtime::{service_fn, LambdaEvent};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Order {
    order_id: String,
    cents: u64,
}

#[derive(Serialize, Deserialize)]
struct Charge {
    order_id: String,
    cents: u64,
}

/// The effect: charge the order (here, a log line; a payment provider in a real function,
/// given the order id as its own idempotency key).
async fn charge(message: SqsMessage) -> Result<Charge, String> {
    let order: Order = serde_json::from_str(message.body.as_deref().unwrap_or_default())
        .map_err(|e| format!("not an order: {e}"))?;
    println!("charging {} cents for {}", order.cents, order.order_id);
    Ok(Charge {
        order_id: order.order_id,
        cents: order.cents,
    })
}

/// The order id of a message, its key; a body that is not an order has none (and fails in
/// `charge`, so it goes back and, after `maxReceiveCount`, to the dead-letter queue).
fn order_id(message: &SqsMessage) -> Option<String> {
    let order: Order = serde_json::from_str(message.body.as_deref()?).ok()?;
    Some(order.order_id)
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let url = std::env::var("IDEM_STORE_URL").unwrap_or_else(|_| "sqlite:///tmp/idem.db".into());
    let store = StoreUrl::parse(&url)?
        .connect(&ConnectOptions::new())
        .await?
        .into_store();
    let lambda = Lambda::new(Consumer::new(Idempotency::from_arc(store), "charge")?);
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let lambda = lambda.clone();
        async move {
            let response: SqsBatchResponse = lambda.sqs_by(event, order_id, charge).await;
            Ok::<_, lambda_runtime::Error>(response)
        }
    }))
    .await
}
