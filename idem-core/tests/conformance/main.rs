//! The conformance suite: one set of tests, written once, run against every store.
//!
//! Each store contributes a [`harness::Harness`] (a fresh empty store per test) and one
//! `conformance!` line below. Time passes through `tokio::time::sleep`: the memory store runs on a
//! paused runtime with [`idem_core::TokioClock`], so its waits are instant and exact; SQL stores
//! use short leases on the database's own clock and really wait them out.

#[macro_use]
mod harness;
mod engine;
mod memory;
#[cfg(feature = "postgres")]
#[path = "../support/pg_env.rs"]
mod pg_env;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
mod suite;

/// Every test body, whichever file it lives in.
mod all {
    pub use crate::engine::*;
    pub use crate::suite::*;
}

conformance!(
    memory_store,
    crate::memory::MemoryHarness,
    (start_paused = true)
);

#[cfg(feature = "sqlite")]
conformance!(
    sqlite_store,
    crate::sqlite::SqliteHarness<0>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "sqlite")]
conformance!(
    sqlite_claim_first,
    crate::sqlite::SqliteHarness<1>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "sqlite")]
conformance!(
    sqlite_read_first,
    crate::sqlite::SqliteHarness<2>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "postgres")]
conformance!(
    postgres_store,
    crate::postgres::PgHarness<0>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "postgres")]
conformance!(
    postgres_claim_first,
    crate::postgres::PgHarness<1>,
    (flavor = "multi_thread", worker_threads = 2)
);

#[cfg(feature = "postgres")]
conformance!(
    postgres_read_first,
    crate::postgres::PgHarness<2>,
    (flavor = "multi_thread", worker_threads = 2)
);
