//! The conformance suite: one set of tests, written once in `idem_core::conformance` (feature
//! `conformance`), run against the stores of this crate; the stores of their own crates run it in
//! theirs (idem-sql's `tests/conformance/`, idem-redis's and idem-dynamodb's
//! `tests/conformance.rs`).
//!
//! Each store contributes a [`Harness`](idem_core::conformance::Harness) (a fresh empty store
//! per test) and one `suite!` line below. Time passes through `tokio::time::sleep`: the memory
//! store runs on a paused runtime with [`idem_core::TokioClock`], so its waits are instant and
//! exact.

#![cfg(feature = "conformance")]

use idem_core::conformance::suite;

mod forwarding;
mod memory;

suite!(
    memory_store,
    crate::memory::MemoryHarness,
    (start_paused = true)
);

// A wrapper of one's own that overrides `start` only, over the memory store: steps, the
// completer's query and the batch size reach the store inside (docs/stores.md, "Wrapping a
// store").
suite!(
    forwarding_memory_store,
    crate::forwarding::ForwardingHarness<crate::memory::MemoryHarness>,
    (start_paused = true)
);
