//! moto's SQS for the consumer tests: the server scripts/test starts for DynamoDB serves SQS
//! too (IDEM_TEST_DYNAMODB_URL).

use idem_consumer::sqs::aws_sdk_sqs::config::interceptors::BeforeSerializationInterceptorContextRef;
use idem_consumer::sqs::aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use idem_consumer::sqs::aws_sdk_sqs::config::{ConfigBag, Intercept};
use idem_consumer::sqs::aws_sdk_sqs::operation::receive_message::ReceiveMessageInput;
use idem_consumer::sqs::aws_sdk_sqs::types::QueueAttributeName;
use idem_consumer::sqs::aws_sdk_sqs::{Client, Config};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// moto's URL, or `None` to skip (a failure under IDEM_REQUIRE_DYNAMODB).
pub fn endpoint() -> Option<String> {
    idem_test_support::setting(
        &idem_test_support::current_test(),
        "IDEM_TEST_DYNAMODB_URL",
        "IDEM_REQUIRE_DYNAMODB",
    )
}

/// An SQS client of `endpoint` with placeholder credentials.
pub fn client(endpoint: &str) -> Client {
    client_with(endpoint, None)
}

/// Counts the receives a client makes that do not wait (`WaitTimeSeconds` 0): the ones that
/// fill a batch after the long poll.
#[derive(Debug, Clone, Default)]
pub struct FillReceives(pub Arc<AtomicUsize>);

impl Intercept for FillReceives {
    fn name(&self) -> &'static str {
        "FillReceives"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(input) = context.input().downcast_ref::<ReceiveMessageInput>()
            && input.wait_time_seconds() == Some(0)
        {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// [`client`] that counts its receives that do not wait in `fills`.
pub fn counting_client(endpoint: &str, fills: &FillReceives) -> Client {
    client_with(endpoint, Some(fills.clone()))
}

fn client_with(endpoint: &str, fills: Option<FillReceives>) -> Client {
    let mut config = Config::builder();
    if let Some(fills) = fills {
        config = config.interceptor(fills);
    }
    let config = config
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "static"))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(config)
}

/// The messages in the queue at `url`, visible or not.
pub async fn left_in_queue(client: &Client, url: &str) -> u64 {
    let attrs = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap_or_default();
    attrs.values().map(|v| v.parse::<u64>().unwrap_or(0)).sum()
}
