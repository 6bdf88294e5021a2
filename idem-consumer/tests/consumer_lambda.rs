//! Lambda event batches invoked as lambda_runtime invokes a handler: the event deserialized from
//! Lambda's JSON, a `LambdaEvent` with the invocation's deadline, a `service_fn` called through
//! tower, the response serialized back. Each test checks that the partial-failure response names
//! exactly the records to redeliver, and that invoking again with the same event applies nothing
//! twice. On SQLite.
#![cfg(feature = "lambda")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::dynamodb;
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use idem::{Idempotency, SqliteStore};
use idem_consumer::lambda::Lambda;
use idem_consumer::Consumer;
use lambda_runtime::tower::{Service, ServiceExt};
use lambda_runtime::{service_fn, Context, LambdaEvent};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// The business table, and a gate that holds "slow" orders.
#[derive(Clone)]
struct Shop {
    charges: idem_test_support::Tally,
    gate: Arc<Semaphore>,
    started: Arc<Semaphore>,
    /// Whether "fail" and "panic" orders still fail (a bug later fixed).
    broken: Arc<Mutex<bool>>,
}

impl Shop {
    fn new() -> Shop {
        Shop {
            charges: Default::default(),
            gate: Arc::new(Semaphore::new(0)),
            started: Arc::new(Semaphore::new(0)),
            broken: Arc::new(Mutex::new(true)),
        }
    }

    fn charged(&self, order: &str) -> u32 {
        self.charges.count(order)
    }

    /// Charges the order in `body` ({"order", "act"}) once per run.
    async fn charge(self, body: Value) -> Result<String, String> {
        let order = body["order"].as_str().unwrap_or_default().to_owned();
        let broken = *self.broken.lock().unwrap();
        self.started.add_permits(1);
        match body["act"].as_str() {
            Some("fail") if broken => return Err(format!("card of {order} declined for now")),
            Some("panic") if broken => panic!("bug charging {order}"),
            Some("slow") => self.gate.acquire().await.unwrap().forget(),
            _ => {}
        }
        self.charges.add(&order);
        Ok(format!("charged {order}"))
    }
}

async fn lambda() -> Lambda<idem::JsonCodec> {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    std::mem::forget(dir);
    Lambda::new(Consumer::new(Idempotency::new(store), "charge").unwrap())
}

/// A context as lambda_runtime builds it from the Runtime API's headers: `deadline` is the
/// invocation's deadline in milliseconds since the epoch.
fn context(left: Duration) -> Context {
    let mut context = Context::default();
    context.request_id = "req-1".into();
    let deadline = SystemTime::now() + left;
    context.deadline = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    context
}

/// One SQS record as Lambda sends it; `group` makes it a FIFO queue's.
fn sqs_record(id: &str, order: &str, act: &str, group: Option<&str>) -> Value {
    let mut attributes = json!({
        "ApproximateReceiveCount": "1",
        "SentTimestamp": "1523232000000",
        "SenderId": "123456789012",
        "ApproximateFirstReceiveTimestamp": "1523232000001"
    });
    let mut arn = "arn:aws:sqs:eu-west-1:123456789012:orders".to_owned();
    if let Some(group) = group {
        attributes["MessageGroupId"] = json!(group);
        attributes["MessageDeduplicationId"] = json!(id);
        arn.push_str(".fifo");
    }
    json!({
        "messageId": id,
        "receiptHandle": format!("handle-{id}"),
        "body": json!({"order": order, "act": act}).to_string(),
        "attributes": attributes,
        "messageAttributes": {},
        "md5OfBody": "7b270e59b47ff90a553787216d55d91d",
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": "eu-west-1"
    })
}

