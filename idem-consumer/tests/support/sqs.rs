//! moto's SQS for the consumer tests: the server scripts/test starts for DynamoDB serves SQS
//! too (IDEM_TEST_DYNAMODB_URL).

use idem_consumer::sqs::aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use idem_consumer::sqs::aws_sdk_sqs::types::QueueAttributeName;
use idem_consumer::sqs::aws_sdk_sqs::{Client, Config};

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
    let config = Config::builder()
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
