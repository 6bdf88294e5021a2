//! Users depend on the facade, `idem`, which re-exports this crate: its documentation (rendered
//! as `idem`'s on docs.rs) names paths as `idem::…`, so every example compiles as a user pastes
//! it. An `idem_core::` path in idem-core's sources (doc comments, and the doc strings its
//! macros build) would not resolve in such an app; inside the crate code says `crate::`.

use std::path::Path;

#[test]
fn docs_name_paths_as_the_facade_does() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = idem_test_support::rust_sources(&src);
    assert!(
        files.len() > 40,
        "only {} sources under {}",
        files.len(),
        src.display()
    );
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("idem_core::") {
                let at = file.strip_prefix(&src).unwrap_or(&file).display();
                found.push(format!("src/{at}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "write `idem::` (the facade users depend on) instead of `idem_core::`:\n{}",
        found.join("\n")
    );
}
