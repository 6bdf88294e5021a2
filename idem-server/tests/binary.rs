//! The `idem-server` binary as a user starts it: README.md's server command run as written
//! (started, called once, stopped), and the pool-size flag `--max-connections`
//! (`IDEM_MAX_CONNECTIONS`) with its bounds.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::ADMIN;

/// The line of README.md that starts idem-server, after `cargo run -p idem-server -- `.
const README_PREFIX: &str = "cargo run -p idem-server -- ";

/// The arguments of README.md's server command: the words after `cargo run -p idem-server --`
/// on the line of its own that shows it (no quotes, no variables: it runs as written), which
/// docs/server.md shows too.
fn readme_arguments() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let line = readme
        .lines()
        .find(|l| l.starts_with(README_PREFIX))
        .expect("README.md shows `cargo run -p idem-server -- …` on a line of its own");
    assert!(
        include_str!("../../docs/server.md").contains(&format!("\n{line}\n")),
        "docs/server.md shows README.md's server command as it is: {line}"
    );
    let args = &line[README_PREFIX.len()..];
    assert!(
        !args.contains(['"', '\'', '$', '`', '\\']),
        "README.md's server command must run as written, without quotes or variables: {args}"
    );
    args.split_whitespace().map(str::to_owned).collect()
}

/// The idem-server binary with `args`, in `dir`, listening on `addr` (through `IDEM_LISTEN`,
/// so that the arguments stay as given), with none of the server's settings inherited from the
/// test's environment.
fn server(dir: &Path, addr: &str, args: &[String]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem-server"));
    command.current_dir(dir).args(args).env("IDEM_LISTEN", addr);
    for inherited in [
        "IDEM_STORE",
        "IDEM_ADMIN_TOKEN",
        "IDEM_CALLER_TOKENS",
        "IDEM_TABLE",
        "IDEM_MAX_CONNECTIONS",
        "IDEM_REQUIRE_TOKEN",
        "IDEM_LOG_JSON",
    ] {
        command.env_remove(inherited);
    }
    command
}

/// Waits (at most 60 s, polling) for `addr` to accept a connection; panics with what the
/// server wrote to `stderr` if it exits first.
/// The line without its terminal colour codes (`ESC [ … m`).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Starts `command` (made by [`server`] with the address `127.0.0.1:0`, so the system picks a
/// free port and no other process can hold it first) and reads its stdout until it logs that it
/// listens: its pid, the process, that log line (without colours) and the address it listens on.
fn listening(command: &mut Command) -> (u32, idem_test_support::Process, String, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the idem-server binary starts");
    let pid = child.id();
    let stdout = child.stdout.take().expect("the server's stdout");
    let mut stderr = child.stderr.take();
    let mut server = idem_test_support::Process::new(child);
    let (lines, read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Read to the end even once nobody listens: a closed pipe would fail the server's
        // next log line.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(plain(&line));
        }
    });
    for _ in 0..600 {
        match read.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line.contains("idem-server listening") => {
                let addr = line
                    .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
                    .find(|word| word.starts_with("127.0.0.1:") && word.len() > "127.0.0.1:".len())
                    .unwrap_or_else(|| panic!("no address in the server's log line: {line}"))
                    .to_owned();
                return (pid, server, line, addr);
            }
            Ok(_) | Err(_) => {}
        }
        if let Some(status) = server.exited() {
            let mut said = String::new();
            if let Some(stderr) = stderr.as_mut() {
                let _ = stderr.read_to_string(&mut said);
            }
            panic!("the server exited at start: {status}: {said}");
        }
    }
    panic!("the server never logged that it listens");
}

/// Starts `key` as the caller of `token`: the server answers `200 {"status":"started"}`.
fn start_key(addr: &str, token: &str, key: &str) {
    let body = format!(r#"{{"key":"{key}","lock_period_ms":15000}}"#);
    let answer = post(addr, "/api/v1.idempotency.start", token, &body);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(r#"{"status":"started"}"#), "{answer}");
}

/// One JSON `POST` to `path` with `token`: the whole answer, head and body.
fn post(addr: &str, path: &str, token: &str, body: &str) -> String {
    let mut conn = TcpStream::connect(addr).expect("the server accepts a connection");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes())
        .expect("the request is sent");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("an answer");
    answer
}

/// SIGTERM, then waits (at most 30 s) for a clean exit.
fn stop(pid: u32, server: &mut idem_test_support::Process) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    for _ in 0..300 {
        if let Some(exit) = server.exited() {
            assert!(
                exit.success(),
                "the server exited with {exit} after SIGTERM"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the server did not exit within 30 s of SIGTERM");
}

#[test]
fn the_readme_server_command_runs_as_written() {
    let args = readme_arguments();
    let token = args
        .iter()
        .position(|a| a == "--admin-token")
        .and_then(|i| args.get(i + 1))
        .expect("README.md's server command gives --admin-token")
        .clone();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (pid, mut server, _, addr) = listening(&mut server(dir.path(), "127.0.0.1:0", &args));
    start_key(&addr, &token, "readme-1");
    stop(pid, &mut server);
    assert!(
        dir.path().join("idem.db").exists(),
        "the SQLite file the command names was not made in the working directory"
    );
}

/// `--max-connections` takes 1 to 1024, only for the SQL stores, and reaches the store: the
/// server says the pool it opened when it starts.
#[test]
fn the_pool_size_flag_is_bounded_and_reaches_the_store() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = format!("sqlite://{}?mode=rwc", dir.path().join("idem.db").display());
    let base = |extra: &[&str]| {
        let mut args = vec![
            "--admin-token".to_owned(),
            ADMIN.to_owned(),
            "--store".to_owned(),
            store.clone(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    };
    for (refused, says) in [
        (base(&["--max-connections", "0"]), "1..=1024"),
        (base(&["--max-connections", "1025"]), "1..=1024"),
        (base(&["--max-connections", "many"]), "--max-connections"),
    ] {
        let out = server(dir.path(), "127.0.0.1:1", &refused)
            .output()
            .expect("the idem-server binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{refused:?} was taken");
        assert!(stderr.contains(says), "{refused:?}: {stderr}");
    }
    // A store without a pool of connections (built with the feature `redis`): the flag is
    // refused, naming it.
    if cfg!(feature = "redis") {
        let redis = vec![
            "--admin-token".to_owned(),
            ADMIN.to_owned(),
            "--store".to_owned(),
            "redis://127.0.0.1:1".to_owned(),
            "--max-connections".to_owned(),
            "4".to_owned(),
        ];
        let out = server(dir.path(), "127.0.0.1:1", &redis)
            .output()
            .expect("the idem-server binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "--max-connections was taken for redis"
        );
        assert!(stderr.contains("--max-connections"), "{stderr}");
    }

    // In the environment, as every flag: the server starts with that pool and serves.
    let mut command = server(dir.path(), "127.0.0.1:0", &base(&["--log-json"]));
    let (pid, mut server, line, addr) = listening(command.env("IDEM_MAX_CONNECTIONS", "2"));
    start_key(&addr, ADMIN, "pool-1");
    stop(pid, &mut server);
    let logged: serde_json::Value =
        serde_json::from_str(&line).expect("the server logs JSON lines with --log-json");
    assert_eq!(logged["fields"]["max_connections"], 2, "{logged}");
}
