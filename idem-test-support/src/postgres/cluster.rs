//! A throwaway PostgreSQL cluster that a test may stop and start at will.
//!
//! It lives in a temp dir, listens on 127.0.0.1 on a free port, and is stopped and deleted when
//! dropped. As root it runs the server as the `postgres` user, which PostgreSQL requires.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One PostgreSQL cluster of the test's own.
///
/// ```no_run
/// let bindir = std::path::PathBuf::from("/usr/lib/postgresql/15/bin");
/// let cluster = idem_test_support::postgres::TempCluster::init(&bindir);
/// cluster.start();
/// let url = cluster.url();
/// cluster.stop("fast");
/// # let _ = url;
/// ```
pub struct TempCluster {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl TempCluster {
    /// Runs `initdb` in a new temp dir and picks a free port. The server is not started yet.
    pub fn init(bindir: &Path) -> TempCluster {
        let dir = tempfile::Builder::new()
            .prefix("idem-pg-")
            .tempdir()
            .expect("create temp dir");
        let as_postgres = std::fs::metadata(dir.path()).expect("stat temp dir").uid() == 0;
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(dir.path()));
        }
        let cluster = TempCluster {
            bindir: bindir.to_owned(),
            port: crate::free_port(),
            as_postgres,
            dir,
        };
        cluster.pg(
            "initdb",
            [
                OsStr::new("-D"),
                cluster.data().as_os_str(),
                OsStr::new("-U"),
                OsStr::new("postgres"),
                OsStr::new("--auth=trust"),
                OsStr::new("--no-sync"),
            ],
        );
        cluster
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs one of PostgreSQL's programs, as `postgres` when we are root; panics on failure.
    fn pg<'a>(&self, program: &str, args: impl IntoIterator<Item = &'a OsStr>) {
        let exe = self.bindir.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        run(cmd.args(args).current_dir(self.dir.path()));
    }

    /// Starts the server and waits until it accepts connections. Prepared transactions are
    /// enabled, so a test can hold a lock that survives the sessions a shutdown terminates.
    pub fn start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100 \
             -c max_prepared_transactions=4",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        self.pg(
            "pg_ctl",
            [
                OsStr::new("-D"),
                self.data().as_os_str(),
                OsStr::new("-l"),
                log.as_os_str(),
                OsStr::new("-o"),
                OsStr::new(&opts),
                OsStr::new("-w"),
                OsStr::new("-t"),
                OsStr::new("60"),
                OsStr::new("start"),
            ],
        );
    }

    /// Stops the server with `pg_ctl stop -m <mode>` (`smart`, `fast` or `immediate`) and waits
    /// until it is down.
    pub fn stop(&self, mode: &str) {
        self.pg(
            "pg_ctl",
            [
                OsStr::new("-D"),
                self.data().as_os_str(),
                OsStr::new("-m"),
                OsStr::new(mode),
                OsStr::new("-w"),
                OsStr::new("-t"),
                OsStr::new("60"),
                OsStr::new("stop"),
            ],
        );
    }

    /// The URL of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        // Best effort: the server may already be down.
        let exe = self.bindir.join("pg_ctl");
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        let _ = cmd
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}:\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
