//! PostgreSQL for a test: the shared server of `IDEM_TEST_PG_URL`, fresh stores and their
//! clean-up on it, and a cluster of the test's own ([`TempCluster`]) from `IDEM_PG_BINDIR`.
//! Without a setting the test prints why and skips, unless `IDEM_REQUIRE_PG=1` (set by
//! `scripts/test`) makes that a failure.

use std::path::PathBuf;

use idem_sql::{PostgresStore, PostgresStoreBuilder};
use sqlx::{Connection, PgPool};

mod cluster;

pub use cluster::TempCluster;

/// The variable that makes every PostgreSQL test run.
const REQUIRE: &str = "IDEM_REQUIRE_PG";

/// The shared test server's URL (`IDEM_TEST_PG_URL`), or `None` after printing why `test`
/// skips.
///
/// ```
/// if let Some(url) = idem_test_support::postgres::pg_url("doc_example") {
///     assert!(url.starts_with("postgres"));
/// }
/// ```
pub fn pg_url(test: &str) -> Option<String> {
    crate::setting(test, "IDEM_TEST_PG_URL", REQUIRE)
}

/// The directory of PostgreSQL's server binaries (`IDEM_PG_BINDIR`), for a test that runs a
/// cluster of its own; `None` after printing why `test` skips.
///
/// ```
/// let _bindir = idem_test_support::postgres::pg_bindir("doc_example");
/// ```
pub fn pg_bindir(test: &str) -> Option<PathBuf> {
    crate::setting(test, "IDEM_PG_BINDIR", REQUIRE).map(PathBuf::from)
}

/// libfaketime's preload library: `IDEM_FAKETIME_LIB`, else the Debian package's path; `None`
/// after printing why `test` skips (a failure under `IDEM_REQUIRE_PG=1`, whose test command
/// installs it).
///
/// ```
/// let _lib = idem_test_support::postgres::faketime_lib("doc_example");
/// ```
pub fn faketime_lib(test: &str) -> Option<PathBuf> {
    if let Ok(v) = std::env::var("IDEM_FAKETIME_LIB")
        && !v.is_empty()
    {
        return Some(PathBuf::from(v));
    }
    let found = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ]
    .iter()
    .map(|dir| PathBuf::from(dir).join("faketime/libfaketime.so.1"))
    .find(|p| p.is_file());
    match found {
        Some(p) => Some(p),
        None if crate::required(REQUIRE) => {
            panic!("{test}: libfaketime is not installed (apt-get install faketime), and IDEM_REQUIRE_PG=1 requires it")
        }
        None => {
            eprintln!("skipping {test}: libfaketime is not installed (apt-get install faketime)");
            None
        }
    }
}

/// A store on a fresh table (`idem_test_<hex>`, created by the connect) on the server at `url`,
/// configured by `configure`. Drop its tables with [`drop_store_tables`].
///
/// ```no_run
/// # async fn doc() {
/// use idem_test_support::postgres::{drop_store_tables, fresh_store, pg_url};
///
/// let Some(url) = pg_url("doc_example") else { return };
/// let store = fresh_store(&url, |b| b.pruner(None)).await;
/// drop_store_tables(&store).await;
/// # }
/// ```
pub async fn fresh_store(
    url: &str,
    configure: impl FnOnce(PostgresStoreBuilder) -> PostgresStoreBuilder,
) -> PostgresStore {
    configure(PostgresStore::builder().table(crate::unique_name("idem_test")))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url} and create a fresh table: {e}"))
}

/// Drops the tables `names` where they exist; panics when the server refuses.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) {
/// idem_test_support::postgres::drop_tables(&pool, &["idem_t", "idem_t_migrations"]).await;
/// # }
/// ```
pub async fn drop_tables(pool: &PgPool, names: &[&str]) {
    for name in names {
        sqlx::raw_sql(&format!("DROP TABLE IF EXISTS \"{name}\""))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("drop table {name}: {e}"));
    }
}

/// Drops a store's records table, its steps table and its migrations ledger, through its own
/// pool.
///
/// ```no_run
/// # async fn f(store: idem_sql::PostgresStore) {
/// idem_test_support::postgres::drop_store_tables(&store).await;
/// # }
/// ```
pub async fn drop_store_tables(store: &PostgresStore) {
    let table = store.table();
    let names = store_tables(table);
    drop_tables(store.pool(), &names.each_ref().map(String::as_str)).await;
}

/// [`drop_tables`] for `Drop`: the tables `names` on the server at `url`, dropped from a runtime
/// of its own (see [`on_own_runtime`](crate::on_own_runtime)); a failure leaves a stray table on
/// the throwaway server.
///
/// ```no_run
/// idem_test_support::postgres::drop_tables_now("postgres://127.0.0.1/postgres", &["idem_t"]);
/// ```
pub fn drop_tables_now(url: &str, names: &[&str]) {
    let url = url.to_owned();
    let names: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    crate::on_own_runtime(move || async move {
        if let Ok(mut conn) = sqlx::PgConnection::connect(&url).await {
            let drop = format!("DROP TABLE IF EXISTS {}", names.join(", "));
            let _ = sqlx::raw_sql(&drop).execute(&mut conn).await;
        }
    });
}

/// [`drop_store_tables`] for `Drop`: the records table `table`, its steps and its ledger on the server at
/// `url` (see [`drop_tables_now`]).
///
/// ```no_run
/// idem_test_support::postgres::drop_store_tables_now("postgres://127.0.0.1/postgres", "idem_t");
/// ```
pub fn drop_store_tables_now(url: &str, table: &str) {
    let names = store_tables(table);
    drop_tables_now(url, &names.each_ref().map(String::as_str));
}

/// The tables a store on the records table `table` creates.
fn store_tables(table: &str) -> [String; 3] {
    [
        table.to_owned(),
        format!("{table}_steps"),
        format!("{table}_migrations"),
    ]
}
