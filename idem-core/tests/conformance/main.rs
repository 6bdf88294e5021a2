//! The conformance suite: one set of tests, written once in `idem_core::conformance` (feature
//! `conformance`), run against every store of this crate; the stores of their own crates run it
//! in theirs (idem-redis's and idem-dynamodb's `tests/conformance.rs`).
//!
//! Each store contributes a [`Harness`](idem_core::conformance::Harness) (a fresh empty store
//! per test) and one `suite!` line below. Time passes through `tokio::time::sleep`: the memory
//! store runs on a paused runtime with [`idem_core::TokioClock`], so its waits are instant and
//! exact; SQL stores use short leases on the database's own clock and really wait them out.

#![cfg(feature = "conformance")]

use idem_core::conformance::suite;

mod forwarding;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod harness;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

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

#[cfg(feature = "sqlite")]
suite!(
    sqlite_store,
    crate::sqlite::SqliteHarness<0>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "sqlite")]
suite!(
    sqlite_claim_first,
    crate::sqlite::SqliteHarness<1>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "sqlite")]
suite!(
    sqlite_read_first,
    crate::sqlite::SqliteHarness<2>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "postgres")]
suite!(
    postgres_store,
    crate::postgres::PgHarness<0>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "postgres")]
suite!(
    postgres_claim_first,
    crate::postgres::PgHarness<1>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "postgres")]
suite!(
    postgres_read_first,
    crate::postgres::PgHarness<2>,
    (flavor = "multi_thread", worker_threads = 2)
);
