//! What the binary's tests share: running `idem`, its JSON, and the keys they seed.

#![allow(dead_code)]

use std::process::Command;

use idem::Key;
use serde_json::Value;

/// Runs `idem` with `args`; its exit success, stdout and stderr.
pub fn idem(url: &str, table: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--url", url, "--table", table])
        .args(args)
        .output()
        .expect("the idem binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `idem` with `args` and `--json`: what it printed, parsed.
pub fn json(url: &str, table: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (ok, out, err) = idem(url, table, &all);
    assert!(ok, "idem {args:?} failed: {err}");
    serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("idem {args:?} printed no JSON ({e}): {out}"))
}

/// The key the tests seed for `client_key`.
pub fn key(client_key: &str) -> Key {
    Key::derive("charge", "tenant-7", client_key).unwrap()
}
