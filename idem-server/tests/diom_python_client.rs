//! Diom's published Python client (PyPI `diom` 0.2.6) against idem-server on SQLite: runs
//! tests/diom_client.py with the Python `IDEM_DIOM_PYTHON` names (scripts/diom-client.sh makes
//! one, and scripts/test sets it with `IDEM_REQUIRE_DIOM=1`, so a missing client fails there;
//! elsewhere the test skips).

mod common;

use std::process::Stdio;

use common::{serve, ADMIN, ALICE, BOB};
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
    let run = tokio::process::Command::new(&python)
        .arg(script)
        .env("IDEM_SERVER_URL", &server.url)
        .env("IDEM_ADMIN", ADMIN)
        .env("IDEM_ALICE", ALICE)
        .env("IDEM_BOB", BOB)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), run)
        .await
        .expect("the Python client ran for over two minutes")
        .expect("the Python named by IDEM_DIOM_PYTHON does not run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the Python client's checks failed");
    assert!(
        stdout.contains("all 10 checks passed"),
        "not every check ran"
    );
}
