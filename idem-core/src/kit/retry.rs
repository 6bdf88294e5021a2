//! Rerunning load-modify-save when a write lost a race.

use std::future::Future;
use std::time::Duration;

/// Errors that may mean "someone else wrote first; reload and try again".
///
/// The SQL kit's `ConcurrencyError` implements it (only its `Conflict` is one). Implement it
/// for your own error type when it wraps a `ConcurrencyError`, so [`retry_on_conflict`] can see
/// through it.
///
/// ```
/// use idem::kit::{ConcurrencyError, IsConflict};
///
/// enum BankError { Kit(ConcurrencyError), Overdrawn }
///
/// impl IsConflict for BankError {
///     fn is_conflict(&self) -> bool {
///         matches!(self, BankError::Kit(e) if e.is_conflict())
///     }
/// }
/// assert!(!BankError::Overdrawn.is_conflict());
/// ```
pub trait IsConflict {
    /// Whether the failed attempt should be run again on fresh data.
    fn is_conflict(&self) -> bool;
}

/// How often and how patiently [`retry_on_conflict`] retries.
///
/// The wait before retry `k` (1-based) is drawn uniformly from `[cap / 2, cap]` with
/// `cap = min(max_backoff, initial_backoff * 2^(k-1))`: exponential, so a hot row is given
/// room, and jittered, so writers that collided once do not collide again in lockstep.
///
/// ```
/// use std::time::Duration;
/// use idem::kit::RetryPolicy;
/// let policy = RetryPolicy::new(20).backoff(Duration::from_millis(1), Duration::from_millis(50));
/// assert_eq!(policy.max_attempts(), 20);
/// assert_eq!(RetryPolicy::default().max_attempts(), 10);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 10 attempts, waits from 5 ms growing to at most 500 ms.
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(500),
        }
    }
}

impl RetryPolicy {
    /// At most `max_attempts` runs in all (the first one included; 0 counts as 1), with the
    /// default backoff.
    ///
    /// With `n` writers contending for one row, every conflict of one writer means another
    /// writer's save succeeded, so `max_attempts >= n` lets every writer through.
    ///
    /// ```
    /// assert_eq!(idem::kit::RetryPolicy::new(0).max_attempts(), 1);
    /// ```
    pub fn new(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            ..RetryPolicy::default()
        }
    }

    /// Waits start near `initial` and double up to `max` (a `max` below `initial` is raised to
    /// it).
    ///
    /// ```
    /// use std::time::Duration;
    /// let p = idem::kit::RetryPolicy::new(3).backoff(Duration::ZERO, Duration::ZERO);
    /// assert_eq!(p.delay(1, &mut fastrand::Rng::new()), Duration::ZERO);
    /// ```
    pub fn backoff(mut self, initial: Duration, max: Duration) -> RetryPolicy {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    /// The most runs of the operation, the first included.
    ///
    /// ```
    /// assert_eq!(idem::kit::RetryPolicy::new(4).max_attempts(), 4);
    /// ```
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The wait before retry number `retry` (1 for the wait after the first failed run).
    ///
    /// ```
    /// use std::time::Duration;
    /// let p = idem::kit::RetryPolicy::new(5).backoff(Duration::from_millis(10), Duration::from_millis(25));
    /// let mut rng = fastrand::Rng::with_seed(7);
    /// let d = p.delay(3, &mut rng);
    /// assert!(d >= Duration::from_micros(12_500) && d <= Duration::from_millis(25));
    /// ```
    pub fn delay(&self, retry: u32, rng: &mut fastrand::Rng) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        let cap = self
            .initial_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff);
        let cap_nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.u64(cap_nanos / 2..=cap_nanos))
    }
}

