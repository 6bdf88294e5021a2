//! The `idem` binary itself, run against a SQLite file and the test PostgreSQL: every command,
//! its JSON, and its errors.

#[path = "../../idem-core/tests/support/pg_env.rs"]
mod pg_env;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use idem::{Error, Idempotency, Key, PostgresStore, SqliteStore, Start, Store};
use serde_json::Value;

/// Runs `idem` with `args`; its exit success, stdout and stderr.
fn idem(url: &str, table: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--url", url, "--table", table])
        .args(args)
        .output()
        .expect("the idem binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(url: &str, table: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (ok, out, err) = idem(url, table, &all);
    assert!(ok, "idem {args:?} failed: {err}");
    serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("idem {args:?} printed no JSON ({e}): {out}"))
}

fn key(client_key: &str) -> Key {
    Key::derive("charge", "tenant-7", client_key).unwrap()
}

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
    let Start::Started(_claim) = store
        .start(&key("running"), None, Duration::from_secs(3600))
        .await
        .unwrap()
    else {
        panic!("a new key is claimable");
    };
}

/// What every store must show through the binary; `expire` moves `old`'s expiry into the past.
async fn every_command(url: &str, table: &str, store: Arc<dyn Store>) {
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

    expire(store.as_ref(), url, table).await;
    let stats = json(url, table, &["stats"]);
    assert_eq!(
        (stats["completed"].as_u64(), stats["expired"].as_u64()),
        (Some(1), Some(1))
    );
    let (ok, text, _) = idem(url, table, &["stats"]);
    assert!(ok && text.contains("expired (to prune)"), "{text}");

    let pruned = json(url, table, &["prune", "--batch", "1"]);
    assert_eq!(pruned["deleted"], 1);
    assert_eq!(json(url, table, &["stats"])["expired"], 0);

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

    assert_eq!(
        json(url, table, &["migrate"])["schema_version"].as_i64(),
        Some(1)
    );

    // Errors: one line, a non-zero exit.
    let (ok, _, err) = idem(url, table, &["inspect", "--scope", "charge", "nobody"]);
    assert!(!ok);
    assert!(err.starts_with("idem: no record for key "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let (ok, _, err) = idem(url, table, &["evict", "--hash", "abc"]);
    assert!(!ok && err.contains("not 64 hex digits"), "{err}");
}

/// Moves the expiry of `old` into the past, as time would.
async fn expire(store: &dyn Store, url: &str, table: &str) {
    let _ = store;
    let k = key("old");
    if url.starts_with("sqlite:") {
        let pool = idem::sqlx::SqlitePool::connect(url).await.unwrap();
        idem::sqlx::query(&format!(
            "UPDATE \"{table}\" SET expires_at = 0 WHERE key = ?1"
        ))
        .bind(&k.as_bytes()[..])
        .execute(&pool)
        .await
        .unwrap();
    } else {
        let pool = idem::sqlx::PgPool::connect(url).await.unwrap();
        idem::sqlx::query(&format!(
            "UPDATE \"{table}\" SET expires_at = clock_timestamp() - interval '1 second' WHERE key = $1"
        ))
        .bind(&k.as_bytes()[..])
        .execute(&pool)
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn sqlite_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path).await.unwrap();
    seed(Arc::new(store.clone())).await;
    let url = format!("sqlite://{}", path.display());
    every_command(&url, "idem_records", Arc::new(store)).await;
}

#[tokio::test]
async fn postgres_every_command() {
    let Some(url) = pg_env::pg_url("postgres_every_command") else {
        return;
    };
    let table = format!("idem_cli_{}", std::process::id());
    let store = PostgresStore::builder()
        .table(&table)
        .connect(&url)
        .await
        .unwrap();
    seed(Arc::new(store.clone())).await;
    every_command(&url, &table, Arc::new(store.clone())).await;
    for t in [table.clone(), format!("{table}_migrations")] {
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
        "idem: no SQLite database at \"/no/such/dir/idem.db\""
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
