//! CPU time spent by this process and by the PostgreSQL server, to tell where a call's time
//! goes: client work, server work, or waiting (on the network, a lock, or a busy CPU); and the
//! CPU time and resident memory of any other process (the servers of `--versus-diom`).
//!
//! Read from `/proc` (Linux); where it cannot be read (another OS, a remote server) the
//! figures are absent.

use std::time::Duration;

/// Linux reports process times in USER_HZ ticks, 100 per second on every common platform.
const TICKS_PER_SEC: u64 = 100;

/// Where to read CPU time from.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// The PostgreSQL postmaster, when the server runs on this machine: its children are the
    /// backends and background processes of the cluster.
    pub postmaster: Option<u32>,
}

/// CPU time used so far.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    client: Option<Duration>,
    server: Option<Duration>,
}

impl Reading {
    /// CPU used between `self` and `later`: (client, server).
    pub fn until(&self, later: &Reading) -> (Option<Duration>, Option<Duration>) {
        let diff = |a: Option<Duration>, b: Option<Duration>| Some(b?.saturating_sub(a?));
        (
            diff(self.client, later.client),
            diff(self.server, later.server),
        )
    }
}

impl Cpu {
    pub fn read(&self) -> Reading {
        Reading {
            client: stat("self").map(|s| s.cpu),
            server: self.postmaster.and_then(cluster_cpu),
        }
    }
}

struct Stat {
    ppid: u32,
    cpu: Duration,
}

/// utime + stime and the parent of `/proc/<pid>`.
fn stat(pid: &str) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are positional.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) … utime(14) stime(15), numbered as in proc(5).
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Stat {
        ppid,
        cpu: Duration::from_millis((utime + stime) * 1000 / TICKS_PER_SEC),
    })
}

/// utime + stime of the process `pid` so far.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    stat(&pid.to_string()).map(|s| s.cpu)
}

/// The resident set size of the process `pid` (`VmRSS`), in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// The CPU of the postmaster and all its children (backends, WAL writer, checkpointer, …).
fn cluster_cpu(postmaster: u32) -> Option<Duration> {
    let mut total = stat(&postmaster.to_string())?.cpu;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Some(s) = stat(pid).filter(|s| s.ppid == postmaster) {
            total += s.cpu;
        }
    }
    Some(total)
}

/// The postmaster behind the backend `backend_pid`, if that process is visible here (the
/// server runs on this machine, in this PID namespace).
pub fn postmaster_of(backend_pid: u32) -> Option<u32> {
    let is_postgres = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres")
    };
    let ppid = stat(&backend_pid.to_string())?.ppid;
    (is_postgres(backend_pid) && is_postgres(ppid)).then_some(ppid)
}
