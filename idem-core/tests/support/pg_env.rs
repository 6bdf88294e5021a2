//! The project's rule for a test that needs PostgreSQL, shared by every test crate (included with
//! `#[path]`): the server comes from `IDEM_TEST_PG_URL`; without it the test prints
//! `skipping <test>: IDEM_TEST_PG_URL is not set` and returns, unless `IDEM_REQUIRE_PG=1` (set
//! by `scripts/test`) makes that a failure.

/// The test server's URL, or `None` after printing why `test` skips.
pub fn pg_url(test: &str) -> Option<String> {
    match std::env::var("IDEM_TEST_PG_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("IDEM_REQUIRE_PG").is_ok_and(|v| v == "1") => {
            panic!("{test}: IDEM_TEST_PG_URL is not set, and IDEM_REQUIRE_PG=1 requires it")
        }
        _ => {
            eprintln!("skipping {test}: IDEM_TEST_PG_URL is not set");
            None
        }
    }
}

/// The name of the running test (its thread's name), for messages.
#[allow(dead_code)]
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("a PostgreSQL test")
        .to_owned()
}
