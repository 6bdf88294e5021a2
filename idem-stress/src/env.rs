//! What the environment provides, and the project's rule when it does not.
//!
//! A test that needs PostgreSQL asks here first. Without the setting it prints
//! `skipping <test>: <VAR> is not set` to stderr and returns, unless `IDEM_REQUIRE_PG=1` (set by
//! `scripts/test`), in which case a missing setting is a failure.

use std::path::PathBuf;

/// Whether the test command asked for every PostgreSQL test to run (`IDEM_REQUIRE_PG=1`).
///
/// ```
/// let _must_run = idem_stress::env::require_pg();
/// ```
pub fn require_pg() -> bool {
    std::env::var("IDEM_REQUIRE_PG").is_ok_and(|v| v == "1")
}

fn setting(test: &str, var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if require_pg() => panic!("{test}: {var} is not set, and IDEM_REQUIRE_PG=1 requires it"),
        _ => {
            eprintln!("skipping {test}: {var} is not set");
            None
        }
    }
}

/// The shared test server's URL (`IDEM_TEST_PG_URL`), or `None` after printing why the test
/// skips.
///
/// ```
/// if let Some(url) = idem_stress::env::pg_url("doc_example") {
///     assert!(url.starts_with("postgres"));
/// }
/// ```
pub fn pg_url(test: &str) -> Option<String> {
    setting(test, "IDEM_TEST_PG_URL")
}

/// The directory of PostgreSQL's server binaries (`IDEM_PG_BINDIR`), for tests that run their
/// own cluster; `None` after printing why the test skips.
///
/// ```
/// let _bindir = idem_stress::env::pg_bindir("doc_example");
/// ```
pub fn pg_bindir(test: &str) -> Option<PathBuf> {
    setting(test, "IDEM_PG_BINDIR").map(PathBuf::from)
}

/// libfaketime's preload library: `IDEM_FAKETIME_LIB`, else the Debian package's path; `None`
/// after printing why the test skips (a failure under `IDEM_REQUIRE_PG=1`, whose test command
/// installs it).
///
/// ```
/// let _lib = idem_stress::env::faketime_lib("doc_example");
/// ```
pub fn faketime_lib(test: &str) -> Option<PathBuf> {
    if let Ok(v) = std::env::var("IDEM_FAKETIME_LIB") {
        if !v.is_empty() {
            return Some(PathBuf::from(v));
        }
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
        None if require_pg() => {
            panic!("{test}: libfaketime is not installed (apt-get install faketime), and IDEM_REQUIRE_PG=1 requires it")
        }
        None => {
            eprintln!("skipping {test}: libfaketime is not installed (apt-get install faketime)");
            None
        }
    }
}

/// The shared DynamoDB-compatible server's endpoint (`IDEM_TEST_DYNAMODB_URL`, e.g.
/// `http://127.0.0.1:8000`), or `None` after printing why the test skips; a failure instead
/// under `IDEM_REQUIRE_DYNAMODB=1` (set by `scripts/test`).
///
/// ```
/// let _url = idem_stress::env::dynamodb_url("doc_example");
/// ```
pub fn dynamodb_url(test: &str) -> Option<String> {
    match std::env::var("IDEM_TEST_DYNAMODB_URL") {
        Ok(v) if !v.is_empty() => Some(v),
        _ if std::env::var("IDEM_REQUIRE_DYNAMODB").is_ok_and(|v| v == "1") => panic!(
            "{test}: IDEM_TEST_DYNAMODB_URL is not set, and IDEM_REQUIRE_DYNAMODB=1 requires it"
        ),
        _ => {
            eprintln!("skipping {test}: IDEM_TEST_DYNAMODB_URL is not set");
            None
        }
    }
}

/// The URL of the Redis server (`cluster = false`, `IDEM_TEST_REDIS_URL`) or the node URLs of
/// the Redis Cluster (`cluster = true`, `IDEM_TEST_REDIS_CLUSTER_URLS`, comma-separated) that
/// `scripts/test` starts, or `None` after printing why `test` skips; a failure instead under
/// `IDEM_REQUIRE_REDIS=1` (set by `scripts/test`).
///
/// ```
/// let _urls = idem_stress::env::redis_urls("doc_example", false);
/// ```
pub fn redis_urls(test: &str, cluster: bool) -> Option<String> {
    let var = if cluster {
        "IDEM_TEST_REDIS_CLUSTER_URLS"
    } else {
        "IDEM_TEST_REDIS_URL"
    };
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if std::env::var("IDEM_REQUIRE_REDIS").is_ok_and(|v| v == "1") => {
            panic!("{test}: {var} is not set, and IDEM_REQUIRE_REDIS=1 requires it")
        }
        _ => {
            eprintln!("skipping {test}: {var} is not set");
            None
        }
    }
}
