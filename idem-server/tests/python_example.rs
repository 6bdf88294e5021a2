//! docs/server.md's Python example, examples/python/guard_handler.py: the page quotes the file
//! word for word, and the file guards a handler against a real server, with httpx and with
//! Diom's Python client, run by the Python `IDEM_DIOM_PYTHON` names (scripts/diom-client.sh
//! makes one, and scripts/test sets it with `IDEM_REQUIRE_DIOM=1`, so a missing client fails
//! there; elsewhere the test skips).

mod common;

use common::{run_python, serve, ALICE};
use idem_server::Config;

const EXAMPLE: &str = include_str!("../../examples/python/guard_handler.py");

#[test]
fn the_docs_quote_the_python_example_word_for_word() {
    let doc = include_str!("../../docs/server.md");
    assert!(
        doc.contains(&format!("```python\n{EXAMPLE}```\n")),
        "docs/server.md must quote examples/python/guard_handler.py whole, in a ```python \
         block: paste the file in again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_guards_a_handler() {
    let Some(python) = idem_test_support::setting(
        "the_python_example_guards_a_handler",
        "IDEM_DIOM_PYTHON",
        "IDEM_REQUIRE_DIOM",
    ) else {
        return;
    };
    let server = serve(Config::default()).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/python/guard_handler.py"
    );
    let env = [
        ("IDEM_SERVER_URL", server.url.as_str()),
        ("IDEM_TOKEN", ALICE),
    ];
    let (passed, stdout) = run_python(&python, script, &env).await;
    assert!(passed, "the example failed");
    assert!(
        stdout.contains("the card was charged once per order"),
        "the example did not run to its end"
    );
    // The two guarded keys are completed in the server's store, each with its receipt.
    for key in ["order-1001-guarded", "order-1001-guarded_with_diom"] {
        let (status, _, body) = common::call(
            &server.app,
            common::json(
                "/api/v1.idempotency.start",
                Some(ALICE),
                serde_json::json!({"key": key, "lock_period_ms": 1000}),
            ),
        )
        .await;
        let answer: serde_json::Value = serde_json::from_slice(&body).expect("a JSON answer");
        assert_eq!(
            (status, &answer["status"]),
            (200, &"completed".into()),
            "{key}: {answer}"
        );
    }
}
