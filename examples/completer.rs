//! `cargo run --example completer --features sqlite`
//!
//! Brandur's ride request as idem steps (create the ride, charge the rider, queue the receipt),
//! on embedded SQLite in a temporary file, with a completer (docs/steps.md, "Completer"). The
//! client's call stores its input with its steps (`run_steps_with`) and goes away after the
//! charge: its caller was cancelled, as when a user closes the app. Nobody retries. Three
//! completer nodes run on the same store; one of them, under their shared lease, finds the
//! operation, replays the ride and the charge, queues the receipt, and stores the result, which
//! a late retry then replays. Each effect happened once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{Completer, CompleterConfig, Error, Idempotency, Key, RecordState, SqliteStore, Steps};
use serde::{Deserialize, Serialize};

/// The ride request: what the client sends, and what the completer reads back.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RideRequest {
    rider: String,
    from: String,
    to: String,
}

/// What the request returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Ride {
    ride_id: u64,
    charge: String,
    receipt_queued: bool,
}

/// How many times each effect happened (the "outside world").
#[derive(Default)]
struct Effects {
    rides: AtomicUsize,
    charges: AtomicUsize,
    receipts: AtomicUsize,
}

/// The operation, shared by the client and the completer's handler. `gone_after_charge` makes
/// the client's caller go away between the charge and the receipt.
async fn request_ride(
    steps: Steps,
    input: Vec<u8>,
    effects: Arc<Effects>,
    gone_after_charge: bool,
) -> Result<Ride, Error> {
    let req: RideRequest = serde_json::from_slice(&input).map_err(|e| Error::Codec(e.into()))?;
    let ride_id: u64 = steps
        .run("create ride", || async {
            effects.rides.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(41)
        })
        .await?;
    let charge: String = steps
        .run("charge", || async {
            effects.charges.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(format!("ch_{ride_id}_{}", req.rider))
        })
        .await?;
    if gone_after_charge {
        // The caller is cancelled here and never comes back.
        std::future::pending::<()>().await;
    }
    let receipt_queued: bool = steps
        .run("queue receipt", || async {
            effects.receipts.fetch_add(1, Ordering::SeqCst);
            println!(
                "  receipt queued for {} ({} → {})",
                req.rider, req.from, req.to
            );
            Ok::<_, Error>(true)
        })
        .await?;
    Ok(Ride {
        ride_id,
        charge,
        receipt_queued,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(dir.path().join("rides.db")).await?;
    let engine = Idempotency::new(store);
    let effects = Arc::new(Effects::default());

    let req = RideRequest {
        rider: "rider-7".into(),
        from: "home".into(),
        to: "station".into(),
    };
    let input = serde_json::to_vec(&req)?;
    let key = Key::derive("rides", &req.rider, "req-1")?;

    println!("the client requests a ride, and goes away after the charge");
    let client = engine
        .call(key)
        .run_steps_with("rides", input.clone(), |steps| {
            request_ride(steps, input.clone(), effects.clone(), true)
        });
    // The caller gives up: the call is dropped, its claim released (no failure recorded).
    let gave_up = tokio::time::timeout(Duration::from_millis(200), client).await;
    assert!(gave_up.is_err());

    println!("three completer nodes start; one at a time holds their lease");
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let handler_effects = effects.clone();
        let completer = Completer::new(
            engine.clone(),
            CompleterConfig::new().interval(Duration::from_millis(500)),
        )?
        .handler("rides", move |steps, input| {
            request_ride(steps, input, handler_effects.clone(), false)
        });
        nodes.push(completer.spawn());
    }
    // Wait (bounded) until the operation's record is completed: the completers' first runs
    // start at once, and they run again every interval.
    let mut waited = Duration::ZERO;
    while !matches!(
        engine.store().get(&key).await?.map(|r| r.state),
        Some(RecordState::Completed(_))
    ) {
        assert!(
            waited < Duration::from_secs(10),
            "no completer finished the ride"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    for node in nodes {
        node.shutdown().await;
    }
    println!("  a completer finished the abandoned operation");

    println!("a late retry replays the stored ride");
    let retry = engine
        .call(key)
        .run_steps_with("rides", input.clone(), |steps| {
            request_ride(steps, input.clone(), effects.clone(), false)
        })
        .await?;
    assert!(retry.is_replayed());
    println!("  {:?}", retry.into_inner());

    let once = |n: &AtomicUsize| n.load(Ordering::SeqCst);
    println!(
        "effects: {} ride, {} charge, {} receipt",
        once(&effects.rides),
        once(&effects.charges),
        once(&effects.receipts)
    );
    assert_eq!(
        (
            once(&effects.rides),
            once(&effects.charges),
            once(&effects.receipts)
        ),
        (1, 1, 1)
    );
    Ok(())
}
