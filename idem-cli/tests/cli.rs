//! The `idem` binary itself, run against a SQLite file, the test PostgreSQL, the test Redis (one
//! server and the cluster) and the test DynamoDB (moto): every command, its JSON, and its
//! errors. A server's variable missing skips its test, or fails it under `IDEM_REQUIRE_PG=1`,
//! `IDEM_REQUIRE_REDIS=1` or `IDEM_REQUIRE_DYNAMODB=1` (as `scripts/test` sets them).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{idem, json, key};
use idem::{ClaimOutcome, ClaimRequest, Error, Idempotency, PostgresStore, SqliteStore, Store};

/// How long the seeded claims hold their keys.
const HOUR: Duration = Duration::from_secs(3600);

/// Three records: `done` completed with a JSON receipt, `running` claimed and running, `old`
/// completed and then expired (its expiry moved into the past by `expire`).
async fn seed(store: Arc<dyn Store>) {
    let engine = Idempotency::from_arc(store.clone());
    for k in ["done", "old"] {
        engine
            .call(key(k))
            .run(async { Ok::<_, Error>(serde_json::json!({ "receipt": 4200 })) })
            .await
            .unwrap();
    }
    let ClaimOutcome::Claimed(_claim) = store
        .claim(ClaimRequest::new(&key("running"), HOUR))
        .await
        .unwrap()
    else {
        panic!("a new key is claimable");
    };
}

/// How a store keeps its expired records: the SQL stores and DynamoDB until they are pruned,
/// Redis until it deletes them itself.
#[derive(Debug, Clone)]
enum Kind {
    Sql,
    #[cfg(feature = "redis")]
    Redis(idem::RedisStore, Vec<String>),
    #[cfg(feature = "dynamodb")]
    Dynamo(idem::DynamoStore),
}