/// Invokes the SQS handler as lambda_runtime does, returning the failed message ids.
async fn invoke_sqs(
    lambda: &Lambda<idem::JsonCodec>,
    shop: &Shop,
    records: &[Value],
    left: Duration,
) -> Vec<String> {
    let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
    let mut service = service_fn(|event: LambdaEvent<SqsEvent>| {
        let (lambda, shop) = (lambda.clone(), shop.clone());
        async move {
            let handler = move |m: SqsMessage| {
                let body: Value =
                    serde_json::from_str(m.body.as_deref().unwrap_or("{}")).unwrap_or_default();
                shop.clone().charge(body)
            };
            Ok::<_, lambda_runtime::Error>(lambda.sqs(event, handler).await)
        }
    });
    let response = service
        .ready()
        .await
        .unwrap()
        .call(LambdaEvent::new(event, context(left)))
        .await
        .unwrap();
    let answer = serde_json::to_value(&response).unwrap();
    answer["batchItemFailures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_standard_reports_exactly_the_records_to_redeliver() {
    let (lambda, shop) = (lambda().await, Shop::new());
    let records = [
        sqs_record("m1", "o1", "ok", None),
        sqs_record("m2", "o2", "ok", None),
        sqs_record("m1", "o1", "ok", None), // SQS delivered m1 twice in one batch
        sqs_record("m4", "o4", "fail", None),
        sqs_record("m5", "o5", "panic", None),
    ];
    assert_eq!(
        invoke_sqs(&lambda, &shop, &records, MINUTE).await,
        ["m4", "m5"]
    );
    // Lambda redelivers the whole event (no ReportBatchItemFailures, or a retry): nothing twice.
    assert_eq!(
        invoke_sqs(&lambda, &shop, &records, MINUTE).await,
        ["m4", "m5"]
    );
    *shop.broken.lock().unwrap() = false;
    assert!(invoke_sqs(&lambda, &shop, &records, MINUTE)
        .await
        .is_empty());
    for order in ["o1", "o2", "o4", "o5"] {
        assert_eq!(shop.charged(order), 1, "{order}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_stops_each_group_at_its_first_failure() {
    let (lambda, shop) = (lambda().await, Shop::new());
    let records = [
        sqs_record("a1", "a1", "ok", Some("ga")),
        sqs_record("b1", "b1", "ok", Some("gb")),
        sqs_record("a2", "a2", "fail", Some("ga")),
        sqs_record("b2", "b2", "ok", Some("gb")),
        sqs_record("a3", "a3", "ok", Some("ga")),
        sqs_record("b2", "b2", "ok", Some("gb")), // a duplicate delivery
    ];
    assert_eq!(
        invoke_sqs(&lambda, &shop, &records, MINUTE).await,
        ["a2", "a3"]
    );
    assert_eq!(shop.charged("a3"), 0, "a3 ran after a2 failed in its group");
    *shop.broken.lock().unwrap() = false;
    // Lambda redelivers the group from a2 (and, retrying the event, the rest again).
    assert!(invoke_sqs(&lambda, &shop, &records, MINUTE)
        .await
        .is_empty());
    for order in ["a1", "a2", "a3", "b1", "b2"] {
        assert_eq!(shop.charged(order), 1, "{order}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_deadline_mid_batch_hands_back_what_did_not_finish() {
    let (lambda, shop) = (lambda().await, Shop::new());
    let lambda = lambda.margin(Duration::from_millis(500));
    let records = [
        sqs_record("f1", "f1", "ok", Some("g")),
        sqs_record("s2", "s2", "slow", Some("g")),
        sqs_record("f3", "f3", "ok", Some("g")),
    ];
    // 1.5 s left, 0.5 s kept back: the batch answers after 1 s with s2 still held.
    let failed = invoke_sqs(&lambda, &shop, &records, Duration::from_millis(1_500)).await;
    assert_eq!(failed, ["s2", "f3"]);
    assert_eq!((shop.charged("f1"), shop.charged("f3")), (1, 0));
    // The held handler goes on, stores its result, and the redelivery replays it.
    shop.gate.add_permits(1);
    let replayed = idem_test_support::eventually(|| {
        let (lambda, shop) = (lambda.clone(), shop.clone());
        let records = records.clone();
        async move {
            invoke_sqs(&lambda, &shop, &records, MINUTE)
                .await
                .is_empty()
        }
    })
    .await;
    assert!(replayed, "the redelivery never got through");
    for order in ["f1", "s2", "f3"] {
        assert_eq!(shop.charged(order), 1, "{order}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_with_no_time_left_runs_nothing_and_hands_everything_back() {
    let (lambda, shop) = (lambda().await, Shop::new());
    let records = [
        sqs_record("m1", "o1", "ok", None),
        sqs_record("m2", "o2", "ok", None),
    ];
    let failed = invoke_sqs(&lambda, &shop, &records, Duration::from_millis(200)).await;
    assert_eq!(failed, ["m1", "m2"]);
    assert_eq!(shop.charged("o1") + shop.charged("o2"), 0);
}

/// A Kinesis record as Lambda sends it.
fn kinesis_record(seq: &str, order: &str, act: &str) -> Value {
    // Base64, as Lambda sends it, by the events crate's own encoding.
    let mut data = aws_lambda_events::encodings::Base64Data::default();
    *data = json!({"order": order, "act": act}).to_string().into_bytes();
    let data = serde_json::to_value(data).unwrap();
    json!({
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": "p1",
            "sequenceNumber": seq,
            "data": data,
            "approximateArrivalTimestamp": 1545084650.987
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": format!("shardId-000000000006:{seq}"),
        "eventName": "aws:kinesis:record",
        "invokeIdentityArn": "arn:aws:iam::123456789012:role/lambda-role",
        "awsRegion": "eu-west-1",
        "eventSourceARN": "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"
    })
}

async fn invoke_kinesis(lambda: &Lambda<idem::JsonCodec>, shop: &Shop, records: &[Value]) -> Value {
    let event: KinesisEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
    let shop = shop.clone();
    let handler = move |r: aws_lambda_events::event::kinesis::KinesisEventRecord| {
        let body: Value = serde_json::from_slice(&r.kinesis.data.0).unwrap_or_default();
        shop.clone().charge(body)
    };
    let response = lambda
        .kinesis(LambdaEvent::new(event, context(MINUTE)), handler)
        .await;
    serde_json::to_value(&response).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_reports_the_first_failed_sequence_number() {
    let (lambda, shop) = (lambda().await, Shop::new());
    let records = [
        kinesis_record("101", "k1", "ok"),
        kinesis_record("102", "k2", "fail"),
        kinesis_record("103", "k3", "ok"),
    ];
    let answer = invoke_kinesis(&lambda, &shop, &records).await;
    assert_eq!(
        answer,
        json!({"batchItemFailures": [{"itemIdentifier": "102"}]})
    );
    assert_eq!(shop.charged("k3"), 0, "a record after the failed one ran");
    *shop.broken.lock().unwrap() = false;
    // Lambda retries from 102; and the whole batch again changes nothing either.
    let answer = invoke_kinesis(&lambda, &shop, &records).await;
    assert_eq!(answer, json!({"batchItemFailures": []}));
    for order in ["k1", "k2", "k3"] {
        assert_eq!(shop.charged(order), 1, "{order}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_streams_report_the_first_failed_sequence_number() {
    let (lambda, shop) = (lambda().await, Shop::new());
    let record = |seq: &str, order: &str, act: &str| {
        json!({
            "eventID": format!("event-{seq}"),
            "eventName": "INSERT",
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": "eu-west-1",
            "dynamodb": {
                "ApproximateCreationDateTime": 1479499740,
                "Keys": {"order": {"S": order}},
                "NewImage": {"order": {"S": order}, "act": {"S": act}},
                "SequenceNumber": seq,
                "SizeBytes": 26,
                "StreamViewType": "NEW_AND_OLD_IMAGES"
            },
            "eventSourceARN": "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-11-25T00:00:00.000"
        })
    };
    let records = [
        record("201", "d1", "ok"),
        record("202", "d2", "panic"),
        record("203", "d3", "ok"),
    ];
    let invoke = || async {
        let event: dynamodb::Event = serde_json::from_value(json!({ "Records": records })).unwrap();
        let shop = shop.clone();
        let handler = move |r: dynamodb::EventRecord| {
            let image = serde_json::to_value(&r.change.new_image).unwrap_or_default();
            let body = json!({"order": image["order"]["S"], "act": image["act"]["S"]});
            shop.clone().charge(body)
        };
        let response = lambda
            .dynamodb(LambdaEvent::new(event, context(MINUTE)), handler)
            .await;
        serde_json::to_value(&response).unwrap()
    };
    assert_eq!(
        invoke().await,
        json!({"batchItemFailures": [{"itemIdentifier": "202"}]})
    );
    *shop.broken.lock().unwrap() = false;
    assert_eq!(invoke().await, json!({"batchItemFailures": []}));
    for order in ["d1", "d2", "d3"] {
        assert_eq!(shop.charged(order), 1, "{order}");
    }
}
