//! Cross-process and failure tests of idem's PostgreSQL store (and, through the worker's
//! `storm-kv` mode, of any store opened by URL).
//!
//! The crate is not published. Its binary `idem-stress-worker` is one application node: it
//! talks to PostgreSQL through [`idem_sql::PostgresStore`] and reports what it saw on stdout,
//! one line per event. The integration tests under `tests/` start several of them, kill, pause
//! or clock-skew them, and compare their reports with what the database holds.
//!
//! This library holds what the worker and its tests share: a handle on a running worker
//! ([`worker`]), the keys, the table of executions, the 4-process storm ([`storm`]) and opening
//! any store by URL ([`stores`], for the `storm-kv` mode that runs against every backend). The
//! environment rules and the throwaway PostgreSQL cluster are the test crates' own, in
//! `idem-test-support`.
#![forbid(unsafe_code)]

pub mod charges;
pub mod outbox_loop;
pub mod stores;
pub mod storm;
pub mod worker;

/// The key of the `i`-th test key, as every worker and test derives it.
///
/// ```
/// assert_eq!(idem_stress::key(3), idem_stress::key(3));
/// assert_ne!(idem_stress::key(3), idem_stress::key(4));
/// ```
pub fn key(i: usize) -> idem_core::Key {
    idem_core::Key::derive("stress", "", &key_name(i))
        .unwrap_or_else(|e| unreachable!("test key names are valid: {e}"))
}

/// The client key of the `i`-th test key, as workers print it.
///
/// ```
/// assert_eq!(idem_stress::key_name(7), "k7");
/// ```
pub fn key_name(i: usize) -> String {
    format!("k{i}")
}

/// Creates the table in which workers record each execution of the business function.
///
/// One row per execution: the key, the worker, the claim's token, the server time it started,
/// and whether its `complete` succeeded.
pub async fn create_exec_table(pool: &sqlx::PgPool, name: &str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{name}\" (id bigserial PRIMARY KEY, key text NOT NULL, \
         worker text NOT NULL, token text NOT NULL, \
         started_at timestamptz NOT NULL DEFAULT clock_timestamp(), \
         completed boolean NOT NULL DEFAULT false)"
    ))
    .execute(pool)
    .await?;
    Ok(())
}