/// What every store must show through the binary; `expire` moves `old`'s expiry into the past.
async fn every_command(url: &str, table: &str, store: Arc<dyn Store>, kind: Kind) {
    let inspect = json(
        url,
        table,
        &[
            "inspect", "--scope", "charge", "--caller", "tenant-7", "done",
        ],
    );
    assert_eq!(inspect["state"], "completed");
    assert_eq!(inspect["response"], serde_json::json!({ "receipt": 4200 }));
    assert_eq!(inspect["key"], key("done").to_string());
    assert!(inspect["expires_in_ms"].as_i64().unwrap() > 3_600_000);
    let (ok, text, _) = idem(
        url,
        table,
        &["inspect", "--hash", &key("running").to_string()],
    );
    assert!(ok);
    assert!(
        text.contains("in_progress") && text.contains("lease left"),
        "{text}"
    );

    let listed = json(url, table, &["list", "--in-progress"]);
    let records = listed["records"].as_array().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["key"], key("running").to_string());
    assert!(records[0]["lease_left_ms"].as_i64().unwrap() > 0);
    let page = json(url, table, &["list", "--limit", "1"]);
    let next = page["next"]
        .as_str()
        .expect("a full page has a next")
        .to_owned();
    let rest = json(url, table, &["list", "--after", &next]);
    assert_eq!(
        page["records"].as_array().unwrap().len() + rest["records"].as_array().unwrap().len(),
        3
    );

    let stats = json(url, table, &["stats"]);
    assert_eq!(
        (stats["in_progress"].as_u64(), stats["completed"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(stats["expired"], 0);

    expire(url, table, &kind).await;
    let stats = json(url, table, &["stats"]);
    assert_eq!(
        (stats["completed"].as_u64(), stats["expired"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(stats["oldest_expires_in_ms"].as_i64().unwrap() > 0);
    let (ok, text, _) = idem(url, table, &["stats"]);
    assert!(
        ok && (text.contains("expired") || text.contains("ended")),
        "{text}"
    );

    let (ok, text, progress) = idem(url, table, &["prune", "--batch", "1"]);
    assert!(ok, "{progress}");
    let pruned = json(url, table, &["prune", "--batch", "1"]);
    match &kind {
        #[cfg(feature = "redis")]
        Kind::Redis(..) => {
            // Redis deletes ended records itself: the command says so and deletes nothing.
            assert!(
                text.starts_with("nothing to prune: Redis deletes"),
                "{text}"
            );
            assert_eq!(pruned["deleted"], 0);
            assert_eq!(pruned["deletes_expired_itself"], true);
            assert!(pruned["note"].as_str().unwrap().contains("key expiry"));
            assert_eq!(json(url, table, &["stats"])["expired"], 1);
        }
        _ => {
            assert!(text.starts_with("pruned 1 expired records in"), "{text}");
            assert!(progress.contains("batch 1: deleted"), "{progress}");
            assert_eq!(pruned["deleted"], 0, "the first prune took it");
            assert_eq!(json(url, table, &["stats"])["expired"], 0);
        }
    }
    #[cfg(feature = "dynamodb")]
    if let Kind::Dynamo(_) = &kind {
        assert!(text.contains("DynamoDB's TTL also deletes"), "{text}");
        assert_eq!(pruned["deletes_expired_itself"], true);
    }

    // Evict: the key runs again on its next call.
    let evicted = json(
        url,
        table,
        &["evict", "--scope", "charge", "--caller", "tenant-7", "done"],
    );
    assert_eq!(evicted["evicted"], key("done").to_string());
    let again = Idempotency::from_arc(store)
        .call(key("done"))
        .run(async { Ok::<_, Error>(serde_json::json!({ "receipt": 1 })) })
        .await
        .unwrap();
    assert!(!again.is_replayed());

    // The SQL stores' schema is at version 6 (the steps table, uncertain claims and
    // tombstones, the steps' journal, the journal in the record's row, one index for the
    // pruner); the others' layouts at 1.
    let schema_version = if matches!(kind, Kind::Sql) { 6 } else { 1 };
    assert_eq!(
        json(url, table, &["migrate"])["schema_version"].as_i64(),
        Some(schema_version)
    );

    // Errors: one line, a non-zero exit.
    let (ok, _, err) = idem(url, table, &["inspect", "--scope", "charge", "nobody"]);
    assert!(!ok);
    assert!(err.starts_with("idem: no record for key "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let (ok, _, err) = idem(url, table, &["evict", "--hash", "abc"]);
    assert!(!ok && err.contains("not 64 hex digits"), "{err}");
}

/// Moves the expiry of `old` into the past, as time would (leaving the record in place, as a
/// store does until it is pruned, or until Redis gets to deleting it).
async fn expire(url: &str, table: &str, kind: &Kind) {
    let k = key("old");
    match kind {
        Kind::Sql if url.starts_with("sqlite:") => {
            let pool = idem::sqlx::SqlitePool::connect(url).await.unwrap();
            idem::sqlx::query(&format!(
                "UPDATE \"{table}\" SET expires_at = 0 WHERE key = ?1"
            ))
            .bind(&k.as_bytes()[..])
            .execute(&pool)
            .await
            .unwrap();
        }
        Kind::Sql => {
            let pool = idem::sqlx::PgPool::connect(url).await.unwrap();
            idem::sqlx::query(&format!(
                "UPDATE \"{table}\" SET expires_at = clock_timestamp() - interval '1 second' WHERE key = $1"
            ))
            .bind(&k.as_bytes()[..])
            .execute(&pool)
            .await
            .unwrap();
        }
        #[cfg(feature = "redis")]
        Kind::Redis(store, urls) => {
            // The record's end (field `e`, epoch ms) in the past; its key stays until Redis
            // deletes it at its own expiry.
            let mut hset = redis::cmd("HSET");
            hset.arg(store.redis_key(&k)).arg("e").arg("1");
            let changed: i64 = if urls.len() > 1 {
                let client = redis::cluster::ClusterClient::new(urls.clone()).unwrap();
                let mut conn = client.get_async_connection().await.unwrap();
                hset.query_async(&mut conn).await.unwrap()
            } else {
                let client = redis::Client::open(urls[0].as_str()).unwrap();
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                hset.query_async(&mut conn).await.unwrap()
            };
            assert_eq!(changed, 0, "the field existed");
        }
        #[cfg(feature = "dynamodb")]
        Kind::Dynamo(store) => {
            use idem::aws_sdk_dynamodb::types::AttributeValue;
            store
                .client()
                .update_item()
                .table_name(table)
                .key("pk", AttributeValue::S(k.to_string()))
                .update_expression("SET expires_ms = :past")
                .expression_attribute_values(":past", AttributeValue::N("1".into()))
                .send()
                .await
                .unwrap();
        }
    }
}

/// A new SQLite file in a temporary directory (kept while the first value lives), its URL, and a
/// store on it. The tests move records' expiry into the past and count them: no background
/// pruner may delete them behind them.
async fn sqlite_file() -> (tempfile::TempDir, String, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let store = SqliteStore::builder()
        .pruner(None)
        .connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    (dir, url, store)
}

/// A response the HTTP layer stored shows through `inspect` as its status, headers and body,
/// not as hex.
#[tokio::test]
async fn inspect_shows_a_response_the_http_layer_stored() {
    use axum::routing::post;
    use idem::http::types::{Request, StatusCode};
    use idem::http::IdempotencyLayer;
    use tower::ServiceExt;

    let (_dir, url, store) = sqlite_file().await;
    let layer = IdempotencyLayer::builder(Idempotency::new(store))
        .scope("charge")
        .caller(|_| Some("tenant-7".to_owned()))
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/charges",
            post(|| async {
                (
                    StatusCode::CREATED,
                    [
                        ("content-type", "application/json"),
                        ("location", "/charges/7"),
                    ],
                    r#"{"receipt":4200}"#,
                )
            }),
        )
        .layer(layer);
    let request = Request::post("/charges")
        .header("idempotency-key", "\"http-1\"")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);

    let args = [
        "inspect", "--scope", "charge", "--caller", "tenant-7", "http-1",
    ];
    let inspect = json(&url, "idem_records", &args);
    assert_eq!(inspect["state"], "completed");
    let stored = &inspect["response"]["stored_response"];
    assert_eq!(stored["status"], 201, "{inspect}");
    assert_eq!(stored["body"], serde_json::json!({ "receipt": 4200 }));
    let headers = stored["headers"].as_array().unwrap();
    assert!(
        headers.contains(&serde_json::json!(["location", "/charges/7"])),
        "{headers:?}"
    );
    // The text form prints the same response, pretty.
    let (ok, text, err) = idem(&url, "idem_records", &args);
    assert!(ok, "{err}");
    assert!(
        text.contains("\"stored_response\"") && text.contains("\"status\": 201"),
        "{text}"
    );
}

#[tokio::test]
async fn sqlite_every_command() {
    let (_dir, url, store) = sqlite_file().await;
    seed(Arc::new(store.clone())).await;
    every_command(&url, "idem_records", Arc::new(store), Kind::Sql).await;
}

#[tokio::test]
async fn postgres_every_command() {
    let Some(url) = idem_test_support::postgres::pg_url("postgres_every_command") else {
        return;
    };
    let table = format!("idem_cli_{}", std::process::id());
    // As for SQLite: no background pruner deleting the records the test expires and counts.
    let store = PostgresStore::builder()
        .table(&table)
        .pruner(None)
        .connect(&url)
        .await
        .unwrap();
    seed(Arc::new(store.clone())).await;
    every_command(&url, &table, Arc::new(store.clone()), Kind::Sql).await;
    for t in [
        table.clone(),
        format!("{table}_steps"),
        format!("{table}_migrations"),
    ] {
        idem::sqlx::query(&format!("DROP TABLE \"{t}\""))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

#[test]
fn bad_urls_are_one_clear_line() {
    let (ok, _, err) = idem("mysql://localhost/x", "idem_records", &["stats"]);
    assert!(!ok);
    assert!(
        err.contains("unsupported store URL") && err.contains("sqlite://"),
        "{err}"
    );
    let (ok, _, err) = idem("sqlite:///no/such/dir/idem.db", "idem_records", &["stats"]);
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "idem: no SQLite database at \"/no/such/dir/idem.db\": check the path, or add \
         ?mode=rwc to the URL to create it"
    );
    let (ok, _, err) = idem(
        "postgres://nobody@127.0.0.1:1/none",
        "idem_records",
        &["stats"],
    );
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("idem: "), "{err}");
}

/// A misspelled SQLite path is an error for every command but `migrate`, which creates the file
/// (as it creates a missing DynamoDB table); `?mode=rwc` creates it for any command.
#[test]
fn only_migrate_creates_a_missing_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let url = format!("sqlite://{}", path.display());
    for command in ["stats", "list", "prune"] {
        let (ok, _, err) = idem(&url, "idem_records", &[command]);
        assert!(!ok, "{command}");
        assert!(err.contains("no SQLite database at"), "{command}: {err}");
        assert!(!path.exists(), "{command} created the file");
    }
    let (ok, _, err) = idem(&url, "idem_records", &["migrate"]);
    assert!(ok, "{err}");
    assert!(path.exists());
    let (ok, _, err) = idem(&url, "idem_records", &["stats"]);
    assert!(ok, "{err}");
    let other = dir.path().join("other.db");
    let (ok, _, err) = idem(
        &format!("sqlite://{}?mode=rwc", other.display()),
        "idem_records",
        &["stats"],
    );
    assert!(ok, "{err}");
    assert!(other.exists());
}

#[cfg(feature = "redis")]
async fn redis_every_command(flavor: idem_test_support::redis::Flavor) {
    let Some(urls) =
        idem_test_support::redis::redis_urls(flavor, &idem_test_support::current_test())
    else {
        return;
    };
    let prefix = idem_test_support::redis::fresh_prefix();
    let builder = idem::RedisStore::builder().prefix(&prefix);
    let (store, url) = match flavor {
        idem_test_support::redis::Flavor::Single => {
            (builder.connect(&urls[0]).await.unwrap(), urls[0].clone())
        }
        idem_test_support::redis::Flavor::Cluster => {
            let nodes: Vec<&str> = urls
                .iter()
                .map(|u| u.trim_start_matches("redis://"))
                .collect();
            (
                builder.connect_cluster(&urls).await.unwrap(),
                format!("redis-cluster://{}", nodes.join(",")),
            )
        }
    };
    seed(Arc::new(store.clone())).await;
    let kind = Kind::Redis(store.clone(), urls);
    // The size is the records' memory (`MEMORY USAGE`), reported when there are records.
    assert!(
        json(&url, &prefix, &["stats"])["table_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );
    every_command(&url, &prefix, Arc::new(store), kind).await;
    // Another prefix on the same server sees none of these records.
    let other = json(&url, &idem_test_support::redis::fresh_prefix(), &["stats"]);
    assert_eq!(
        (other["in_progress"].as_u64(), other["completed"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(
        json(&url, &prefix, &["migrate"])["done"],
        "nothing to migrate on Redis: records are hashes of layout version 1"
    );
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_single_every_command() {
    redis_every_command(idem_test_support::redis::Flavor::Single).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_cluster_every_command() {
    redis_every_command(idem_test_support::redis::Flavor::Cluster).await;
}

/// Many records over the cluster's three masters: `list` pages through all of them in key order,
/// each once, and `stats` counts them.
#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_cluster_lists_every_master_in_key_order() {
    let Some(urls) = idem_test_support::redis::redis_urls(
        idem_test_support::redis::Flavor::Cluster,
        "redis_cluster_lists",
    ) else {
        return;
    };
    let prefix = idem_test_support::redis::fresh_prefix();
    let store = idem::RedisStore::builder()
        .prefix(&prefix)
        .connect_cluster(&urls)
        .await
        .unwrap();
    let mut keys: Vec<String> = Vec::new();
    for i in 0..40 {
        let k = key(&format!("many-{i}"));
        let ClaimOutcome::Claimed(_) = store
            .claim(ClaimRequest::new(&k, Duration::from_secs(600)))
            .await
            .unwrap()
        else {
            panic!("a new key starts");
        };
        keys.push(k.to_string());
    }
    keys.sort();
    let nodes: Vec<&str> = urls
        .iter()
        .map(|u| u.trim_start_matches("redis://"))
        .collect();
    let url = format!("redis-cluster://{}", nodes.join(","));
    let mut seen: Vec<String> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["list", "--in-progress", "--limit", "7"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let page = json(&url, &prefix, &args);
        for r in page["records"].as_array().unwrap() {
            seen.push(r["key"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, keys);
    assert_eq!(json(&url, &prefix, &["stats"])["in_progress"], 40);
}

#[cfg(feature = "dynamodb")]
#[tokio::test]
async fn dynamodb_every_command() {
    let Some(endpoint) = idem_test_support::dynamodb::dynamo_url("dynamodb_every_command") else {
        return;
    };
    let url = format!("dynamodb://{}", endpoint.trim_start_matches("http://"));
    let table = idem_test_support::dynamodb::fresh_table();
    // The table does not exist yet: an error that says so, then `migrate` creates it.
    let (ok, _, err) = idem(&url, &table, &["stats"]);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no DynamoDB table") && err.contains("idem migrate"),
        "{err}"
    );
    let created = json(&url, &table, &["migrate"]);
    assert_eq!(created["created_table"], true);
    assert_eq!(created["schema_version"], 1);
    let store = idem::DynamoStore::builder()
        .table(&table)
        .build(idem_test_support::dynamodb::client(&endpoint))
        .await
        .unwrap();
    seed(Arc::new(store.clone())).await;
    every_command(&url, &table, Arc::new(store.clone()), Kind::Dynamo(store)).await;
    assert_eq!(json(&url, &table, &["migrate"])["created_table"], false);
    idem_test_support::dynamodb::drop_table(&endpoint, &table);
}

#[test]
fn distributed_store_urls_fail_in_one_line() {
    for url in [
        "redis://127.0.0.1:1",
        "redis-cluster://127.0.0.1:1,127.0.0.1:2",
        "redis-cluster://",
        "dynamodb://127.0.0.1:1",
    ] {
        let (ok, _, err) = idem(url, "idem_records", &["stats"]);
        assert!(!ok, "{url}");
        assert_eq!(err.lines().count(), 1, "{url}: {err}");
        assert!(err.starts_with("idem: "), "{url}: {err}");
    }
    if cfg!(feature = "redis") {
        let (ok, _, err) = idem("redis-cluster://", "idem_records", &["stats"]);
        assert!(!ok && err.contains("names no node"), "{err}");
        let (ok, _, err) = idem("redis://127.0.0.1:1", "bad prefix{", &["stats"]);
        assert!(!ok && err.contains("prefix"), "{err}");
    } else {
        // The quick install (SQL only) names the feature that adds the store.
        let (ok, _, err) = idem("redis://127.0.0.1:1", "idem_records", &["stats"]);
        assert!(!ok && err.contains("`--features redis`"), "{err}");
    }
    if !cfg!(feature = "dynamodb") {
        let (ok, _, err) = idem("dynamodb://127.0.0.1:1", "idem_records", &["stats"]);
        assert!(!ok && err.contains("`--features dynamodb`"), "{err}");
    }
}

/// `idem uncertain` lists an operation whose uncertain claim lapsed; `idem resolve` resolves it,
/// fenced: a second resolution is refused with a clear line and changes nothing; the key then
/// replays the resolution; an operation resolved as failed frees its key; a bad resolution is a
/// usage error.
#[tokio::test]
async fn uncertain_operations_are_listed_and_resolved() {
    let (_dir, url, store) = sqlite_file().await;
    let lease = Duration::from_millis(200);
    for k in ["charged", "declined"] {
        let k = key(k);
        let request = ClaimRequest::new(&k, lease).on_lapse(idem::OnLapse::Uncertain);
        let ClaimOutcome::Claimed(_dead) = store.claim(request).await.unwrap() else {
            panic!("a new key is claimable");
        };
    }
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let listed = json(&url, "idem_records", &["uncertain"]);
    let keys: Vec<&str> = listed["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["key"].as_str().unwrap())
        .collect();
    let (charged, declined) = (key("charged").to_string(), key("declined").to_string());
    let mut expected = vec![charged.as_str(), declined.as_str()];
    expected.sort_unstable();
    assert_eq!(keys, expected, "{listed}");

    let resolve = |hash: &str, how: &[&str]| {
        let mut args = vec!["resolve", "--hash", hash];
        args.extend_from_slice(how);
        idem(&url, "idem_records", &args)
    };
    let (ok, text, err) = resolve(&charged, &["--completed", r#"{"receipt":4200}"#]);
    assert!(ok, "{err}");
    assert!(text.contains("completed"), "{text}");
    let (ok, _, err) = resolve(&charged, &["--failed"]);
    assert!(!ok);
    assert!(err.contains("is not uncertain"), "{err}");
    let inspect = json(&url, "idem_records", &["inspect", "--hash", &charged]);
    assert_eq!(inspect["response"], serde_json::json!({ "receipt": 4200 }));

    let (ok, _, err) = resolve(&declined, &["--completed", "not json"]);
    assert!(!ok);
    assert!(
        err.contains("--completed takes the result as JSON"),
        "{err}"
    );
    let (ok, _, err) = resolve(&declined, &[]);
    assert!(!ok, "a resolution needs a verdict");
    assert!(err.contains("--failed"), "{err}");
    let (ok, _, err) = resolve(&declined, &["--failed"]);
    assert!(ok, "{err}");
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&key("declined"), HOUR))
            .await
            .unwrap(),
        ClaimOutcome::Claimed(_)
    ));
    let listed = json(&url, "idem_records", &["uncertain"]);
    assert_eq!(listed["operations"], serde_json::json!([]));
}
