//! Users depend on the facade, `idem`, which re-exports this crate: its documentation (rendered
//! as `idem`'s on docs.rs) names paths as `idem::…`, so every example compiles as a user pastes
//! it. An `idem_tower::` or `idem_core::` path in a doc comment would not resolve in such an
//! app. (The code itself names idem-core as `idem_core::`, and a doc link's target may too:
//! rustdoc resolves it, and the reader sees only its text.)

use std::path::Path;

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// `line` without the targets of its Markdown links (`[text](target)`).
fn without_link_targets(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        out.push_str(&rest[..at + 1]);
        rest = &rest[at + 2..];
        rest = rest.find(')').map_or("", |end| &rest[end + 1..]);
    }
    out.push_str(rest);
    out
}

#[test]
fn docs_name_paths_as_the_facade_does() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(
        files.len() > 15,
        "only {} sources under {}",
        files.len(),
        src.display()
    );
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if !(trimmed.starts_with("///") || trimmed.starts_with("//!")) {
                continue;
            }
            let shown = without_link_targets(trimmed);
            if shown.contains("idem_core::") || shown.contains("idem_tower::") {
                let at = file.strip_prefix(&src).unwrap_or(&file).display();
                found.push(format!("src/{at}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "write `idem::` (the facade users depend on) instead of `idem_core::` or \
         `idem_tower::`:\n{}",
        found.join("\n")
    );
}
