//! The `idem` binary against a real idem-server (in this test's process, on a loopback port,
//! over SQLite in a temporary directory), through an `idem+http://` URL: `inspect` and `evict`
//! act on the caller's own keys, `prune` takes the admin token, another caller sees nothing of
//! them, and what the server does not offer (`list`) is one clear line.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{idem, json, key};
use idem::{ClaimOutcome, ClaimRequest, Error, Idempotency, RemoteStore, Store};
use idem_server::{auth::Tokens, router, App, Config};

const ADMIN: &str = "admin-token-0123456789";
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789abc";

/// How long the seeded claims hold their keys.
const HOUR: Duration = Duration::from_secs(3600);

/// The URL of the server at `address` for the caller of `token`.
fn url(address: &str, token: &str) -> String {
    format!("idem+http://{address}?token={token}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_works_through_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::builder()
        .pruner(None)
        .open(dir.path().join("idem.db"))
        .await
        .unwrap();
    let tokens = Tokens::new(ADMIN, &[format!("alice={ALICE}"), format!("bob={BOB}")]).unwrap();
    let app = App::new(Arc::new(store), tokens, Config::default(), None).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move { axum::serve(listener, router(app)).await.unwrap() });

    // Alice's records, written through the server as her services would, in the namespace
    // the command uses unless `--table` names another (`default`).
    let alice: Arc<dyn Store> = Arc::new(
        RemoteStore::builder(format!("http://{address}"), ALICE)
            .build()
            .unwrap(),
    );
    let engine = Idempotency::from_arc(alice.clone());
    engine
        .call(key("done"))
        .run(async { Ok::<_, Error>(serde_json::json!({ "receipt": 4200 })) })
        .await
        .unwrap();
    let ClaimOutcome::Claimed(_running) = alice
        .claim(ClaimRequest::new(&key("running"), HOUR))
        .await
        .unwrap()
    else {
        panic!("a new key is claimable");
    };
    let ClaimOutcome::Claimed(old) = alice
        .claim(ClaimRequest::new(&key("old"), Duration::from_secs(3600)))
        .await
        .unwrap()
    else {
        panic!("a new key is claimable");
    };
    let kept = idem::Completion {
        response: Some(b"x"),
        is_error: false,
        retention: Duration::from_millis(1),
        key_retention: Duration::ZERO,
    };
    alice.complete(&old, kept).await.unwrap();
    // Bounded: the store's clock passes 1 ms of retention within a few polls.
    let mut ended = false;
    for _ in 0..200 {
        if alice.get(&key("old")).await.unwrap().is_none() {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(ended, "a retention of 1 ms ended");

    let inspect = json(
        &url(&address, ALICE),
        "default",
        &[
            "inspect", "--scope", "charge", "--caller", "tenant-7", "done",
        ],
    );
    assert_eq!(inspect["state"], "completed");
    assert_eq!(inspect["response"], serde_json::json!({ "receipt": 4200 }));
    assert_eq!(inspect["key"], key("done").to_string());
    assert!(inspect["expires_in_ms"].as_i64().unwrap() > 3_600_000);
    let (ok, text, err) = idem(
        &url(&address, ALICE),
        "default",
        &["inspect", "--hash", &key("running").to_string()],
    );
    assert!(ok, "{err}");
    assert!(
        text.contains("in_progress") && text.contains("lease left"),
        "{text}"
    );

    // Bob's key space holds none of Alice's keys.
    let (ok, _, err) = idem(
        &url(&address, BOB),
        "default",
        &[
            "inspect", "--scope", "charge", "--caller", "tenant-7", "done",
        ],
    );
    assert!(!ok && err.starts_with("idem: no record for key "), "{err}");

    // Pruning spans every caller's keys: the admin's alone.
    let (ok, _, err) = idem(&url(&address, ALICE), "default", &["prune"]);
    assert!(
        !ok && err.contains("403") && err.contains("admin token"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let pruned = json(
        &url(&address, ADMIN),
        "default",
        &["prune", "--batch", "10"],
    );
    assert_eq!(pruned["deleted"], 1, "{pruned}");

    let evicted = json(
        &url(&address, ALICE),
        "default",
        &["evict", "--scope", "charge", "--caller", "tenant-7", "done"],
    );
    assert_eq!(evicted["evicted"], key("done").to_string());
    let again = engine
        .call(key("done"))
        .run(async { Ok::<_, Error>(serde_json::json!({ "receipt": 1 })) })
        .await
        .unwrap();
    assert!(
        !again.is_replayed(),
        "evicted through the server, it ran again"
    );

    // What the server does not offer, and a URL without a token: one line each.
    let (ok, _, err) = idem(&url(&address, ALICE), "default", &["list"]);
    assert!(!ok && err.contains("store URL"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--url", &format!("idem+http://{address}"), "stats"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("names no token"),
        "{err}"
    );
    server.abort();
}
