//! Diom's published Python client (PyPI `diom` 0.2.6) against idem-server on SQLite: runs
//! tests/diom_client.py with the Python `IDEM_DIOM_PYTHON` names (scripts/diom-client.sh makes
//! one, and scripts/test sets it with `IDEM_REQUIRE_DIOM=1`, so a missing client fails there;
//! elsewhere the test skips).

mod common;

use common::{run_python, serve, ADMIN, ALICE, BOB};
use idem_server::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diom_python_client_drives_every_path() {
    let Some(python) = idem_test_support::setting(
        "diom_python_client_drives_every_path",
        "IDEM_DIOM_PYTHON",
        "IDEM_REQUIRE_DIOM",
    ) else {
        return;
    };
    let server = serve(Config::default()).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/diom_client.py");
    let env = [
        ("IDEM_SERVER_URL", server.url.as_str()),
        ("IDEM_ADMIN", ADMIN),
        ("IDEM_ALICE", ALICE),
        ("IDEM_BOB", BOB),
    ];
    let (passed, stdout) = run_python(&python, script, &env).await;
    assert!(passed, "the Python client's checks failed");
    assert!(
        stdout.contains("all 10 checks passed"),
        "not every check ran"
    );
}