/// Runs `operation` (typically load, modify, save) until it succeeds, fails with something other
/// than a conflict, or has run `policy.max_attempts()` times; then returns the last result, so a
/// caller out of attempts gets the last conflict.
///
/// Each run must start from fresh data: load inside the closure, not outside.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// # use idem::kit::{Entity, SqlQuery};
/// # use sqlx::{sqlite::SqliteRow, Row, Sqlite};
/// # struct Account { id: String, balance: i64 }
/// # impl Entity<Sqlite> for Account {
/// #     type Id = String;
/// #     const COLUMNS: &'static [&'static str] = &["balance"];
/// #     fn id(&self) -> &String { &self.id }
/// #     fn bind<'q>(&'q self, q: SqlQuery<'q, Sqlite>) -> SqlQuery<'q, Sqlite> { q.bind(self.balance) }
/// #     fn from_row(row: &SqliteRow) -> Result<Self, sqlx::Error> {
/// #         Ok(Account { id: row.try_get("id")?, balance: row.try_get("balance")? })
/// #     }
/// # }
/// use idem::kit::{retry_on_conflict, ConcurrencyError, RetryPolicy, VersionedTable};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// # sqlx::query("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)").execute(&pool).await?;
/// let accounts = VersionedTable::<Account, Sqlite>::new("accounts")?;
/// let _ = accounts.insert(&mut *pool.acquire().await?, Account { id: "alice".into(), balance: 0 }).await?;
/// let id = "alice".to_string();
///
/// let version = retry_on_conflict(&RetryPolicy::default(), || async {
///     let mut conn = pool.acquire().await.map_err(ConcurrencyError::from)?;
///     let mut account = accounts.load(&mut conn, &id).await?;
///     account.balance += 10;
///     accounts.save(&mut conn, &mut account).await
/// })
/// .await?;
/// assert_eq!(version.get(), 2);
/// # Ok(()) }
/// # }
/// ```
pub async fn retry_on_conflict<T, E, F, Fut>(policy: &RetryPolicy, mut operation: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: IsConflict,
{
    let mut rng = fastrand::Rng::new();
    let mut attempt = 1;
    loop {
        match operation().await {
            Err(e) if e.is_conflict() && attempt < policy.max_attempts => {
                let wait = policy.delay(attempt, &mut rng);
                tracing::debug!(attempt, ?wait, "version conflict; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            outcome => return outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// What the SQL kit's `ConcurrencyError` is to the retry loop: a conflict, or not.
    #[derive(Debug)]
    enum ConcurrencyError {
        Conflict,
        NotFound,
    }

    impl IsConflict for ConcurrencyError {
        fn is_conflict(&self) -> bool {
            matches!(self, ConcurrencyError::Conflict)
        }
    }

    fn conflict() -> ConcurrencyError {
        ConcurrencyError::Conflict
    }

    #[test]
    fn delays_grow_and_stay_within_bounds() {
        let policy =
            RetryPolicy::new(10).backoff(Duration::from_millis(4), Duration::from_millis(40));
        let mut rng = fastrand::Rng::with_seed(1);
        for (retry, cap) in [
            (1, 4),
            (2, 8),
            (3, 16),
            (4, 32),
            (5, 40),
            (30, 40),
            (u32::MAX, 40),
        ] {
            for _ in 0..100 {
                let d = policy.delay(retry, &mut rng);
                let cap = Duration::from_millis(cap);
                assert!(
                    d >= cap / 2 && d <= cap,
                    "retry {retry}: {d:?} outside [{:?}, {cap:?}]",
                    cap / 2
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_conflicts_until_success() {
        let runs = AtomicU32::new(0);
        let out: Result<u32, ConcurrencyError> =
            retry_on_conflict(&RetryPolicy::new(5), || async {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                if n < 3 {
                    Err(conflict())
                } else {
                    Ok(n)
                }
            })
            .await;
        assert_eq!(out.unwrap(), 3);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn returns_the_last_conflict_when_attempts_run_out() {
        let runs = AtomicU32::new(0);
        let out: Result<(), ConcurrencyError> = retry_on_conflict(&RetryPolicy::new(4), || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err(conflict())
        })
        .await;
        assert!(matches!(out, Err(ConcurrencyError::Conflict)));
        assert_eq!(runs.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_are_not_retried() {
        let runs = AtomicU32::new(0);
        let out: Result<(), ConcurrencyError> = retry_on_conflict(&RetryPolicy::new(4), || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err(ConcurrencyError::NotFound)
        })
        .await;
        assert!(matches!(out, Err(ConcurrencyError::NotFound)));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
