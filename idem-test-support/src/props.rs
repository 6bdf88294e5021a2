//! What the fingerprints' property tests share (idem-core's `fingerprint_props.rs`, idem-tower's
//! `body_fingerprint_props.rs`): the runner's settings, a seeded shuffle, and the integers where
//! `f64` stops being exact. Feature `props`.

use proptest::prelude::*;
use proptest::test_runner::Config;

/// The runner's settings: no failure files written into the source tree.
///
/// ```
/// assert!(idem_test_support::props::config().failure_persistence.is_none());
/// ```
pub fn config() -> Config {
    Config {
        failure_persistence: None,
        ..Config::default()
    }
}

/// A deterministic shuffle (Fisher–Yates on a small LCG), so one seed gives one order.
///
/// ```
/// let (mut a, mut b) = ([1, 2, 3, 4], [1, 2, 3, 4]);
/// idem_test_support::props::shuffle(&mut a, &mut 7);
/// idem_test_support::props::shuffle(&mut b, &mut 7);
/// assert_eq!(a, b);
/// ```
pub fn shuffle<T>(items: &mut [T], seed: &mut u64) {
    for i in (1..items.len()).rev() {
        items.swap(i, roll(seed) as usize % (i + 1));
    }
}

/// The next number of a small LCG, for choices a test makes from one seed.
///
/// ```
/// let (mut a, mut b) = (3, 3);
/// assert_eq!(idem_test_support::props::roll(&mut a), idem_test_support::props::roll(&mut b));
/// ```
pub fn roll(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

/// Integers where `f64` stops being exact, around 2^64, and anywhere.
///
/// ```
/// use proptest::strategy::{Strategy, ValueTree};
/// let mut runner = proptest::test_runner::TestRunner::deterministic();
/// let n = idem_test_support::props::big_u128().new_tree(&mut runner).unwrap().current();
/// let _ = n;
/// ```
pub fn big_u128() -> impl Strategy<Value = u128> {
    prop_oneof![
        (0u128..1000).prop_map(|d| (1 << 53) + d),
        (0u128..1000).prop_map(|d| u64::MAX as u128 - 500 + d),
        (0u128..1000).prop_map(|d| 100_000_000_000_000_000_000 + d),
        any::<u128>().prop_map(|x| x.saturating_sub(1)),
    ]
}
