//! A fresh store of each kind as an `Arc<dyn Store>`, and what it leaves behind: what the
//! suites that run every case once per store (the HTTP and gRPC layers') instantiate their
//! cases with. Each function returns `None` after saying why when its server is missing (see
//! [`setting`](crate::setting)).

use std::sync::Arc;

use idem_core::{MemoryStore, Store};

/// What a store leaves behind after a case.
pub enum Leftover {
    Nothing,
    /// A temporary directory holding a SQLite file: deleted when dropped.
    #[cfg(feature = "sqlite")]
    Dir(#[allow(dead_code)] tempfile::TempDir),
    /// A table of its own on the shared PostgreSQL server.
    #[cfg(feature = "postgres")]
    PgTable(idem_sql::PostgresStore),
    /// A server of the test's own (stopped when dropped), or a table on the shared one.
    #[cfg(feature = "dynamodb")]
    Dynamo(
        #[allow(dead_code)] Option<crate::dynamodb::Server>,
        String,
        String,
    ),
}

impl Leftover {
    /// Removes it. A failing case skips this, which leaves at most a stray table behind.
    pub async fn remove(self) {
        #[cfg(feature = "postgres")]
        if let Leftover::PgTable(store) = &self {
            crate::postgres::drop_store_tables(store).await;
        }
        #[cfg(feature = "dynamodb")]
        if let Leftover::Dynamo(None, url, table) = &self {
            let client = crate::dynamodb::client(url);
            let _ = client.delete_table().table_name(table).send().await;
        }
        // A directory is deleted as `self` goes out of scope here.
        let _ = self;
    }
}

/// A new memory store.
pub async fn memory() -> Option<(Arc<dyn Store>, Leftover)> {
    Some((Arc::new(MemoryStore::new()), Leftover::Nothing))
}

/// A SQLite store on a fresh database file.
#[cfg(feature = "sqlite")]
pub async fn sqlite() -> Option<(Arc<dyn Store>, Leftover)> {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_sql::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap();
    Some((Arc::new(store), Leftover::Dir(dir)))
}

/// A PostgreSQL store on a table of its own in the server named by `IDEM_TEST_PG_URL`. Without
/// the variable the case prints why and skips, unless `IDEM_REQUIRE_PG=1` makes that a failure.
#[cfg(feature = "postgres")]
pub async fn postgres() -> Option<(Arc<dyn Store>, Leftover)> {
    let url = crate::postgres::pg_url(&crate::current_test())?;
    let store = crate::postgres::fresh_store(&url, |b| b).await;
    Some((Arc::new(store.clone()), Leftover::PgTable(store)))
}

/// A server of the test's own when `scripts/test` gave the command to start one (see
/// `dynamodb::own_or_shared_server` for why), else a fresh table on `IDEM_TEST_DYNAMODB_URL`.
/// Without this crate's feature `dynamodb` (which a crate outside idem-dynamodb's tests gets
/// from `--workspace --all-features`), the case skips as for a missing server ([`not_built`]).
#[cfg(not(feature = "dynamodb"))]
pub async fn dynamodb() -> Option<(Arc<dyn Store>, Leftover)> {
    not_built("dynamodb", "IDEM_REQUIRE_DYNAMODB")
}

/// A server of the test's own when `scripts/test` gave the command to start one (see
/// [`own_or_shared_server`](crate::dynamodb::own_or_shared_server) for why), else a fresh table
/// on `IDEM_TEST_DYNAMODB_URL`.
#[cfg(feature = "dynamodb")]
pub async fn dynamodb() -> Option<(Arc<dyn Store>, Leftover)> {
    let (url, server) = crate::dynamodb::own_or_shared_server().await?;
    // One machine's clocks: a 100 ms margin, as the conformance harness takes, so a case that
    // waits out a short lease or retention (uncertain claims, tombstones) waits the same on
    // every store.
    let store = crate::dynamodb::fresh_store(&url, |b| {
        b.clock_skew_margin(std::time::Duration::from_millis(100))
    })
    .await;
    let table = store.table().to_owned();
    Some((Arc::new(store), Leftover::Dynamo(server, url, table)))
}

/// A Redis store under a fresh key prefix on the shared server that `scripts/test` starts; its
/// records expire by themselves, so nothing is left to remove. Without this crate's feature
/// `redis` (which a crate outside idem-redis's tests gets from `--workspace --all-features`),
/// the case skips as for a missing server ([`not_built`]).
pub async fn redis_single() -> Option<(Arc<dyn Store>, Leftover)> {
    redis(false).await
}

/// The same on the shared Redis Cluster.
pub async fn redis_cluster() -> Option<(Arc<dyn Store>, Leftover)> {
    redis(true).await
}

#[cfg(feature = "redis")]
async fn redis(cluster: bool) -> Option<(Arc<dyn Store>, Leftover)> {
    use crate::redis::{fresh_store, Flavor};
    let flavor = if cluster {
        Flavor::Cluster
    } else {
        Flavor::Single
    };
    let store = fresh_store(flavor, |b| b).await?;
    Some((Arc::new(store), Leftover::Nothing))
}

#[cfg(not(feature = "redis"))]
async fn redis(_cluster: bool) -> Option<(Arc<dyn Store>, Leftover)> {
    not_built("redis", "IDEM_REQUIRE_REDIS")
}

/// `None` after printing why the running test skips: the store's crate is not in this build
/// (this crate's feature `store` is off), which `require` (such as `IDEM_REQUIRE_REDIS`) set to
/// `1` makes a failure, as for a missing server. The store crates moved out of idem-core, so a
/// suite of another crate that runs on every store (the HTTP layer's, observe's) gets them only
/// through this crate's features.
///
/// ```
/// let none: Option<()> = idem_test_support::stores::not_built("doc", "IDEM_REQUIRE_DOC_STORE");
/// assert!(none.is_none());
/// ```
pub fn not_built<T>(store: &str, require: &str) -> Option<T> {
    let test = crate::current_test();
    if crate::required(require) {
        panic!("{test}: idem-test-support is built without its feature `{store}`, and {require}=1 requires it (build with --workspace --all-features)");
    }
    eprintln!("skipping {test}: idem-test-support is built without its feature `{store}`");
    None
}

/// Instantiates every case of a suite once per store: for each `module => store` (one of this
/// module's functions, behind the attributes given, such as `#[cfg(feature = "sqlite")]`), a
/// module holding one multi-threaded tokio test per case, which runs `<module>::<case>` on a
/// fresh store and then removes what the store leaves behind; a store whose server is missing
/// skips (see [`setting`](crate::setting)). The suite's cases are `async fn <case>(store:
/// Arc<dyn Store>)` in a module beside the invocation, named before the case list.
///
/// ```
/// mod cases {
///     pub async fn starts_empty(store: std::sync::Arc<dyn idem_core::Store>) {
///         let _ = store;
///     }
/// }
/// idem_test_support::per_store! {
///     cases: cases::{starts_empty};
///     memory_store => idem_test_support::stores::memory,
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! per_store {
    (cases: $module:ident :: $cases:tt; $($(#[$attr:meta])* $name:ident => $store:path),* $(,)?) => {
        $(
            $(#[$attr])*
            mod $name {
                $crate::per_store!(@each $store; $module; $cases);
            }
        )*
    };
    (@each $store:path; $module:ident; {$($case:ident),* $(,)?}) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let Some((store, leftover)) = $store().await {
                    super::$module::$case(store).await;
                    leftover.remove().await;
                }
            }
        )*
    };
}
