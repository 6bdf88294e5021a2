//! `cargo run --example quickstart`
//!
//! A payment function behind `#[idempotent]`, on embedded SQLite in a temporary file. A burst of
//! concurrent duplicate deliveries (as a queue with at-least-once delivery or an impatient client
//! would send) charges each payment exactly once, and every delivery gets the same receipt.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Idempotency, OnLocked, SqliteStore};
use serde::{Deserialize, Serialize};

/// What the payment returns; stored once, replayed to every duplicate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: String,
    amount_cents: u64,
    /// Which charge of the card network this was: a duplicate charge would show a new number.
    charge_number: usize,
}

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error(transparent)]
    Idempotency(#[from] idem::Error),
}

struct Payments {
    idem: Idempotency,
    charges: AtomicUsize,
}

impl Payments {
    /// Charges the card. Duplicates of one `payment_id` wait for the first and replay its receipt.
    #[idempotent(
        key = payment_id,
        scope = "charge",
        engine = self.idem,
        fingerprint = amount_cents,
        on_locked = OnLocked::Wait { timeout: Duration::from_secs(30) }
    )]
    async fn charge(&self, payment_id: String, amount_cents: u64) -> Result<Receipt, PaymentError> {
        let charge_number = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        // The card network takes a moment, long enough for duplicates to pile up.
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(Receipt {
            payment_id,
            amount_cents,
            charge_number,
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path).await?;
    let payments = Arc::new(Payments {
        idem: Idempotency::new(store),
        charges: AtomicUsize::new(0),
    });

    const PAYMENTS: usize = 10;
    const DELIVERIES_EACH: usize = 20;
    let deliveries: Vec<_> = (0..PAYMENTS * DELIVERIES_EACH)
        .map(|i| {
            let payments = payments.clone();
            let n = i % PAYMENTS;
            tokio::spawn(async move {
                payments
                    .charge(format!("pay-{n:03}"), 1_000 + n as u64 * 250)
                    .await
            })
        })
        .collect();

    let mut receipts: HashMap<String, Vec<Receipt>> = HashMap::new();
    for delivery in deliveries {
        let receipt = delivery.await??;
        receipts
            .entry(receipt.payment_id.clone())
            .or_default()
            .push(receipt);
    }

    let arrived: usize = receipts.values().map(Vec::len).sum();
    let charged = payments.charges.load(Ordering::SeqCst);
    let identical = receipts.values().all(|r| r.iter().all(|x| x == &r[0]));
    println!("store:       SQLite at {}", path.display());
    println!("deliveries:  {arrived} arrived ({PAYMENTS} payments, {DELIVERIES_EACH} deliveries each, all at once)");
    println!("charges:     the card was charged {charged} times");
    println!(
        "receipts:    {}",
        if identical {
            "every delivery of a payment got the same receipt"
        } else {
            "RECEIPTS DIFFER"
        }
    );
    let replayed = payments.charge("pay-000".into(), 1_000).await?;
    println!(
        "one more:    a late retry of pay-000 replays charge #{} (charges still {})",
        replayed.charge_number,
        payments.charges.load(Ordering::SeqCst)
    );
    if charged != PAYMENTS || !identical {
        return Err("idempotency was violated".into());
    }
    Ok(())
}
