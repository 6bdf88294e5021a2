//! The conformance suite (`idem_core::conformance`), run against both SQL stores in each claim
//! order. Each store contributes a [`Harness`](idem_core::conformance::Harness) (a fresh empty
//! store per test) and one `suite!` line per order. SQL stores use short leases on the
//! database's own clock and really wait them out.

use idem_core::conformance::suite;

mod harness;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

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

#[cfg(feature = "sqlite")]
suite!(
    sqlite_grouped_writers,
    crate::sqlite::SqliteHarness<3>,
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
