//! A handle on one running `idem-stress-worker` process: its stdin, its stdout lines, its exit.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// A worker process started by a test. Killed when dropped, so a failing test leaves no
/// process behind.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let args = ["claim".to_owned(), "--key".to_owned(), "0".to_owned()];
/// let mut w = idem_stress::worker::Worker::spawn("w1", "target/debug/idem-stress-worker", &args, &[]);
/// let line = w.wait_for("started", Duration::from_secs(10)).await;
/// # let _ = line; }
/// ```
pub struct Worker {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Worker {
    /// Starts `exe` with `args` and extra environment `envs`; stderr goes to the test's stderr.
    pub fn spawn(name: &str, exe: &str, args: &[String], envs: &[(String, String)]) -> Worker {
        let mut child = Command::new(exe)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start worker {name} ({exe}): {e}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The worker's name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every line read so far.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// Reads lines until one starts with `prefix` and returns it; panics after `timeout` or if
    /// the worker exits first.
    pub async fn wait_for(&mut self, prefix: &str, timeout: Duration) -> String {
        self.wait_until(prefix, |line| line.starts_with(prefix), timeout)
            .await
    }

    /// Reads lines until one satisfies `pred` and returns it; panics after `timeout` or if the
    /// worker exits first. `what` describes the line in the panic message.
    pub async fn wait_until(
        &mut self,
        what: &str,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Ok(None) => panic!(
                    "worker {} exited before printing `{what}`; it printed {:?}",
                    self.name,
                    self.tail()
                ),
                Err(_) => panic!(
                    "worker {} printed no `{what}` within {timeout:?}; it printed {:?}",
                    self.name,
                    self.tail()
                ),
            }
        }
    }

    /// Writes one line to the worker's stdin (workers wait on stdin for `go`).
    pub async fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("cannot write to worker {}: {e}", self.name));
        stdin.flush().await.expect("flush worker stdin");
    }

    /// `kill -9`: the process dies at once, mid-work, holding whatever it held.
    pub async fn kill9(&mut self) {
        self.child
            .start_kill()
            .unwrap_or_else(|e| panic!("cannot kill worker {}: {e}", self.name));
        let _ = self.child.wait().await;
    }

    /// `kill -STOP`: the process freezes where it is (a node stalled by a long GC pause, a
    /// swapped-out VM), its timers and renewals with it, until [`resume`](Self::resume).
    pub async fn pause(&mut self) {
        self.signal("STOP").await;
    }

    /// `kill -CONT`: a [paused](Self::pause) process runs on from where it stopped.
    pub async fn resume(&mut self) {
        self.signal("CONT").await;
    }

    async fn signal(&mut self, signal: &str) {
        let pid = self
            .child
            .id()
            .unwrap_or_else(|| panic!("worker {} has exited", self.name));
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .await
            .unwrap_or_else(|e| panic!("cannot run kill -{signal}: {e}"));
        assert!(status.success(), "kill -{signal} {pid} failed: {status}");
    }

    /// Reads every remaining line and waits for the worker to exit; panics unless it exits
    /// with status 0 within `timeout`. Returns every line it printed.
    pub async fn finish(mut self, timeout: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => self.seen.push(line),
                Ok(None) => break,
                Err(_) => panic!(
                    "worker {} did not finish within {timeout:?}; it printed {:?}",
                    self.name,
                    self.tail()
                ),
            }
        }
        let status = tokio::time::timeout_at(deadline, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("worker {} did not exit", self.name))
            .expect("wait for worker");
        assert!(
            status.success(),
            "worker {} failed with {status}; it printed {:?}",
            self.name,
            self.tail()
        );
        std::mem::take(&mut self.seen)
    }

    fn tail(&self) -> &[String] {
        &self.seen[self.seen.len().saturating_sub(20)..]
    }
}
