//! A DynamoDB client from an endpoint and the environment, for tools that take a store URL
//! (`store::url`), without `aws-config`.

use std::time::Duration;

use aws_sdk_dynamodb::config::{timeout::TimeoutConfig, BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::{Client, Config};

use idem_core::Error;

use crate::store::DynamoStore;

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl DynamoStore {
    /// A client of `endpoint` configured from the environment, with bounded timeouts (5 s to
    /// connect, 20 s per attempt) and the SDK's standard retries.
    ///
    /// - Credentials: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`. Over
    ///   plain HTTP (a local emulator) static placeholders stand in when they are unset; over
    ///   HTTPS their absence is [`Error::InvalidConfig`]. No profile, SSO or instance role is
    ///   read: in a service, build the client with `aws-config` instead.
    /// - Region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the region in an endpoint
    ///   `dynamodb.REGION.amazonaws.com`, or `us-east-1`.
    ///
    /// ```
    /// use idem::DynamoStore;
    /// let client = DynamoStore::client_from_env("http://127.0.0.1:8000")?;
    /// # let _ = client;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn client_from_env(endpoint: &str) -> Result<Client, Error> {
        let host = endpoint
            .split_once("://")
            .map_or(endpoint, |(_, rest)| rest);
        let region = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .or_else(|| {
                host.strip_prefix("dynamodb.")
                    .and_then(|h| h.split_once(".amazonaws.com"))
                    .map(|(region, _)| region.to_owned())
            })
            .unwrap_or_else(|| "us-east-1".to_owned());
        let credentials =
            match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
                (Some(id), Some(secret)) => {
                    Credentials::new(id, secret, var("AWS_SESSION_TOKEN"), None, "environment")
                }
                _ if endpoint.starts_with("http://") => {
                    Credentials::new("idem-local", "idem-local", None, None, "placeholder")
                }
                _ => return Err(Error::InvalidConfig(
                    "DynamoDB over HTTPS needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and \
                     AWS_SESSION_TOKEN for temporary credentials) in the environment; no profile \
                     is read"
                        .into(),
                )),
            };
        let config = Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(credentials)
            .endpoint_url(endpoint)
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(20))
                    .build(),
            )
            .build();
        Ok(Client::from_conf(config))
    }
}
