//! Clocks for the memory store. SQL stores use the database server's clock instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time, injectable so tests control it.
///
/// ```
/// use idem::{Clock, ManualClock};
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(std::time::Duration::from_secs(5));
/// assert_eq!(clock.now().duration_since(t0).unwrap().as_secs(), 5);
/// ```
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The operating system's clock.
///
/// ```
/// use idem::{Clock, SystemClock};
/// assert!(SystemClock.now() > std::time::UNIX_EPOCH);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// ```
/// use idem::{Clock, ManualClock};
/// let clock = ManualClock::new();
/// let other = clock.clone();
/// clock.advance(std::time::Duration::from_millis(10));
/// assert_eq!(clock.now(), other.now());
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at 2030-01-01T00:00:00Z.
    pub fn new() -> ManualClock {
        ManualClock {
            micros: Arc::new(AtomicU64::new(1_893_456_000_000_000)),
        }
    }

    /// A clock standing at `t` (at the Unix epoch if `t` is before it), for a test whose store
    /// keeps time on the system clock while the test moves this one.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use idem::{Clock, ManualClock};
    /// let t = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    /// assert_eq!(ManualClock::at(t).now(), t);
    /// ```
    pub fn at(t: SystemTime) -> ManualClock {
        let micros = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros();
        ManualClock {
            micros: Arc::new(AtomicU64::new(u64::try_from(micros).unwrap_or(u64::MAX))),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.micros
            .fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.micros.load(Ordering::SeqCst))
    }
}

/// Wall-clock time that follows tokio's clock, so a test with a paused runtime
/// (`#[tokio::test(start_paused = true)]`) moves leases forward with `tokio::time::advance` and
/// with auto-advance while every task sleeps.
///
/// ```
/// use idem::{Clock, TokioClock};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let clock = TokioClock::new();
/// assert!(clock.now() >= std::time::UNIX_EPOCH);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TokioClock {
    wall: SystemTime,
    base: tokio::time::Instant,
}

impl TokioClock {
    /// Starts at the current system time and follows tokio's clock from here.
    pub fn new() -> TokioClock {
        TokioClock {
            wall: SystemTime::now(),
            base: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        self.wall + self.base.elapsed()
    }
}
