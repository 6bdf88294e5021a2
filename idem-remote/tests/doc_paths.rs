//! Users depend on the facade, `idem`, which re-exports `RemoteStore`: its documentation names
//! paths as `idem::…`, so every example compiles as a user pastes it. An `idem_core::` or
//! `idem_remote::` path in a doc comment of this crate's sources would not resolve in such an
//! app (the code itself imports from idem-core, as it must).

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

#[test]
fn docs_name_paths_as_the_facade_does() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(!files.is_empty(), "no sources under {}", src.display());
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let doc = line.trim_start();
            let is_doc = doc.starts_with("///") || doc.starts_with("//!");
            if is_doc && (line.contains("idem_core::") || line.contains("idem_remote::")) {
                let at = file.strip_prefix(&src).unwrap_or(&file).display();
                found.push(format!("src/{at}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "write `idem::` (the facade users depend on) in the docs:\n{}",
        found.join("\n")
    );
}
