//! Whether a SQL store's `start` claims first or reads first, and the running estimate that
//! picks between them.

use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::ClaimOutcome;
use idem_core::Error;

/// Which statement a SQL store's [`Store::claim`](idem_core::Store::claim) runs first.
///
/// A claim is always one conditional `INSERT … ON CONFLICT … DO UPDATE … WHERE expired`; what
/// differs is whether a `SELECT` of the live record comes before it or after it:
///
/// | order | new key | live key (replay, locked, reused, uncertain, tombstone) |
/// |---|---|---|
/// | [`ClaimFirst`](ClaimOrder::ClaimFirst) | 1 statement: the claim | 2: the claim, which meets the live row and leaves it alone, then the `SELECT` |
/// | [`ReadFirst`](ClaimOrder::ReadFirst) | 2: the `SELECT`, which finds nothing, then the claim | 1: the `SELECT` |
///
/// Claiming first is cheapest when most keys are new, reading first when most are repeats, and
/// a live key is cheaper to read than to meet in a claim: the claim takes the database's write
/// lock (SQLite) or a row lock (PostgreSQL) only to change nothing. The default,
/// [`Adaptive`](ClaimOrder::Adaptive), follows the traffic: each store keeps a running share of
/// the recent `start`s that found a live record and reads first while that share is above one
/// half. Ordinary traffic (nearly every key new) then costs one statement per claim, and a storm
/// of retries or replays one statement per repeat. Correctness does not depend on the order:
/// either way the conditional claim alone decides who owns a key.
///
/// Transactional mode ([`TransactionalStore`](crate::TransactionalStore)) always claims first:
/// a read before the write would make the transaction's write wait or fail on a row it read.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// use idem::{ClaimOrder, SqliteStore};
/// // A webhook receiver whose senders retry a lot: answer repeats with one read.
/// let store = SqliteStore::builder()
///     .claim_order(ClaimOrder::ReadFirst)
///     .connect("sqlite::memory:")
///     .await?;
/// assert_eq!(store.claim_order(), ClaimOrder::ReadFirst);
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))] fn main() {}
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClaimOrder {
    /// Claim first while most recent `start`s found a new key, read first while most found a live
    /// record (the default).
    #[default]
    Adaptive,
    /// Always claim first: one statement for a new key, two for a live one.
    ClaimFirst,
    /// Always read first: one statement for a live key, two for a new one.
    ReadFirst,
}

/// The estimate is a fixed-point share in `0..=ONE`.
const ONE: u32 = 1 << 16;
/// Each observation moves the share 1/16 of the way towards 0 or ONE: about the last 16 to 32
/// `start`s decide, so a storm of retries switches the order within a few dozen calls.
const WEIGHT_SHIFT: u32 = 4;

/// A store's claim order and, for [`ClaimOrder::Adaptive`], its running share of `start`s that
/// found a live record. Shared by all clones of a store.
#[derive(Debug, Default)]
pub(crate) struct ClaimPath {
    order: ClaimOrder,
    /// Starts as 0: new keys are the common case, so a fresh store claims first.
    live_share: AtomicU32,
}

impl ClaimPath {
    pub(crate) fn new(order: ClaimOrder) -> ClaimPath {
        ClaimPath {
            order,
            live_share: AtomicU32::new(0),
        }
    }

    pub(crate) fn order(&self) -> ClaimOrder {
        self.order
    }

    /// Whether the next `start` should read before it claims.
    pub(crate) fn read_first(&self) -> bool {
        match self.order {
            ClaimOrder::ClaimFirst => false,
            ClaimOrder::ReadFirst => true,
            ClaimOrder::Adaptive => self.live_share.load(Ordering::Relaxed) > ONE / 2,
        }
    }

    /// Records what a `start` found: a live record is any that refused the claim (completed,
    /// locked, uncertain, a tombstone, a reused key or a changed policy), which a read first
    /// answers alone. Other errors say nothing about the key and are not counted.
    pub(crate) fn observe(&self, result: Result<&ClaimOutcome, &Error>) {
        if self.order != ClaimOrder::Adaptive {
            return;
        }
        let live = match result {
            Ok(ClaimOutcome::Claimed(_)) => false,
            Ok(
                ClaimOutcome::Completed(_)
                | ClaimOutcome::Locked { .. }
                | ClaimOutcome::Uncertain { .. }
                | ClaimOutcome::Expired { .. },
            )
            | Err(Error::KeyReused | Error::PolicyChanged { .. }) => true,
            Err(_) => return,
        };
        // A plain load and store: concurrent updates may overwrite each other, which only
        // drops an observation from an estimate.
        let old = self.live_share.load(Ordering::Relaxed);
        let target = if live { ONE } else { 0 };
        let new = old - (old >> WEIGHT_SHIFT) + (target >> WEIGHT_SHIFT);
        self.live_share.store(new, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::Claim;
    use idem_core::{Key, Token};

    fn started() -> Result<ClaimOutcome, Error> {
        let key = Key::derive("s", "c", "k").map_err(Error::from);
        key.map(|k| ClaimOutcome::Claimed(Claim::new(k, Token::random())))
    }

    fn locked() -> Result<ClaimOutcome, Error> {
        Ok(ClaimOutcome::Locked {
            retry_after: std::time::Duration::ZERO,
        })
    }

    #[test]
    fn adaptive_starts_claiming_first_and_follows_the_traffic() {
        let path = ClaimPath::new(ClaimOrder::Adaptive);
        assert!(!path.read_first());
        // A storm of repeats switches to reading first within a few dozen calls...
        let mut calls = 0;
        while !path.read_first() {
            path.observe(locked().as_ref());
            calls += 1;
            assert!(calls <= 32, "still claiming first after {calls} repeats");
        }
        assert!(calls >= 8, "switched after only {calls} repeats");
        // ... and a run of new keys switches back.
        let mut calls = 0;
        while path.read_first() {
            path.observe(started().as_ref());
            calls += 1;
            assert!(calls <= 32, "still reading first after {calls} new keys");
        }
        // Key reuse counts as a live record; store errors do not count at all.
        for _ in 0..64 {
            path.observe(Err(&Error::KeyReused));
        }
        assert!(path.read_first());
        for _ in 0..64 {
            path.observe(Err(&Error::LeaseLost));
        }
        assert!(path.read_first());
    }

    #[test]
    fn pinned_orders_never_change() {
        let claim_first = ClaimPath::new(ClaimOrder::ClaimFirst);
        let read_first = ClaimPath::new(ClaimOrder::ReadFirst);
        for _ in 0..64 {
            claim_first.observe(locked().as_ref());
            read_first.observe(started().as_ref());
        }
        assert!(!claim_first.read_first());
        assert!(read_first.read_first());
        assert_eq!(ClaimPath::default().order(), ClaimOrder::Adaptive);
    }
}
