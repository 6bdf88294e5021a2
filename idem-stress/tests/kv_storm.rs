//! The multi-process storm ([`idem_stress::storm`]) against DynamoDB, Redis and a Redis
//! Cluster: 4 worker processes × 64 tasks × 100 keys → exactly 100 executions, and every caller
//! gets the one stored result. Against DynamoDB (moto) 16 tasks a process: moto answers one
//! request at a time, so 64 tasks raced no more than 16 do (every request is served alone, with
//! 64 callers of each key either way); they only queued, 135 s alone and 240-320 s beside the
//! other lane of `scripts/test`.
//!
//! Needs the servers `scripts/test` starts (`IDEM_TEST_DYNAMODB_URL`, `IDEM_TEST_REDIS_URL`,
//! `IDEM_TEST_REDIS_CLUSTER_URLS`); each test skips without its variable unless
//! `IDEM_REQUIRE_DYNAMODB=1` / `IDEM_REQUIRE_REDIS=1`.

use idem_stress::storm;
use idem_test_support::redis::{redis_urls, Flavor};
use idem_test_support::{dynamodb::dynamo_url, unique_name};

const WORKER: &str = env!("CARGO_BIN_EXE_idem-stress-worker");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_four_processes_run_each_key_once() {
    let Some(endpoint) = dynamo_url("dynamodb_four_processes_run_each_key_once") else {
        return;
    };
    let rest = endpoint
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("IDEM_TEST_DYNAMODB_URL {endpoint} is not http://HOST:PORT"));
    let url = format!("dynamodb://{rest}");
    storm::four_processes(WORKER, &url, &unique_name("idem_storm"), MOTO_TASKS).await;
}

/// Tasks per process against moto (the module's header says why).
const MOTO_TASKS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_four_processes_run_each_key_once() {
    let Some(urls) = redis_urls(Flavor::Single, "redis_four_processes_run_each_key_once") else {
        return;
    };
    storm::four_processes(WORKER, &urls[0], &unique_name("idem_storm"), storm::TASKS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_four_processes_run_each_key_once() {
    let Some(urls) = redis_urls(
        Flavor::Cluster,
        "redis_cluster_four_processes_run_each_key_once",
    ) else {
        return;
    };
    let nodes: Vec<&str> = urls
        .iter()
        .map(|u| u.strip_prefix("redis://").unwrap_or(u))
        .collect();
    let url = format!("redis-cluster://{}", nodes.join(","));
    storm::four_processes(WORKER, &url, &unique_name("idem_storm"), storm::TASKS).await;
}
