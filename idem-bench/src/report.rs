//! The results as a markdown table, and the targets checked against them.

use std::fmt::Write as _;
use std::time::Duration;

use crate::grpc;
use crate::harness::Sample;
use crate::memory::MemoryReport;
use crate::peers::{self, SameKey};
use crate::scale::{ScaleReport, CLAIM_CONCURRENCY};

/// One line of the main table.
pub struct Row {
    pub store: &'static str,
    pub workload: Workload,
    pub variant: &'static str,
    pub concurrency: usize,
    pub ops_per_sec: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// CPU time per call of the benchmark process (idem or sqlx, tokio, and SQLite itself).
    pub client_cpu: Option<Duration>,
    /// CPU time per call of the whole PostgreSQL cluster, when it runs on this machine.
    pub server_cpu: Option<Duration>,
    /// This row's throughput divided by its baseline's (`None` for baselines and memory).
    pub ratio: Option<f64>,
    pub note: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Fresh,
    Replay,
    Storm,
    /// An operation of three steps, each one write (`steps.rs`).
    Steps,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Fresh => "fresh",
            Workload::Replay => "replay",
            Workload::Storm => "storm",
            Workload::Steps => "3 steps",
        }
    }
}

impl Row {
    pub fn new(
        store: &'static str,
        workload: Workload,
        variant: &'static str,
        concurrency: usize,
        sample: &mut Sample,
        baseline: Option<&Sample>,
    ) -> Row {
        let hits = sample.hits;
        let (client_cpu, server_cpu) = sample.cpu_per_call();
        let note = if workload == Workload::Storm {
            format!(
                "{} fresh / {} replayed / {} locked",
                hits.fresh, hits.replayed, hits.locked
            )
        } else {
            String::new()
        };
        Row {
            store,
            workload,
            variant,
            concurrency,
            ops_per_sec: sample.ops_per_sec(),
            p50: sample.percentile(50.0),
            p99: sample.percentile(99.0),
            client_cpu,
            server_cpu,
            ratio: baseline.map(|b| sample.ops_per_sec() / b.ops_per_sec()),
            note,
        }
    }
}

/// Scale results of one store.
pub struct Scale {
    pub store: &'static str,
    pub report: ScaleReport,
}

/// Everything one run measured.
pub struct Results {
    pub rows: Vec<Row>,
    pub memory: Option<MemoryReport>,
    pub scale: Vec<Scale>,
    /// The peers' same-key runs.
    pub same_key: Vec<SameKey>,
    /// Instructions per call of the in-process paths (a full run where valgrind is found).
    pub counts: Option<crate::counts::CountsReport>,
}

pub fn micros(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ratio(r: Option<f64>) -> String {
    r.map_or("—".into(), |r| format!("{r:.2}"))
}

/// A row of the targets table whose figure is a ratio: the target, the ratio measured, and
/// whether it `met` the target.
fn ratio_row(out: &mut String, target: &str, ratio: f64, met: bool) {
    let _ = writeln!(out, "| {target} | {ratio:.2} × | {} |", verdict(met));
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

impl Results {
    /// The tables and the targets, as markdown.
    pub fn markdown(&mut self) -> String {
        let mut out = String::new();
        self.main_table(&mut out);
        self.memory_table(&mut out);
        if let Some(counts) = &self.counts {
            out.push('\n');
            out.push_str(&counts.markdown());
            out.push('\n');
        }
        self.scale_tables(&mut out);
        self.same_key_table(&mut out);
        self.targets(&mut out);
        out
    }

    fn main_table(&self, out: &mut String) {
        if self.rows.is_empty() {
            return;
        }
        out.push_str(
            "| store | workload | variant | tasks | ops/s | p50 | p99 | ÷ baseline (ops/s) | CPU/call here | CPU/call server | notes |\n\
             |---|---|---|--:|--:|--:|--:|--:|--:|--:|---|\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.store,
                r.workload.name(),
                r.variant,
                r.concurrency,
                thousands(r.ops_per_sec),
                micros(r.p50),
                micros(r.p99),
                ratio(r.ratio),
                r.client_cpu.map_or("—".into(), micros),
                r.server_cpu.map_or("—".into(), micros),
                r.note
            );
        }
    }

    fn memory_table(&self, out: &mut String) {
        let Some(m) = &self.memory else { return };
        let _ = write!(
            out,
            "\nMemory store, one task, {} calls each (mean time per call):\n\n\
             | path | ns/call |\n|---|--:|\n\
             | `Store::claim` + `Store::complete`, new key | {} |\n\
             | `Idempotency::run`, new key (claim + work + JSON + complete) | {} |\n\
             | `Idempotency::run`, replay | {} |\n\
             | `#[idempotent]` fn, new 32-character request id (SHA-256 key derivation inside) | {} |\n\
             | the same by hand: `Key::derive` + `Idempotency::run`, same scope | {} (the attribute at {:.3} × its speed: median over turns of 10,000 calls) |\n\n\
             Metrics and tracing left on (feature `metrics`, a Prometheus recorder and a JSON \
             subscriber at INFO installed), new key + replay on one current-thread runtime, observed \
             and plain engines taking turns every 1,000 keys, overhead the median over those slices: \
             with the default latency sampling (one call in {}) {} ns off, {} ns on, overhead \
             {:+.1} %; with every call's latencies recorded (`sample_latencies(1)`) {} ns off, {} ns \
             on, overhead {:+.1} %.\n",
            m.calls,
            m.store_claim_complete.as_nanos(),
            m.engine_fresh.as_nanos(),
            m.engine_replay.as_nanos(),
            m.attribute_fresh.as_nanos(),
            m.derived_fresh.as_nanos(),
            attribute_over_hand(m),
            idem::DEFAULT_LATENCIES_ONE_IN,
            m.observed.off.as_nanos(),
            m.observed.on.as_nanos(),
            overhead(m),
            m.observed_every.off.as_nanos(),
            m.observed_every.on.as_nanos(),
            overhead_every(m),
        );
    }

    fn scale_tables(&mut self, out: &mut String) {
        if self.scale.is_empty() {
            return;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        let _ = write!(
            out,
            "Claim (`Store::claim` on a new random key) from {CLAIM_CONCURRENCY} task, on an empty table \
             and on one holding N live records:\n\n\
             | store | N | load N rows | p50 empty | p50 with N | p50 ratio | p99 empty | p99 with N |\n\
             |---|--:|--:|--:|--:|--:|--:|--:|\n"
        );
        for s in &mut self.scale {
            let r = &mut s.report;
            let (e50, f50) = (r.empty.percentile(50.0), r.full.percentile(50.0));
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} s | {} | {} | {:.2} | {} | {} |",
                s.store,
                thousands(r.plan.rows as f64),
                r.load_time.as_secs_f64(),
                micros(e50),
                micros(f50),
                f50.as_secs_f64() / e50.as_secs_f64(),
                micros(r.empty.percentile(99.0)),
                micros(r.full.percentile(99.0)),
            );
        }
        out.push_str(
            "\nThe same claims on a table of N expired records, alternating slices with the pruner \
             stopped and running (idem's `Pruner`, batches of `batch` with `pause` between \
             them; prune time is the time spent in its `prune_expired` calls):\n\n\
             | store | batch | pause | pruned | prune time | rows/s | claim p99 without | claim p99 during | p99 ratio | p50 without | p50 during |\n\
             |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        for s in &mut self.scale {
            let r = &mut s.report;
            let (w99, d99) = (
                r.without_prune.percentile(99.0),
                r.during_prune.percentile(99.0),
            );
            let unfinished = if r.prune_finished {
                ""
            } else {
                " (stopped early)"
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {}{} | {:.1} s | {} | {} | {} | {:.2} | {} | {} |",
                s.store,
                r.plan
                    .prune_batch
                    .map_or("store's".to_owned(), |b| thousands(f64::from(b))),
                match (r.plan.prune_pause, r.plan.prune_share) {
                    (Some(p), _) => format!("{} ms", p.as_millis()),
                    (None, Some(share)) => format!("paced by cost, {:.1} % share", share * 100.0),
                    (None, None) => "paced by cost".to_owned(),
                },
                thousands(r.pruned as f64),
                unfinished,
                r.prune_time.as_secs_f64(),
                thousands(r.pruned as f64 / r.prune_time.as_secs_f64().max(1e-9)),
                micros(w99),
                micros(d99),
                d99.as_secs_f64() / w99.as_secs_f64(),
                micros(r.without_prune.percentile(50.0)),
                micros(r.during_prune.percentile(50.0)),
            );
        }
    }

    fn same_key_table(&self, out: &mut String) {
        if self.same_key.is_empty() {
            return;
        }
        let _ = write!(
            out,
            "\n{} concurrent calls with one key (one session), whose handler counts its runs and \
             works {} ms:\n\n| library | handler ran | what the calls got |\n|---|--:|---|\n",
            peers::SAME_KEY_CALLS,
            peers::SAME_KEY_WORK.as_millis()
        );
        for s in &self.same_key {
            let _ = writeln!(out, "| {} | {} | {} |", s.library, s.ran, s.others);
        }
    }

    /// The peers' targets: the idem layer against the bare app and axum-idempotent, the engine
    /// against `idempotent`, and the handler runs under one key.
    fn peer_targets(&self, out: &mut String) {
        let find = |store: &str, workload: Workload, variant: &str, c: usize| {
            self.rows.iter().find(|r| {
                r.store == store
                    && r.workload == workload
                    && r.variant == variant
                    && r.concurrency == c
            })
        };
        for workload in [Workload::Fresh, Workload::Replay] {
            let name = workload.name();
            let mut over_bare = Vec::new();
            let mut over_peer = Vec::new();
            let mut engine = Vec::new();
            let mut grpc_layer = Vec::new();
            let (mut sqlite_over_bare, mut sqlite_over_hand) = (Vec::new(), Vec::new());
            for c in crate::CONCURRENCY {
                if let Some(idem) = find(peers::HTTP_SQLITE, workload, peers::IDEM_LAYER, c) {
                    if let Some(x) = idem.ratio {
                        sqlite_over_bare.push((c, x));
                    }
                    if let Some(hand) = find(peers::HTTP_SQLITE, workload, peers::BY_HAND, c) {
                        sqlite_over_hand.push((c, idem.ops_per_sec / hand.ops_per_sec.max(1e-9)));
                    }
                }
                if let Some(x) =
                    find(grpc::GRPC, workload, grpc::IDEM_GRPC, c).and_then(|r| r.ratio)
                {
                    grpc_layer.push((c, x));
                }
                if let Some(idem) = find(peers::HTTP, workload, peers::IDEM_LAYER, c) {
                    if let Some(x) = idem.ratio {
                        over_bare.push((c, x));
                    }
                    if let Some(peer) = find(peers::HTTP, workload, peers::AXUM_IDEMPOTENT, c) {
                        over_peer.push((c, idem.ops_per_sec / peer.ops_per_sec.max(1e-9)));
                    }
                }
                if let Some(x) =
                    find(peers::ENGINE, workload, peers::IDEM_ENGINE, c).and_then(|r| r.ratio)
                {
                    engine.push((c, x));
                }
            }
            let listed = |v: &[(usize, f64)]| {
                v.iter()
                    .map(|(c, x)| format!("@{c} {x:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let all = |v: &[(usize, f64)], min: f64| v.iter().all(|(_, x)| *x >= min);
            for (what, v, min) in [
                (
                    format!("HTTP {name}: idem layer ≥ 0.95 × bare app (memory store), every concurrency"),
                    &over_bare,
                    0.95,
                ),
                (
                    format!("HTTP {name}: idem layer ≥ 0.95 × bare app (SQLite store), every concurrency"),
                    &sqlite_over_bare,
                    0.95,
                ),
                (
                    format!("HTTP {name}: idem layer ahead of axum-idempotent, every concurrency"),
                    &over_peer,
                    1.0,
                ),
                (
                    format!("engine {name}: idem ahead of idempotent 0.3's memory store, every concurrency"),
                    &engine,
                    1.0,
                ),
                (
                    format!("gRPC {name}: idem layer ≥ 0.9 × the same tonic service without it (memory store), every concurrency"),
                    &grpc_layer,
                    0.9,
                ),
            ] {
                if !v.is_empty() {
                    let _ = writeln!(out, "| {what} | {} | {} |", listed(v), verdict(all(v, min)));
                }
            }
            if !sqlite_over_hand.is_empty() {
                let _ = writeln!(
                    out,
                    "| HTTP {name}: idem layer (SQLite store) ÷ the same app idempotent by hand \
                     (raw SQL in the handler), every concurrency | {} | no target: what the layer \
                     costs beyond its store's statements |",
                    listed(&sqlite_over_hand)
                );
            }
        }
        if !self.same_key.is_empty() {
            let measured: Vec<String> = self
                .same_key
                .iter()
                .map(|s| format!("{} {}", s.library, s.ran))
                .collect();
            let idem_once = self
                .same_key
                .iter()
                .filter(|s| {
                    [peers::IDEM_LAYER, peers::IDEM_ENGINE, grpc::IDEM_GRPC].contains(&s.library)
                })
                .all(|s| s.ran == 1);
            let _ = writeln!(
                out,
                "| idem runs the handler once under {} same-key calls (peers printed as measured) | {} | {} |",
                peers::SAME_KEY_CALLS,
                measured.join(", "),
                verdict(idem_once)
            );
        }
    }

    fn targets(&mut self, out: &mut String) {
        out.push_str("\nTargets:\n\n| target | measured | verdict |\n|---|---|---|\n");
        for store in ["SQLite", "PostgreSQL"] {
            for (workload, what) in [
                (Workload::Fresh, "fresh ≥ 0.9 × raw INSERT+UPDATE"),
                (Workload::Replay, "replay ≥ 0.9 × raw SELECT"),
            ] {
                let worst = self
                    .rows
                    .iter()
                    .filter(|r| r.store == store && r.workload == workload)
                    .filter_map(|r| r.ratio.map(|x| (x, r.variant, r.concurrency)))
                    .min_by(|a, b| a.0.total_cmp(&b.0));
                let all: Vec<String> = self
                    .rows
                    .iter()
                    .filter(|r| r.store == store && r.workload == workload)
                    .filter_map(|r| {
                        r.ratio
                            .map(|x| format!("{}@{} {x:.2}", short(r.variant), r.concurrency))
                    })
                    .collect();
                if let Some((x, _, _)) = worst {
                    let _ = writeln!(
                        out,
                        "| {store} {what}, every concurrency | {} | {} |",
                        all.join(", "),
                        verdict(x >= 0.9)
                    );
                }
            }
        }
        self.steps_targets(out);
        for s in &mut self.scale {
            let r = &mut s.report;
            let p50 =
                r.full.percentile(50.0).as_secs_f64() / r.empty.percentile(50.0).as_secs_f64();
            let p99 = r.during_prune.percentile(99.0).as_secs_f64()
                / r.without_prune.percentile(99.0).as_secs_f64();
            let (store, rows) = (&s.store, thousands(r.plan.rows as f64));
            ratio_row(
                out,
                &format!("{store} claim p50 with {rows} records ≤ 1.5 × empty"),
                p50,
                p50 <= 1.5,
            );
            ratio_row(
                out,
                &format!("{store} claim p99 during a {rows}-row prune ≤ 3 × without"),
                p99,
                p99 <= 3.0,
            );
        }
        if let Some(m) = &self.memory {
            let _ = writeln!(
                out,
                "| memory full path, metrics and tracing on ≤ 3 % over off | {:+.1} % (latencies of one \
                 call in {}; {:+.1} % with every call's) | {} |",
                overhead(m),
                idem::DEFAULT_LATENCIES_ONE_IN,
                overhead_every(m),
                verdict(overhead(m) <= 3.0)
            );
            let _ = writeln!(
                out,
                "| memory: `#[idempotent]` within 5 % of the same calls by hand (`Key::derive` + \
                 engine) | {:.3} × | {} |",
                attribute_over_hand(m),
                verdict(attribute_over_hand(m) >= 0.95)
            );
            // Ratios to the raw store calls measured in the same run, not absolute times: a
            // machine whose clock reads or wake-ups cost more slows both alike.
            let raw = m.store_claim_complete.as_secs_f64();
            let (fresh, replay) = (
                m.engine_fresh.as_secs_f64() / raw,
                m.engine_replay.as_secs_f64() / raw,
            );
            let _ = writeln!(
                out,
                "| memory full path (`Idempotency::run`, new key: claim, work, encode, complete) \
                 ≤ 1.2 × the raw `Store::claim` + `Store::complete` | {fresh:.2} × ({} ns ÷ {} \
                 ns) | {} |",
                m.engine_fresh.as_nanos(),
                m.store_claim_complete.as_nanos(),
                verdict(fresh <= 1.2)
            );
            let _ = writeln!(
                out,
                "| memory replay (`Idempotency::run`, completed key) ≤ 1.0 × the raw \
                 `Store::claim` + `Store::complete` | {replay:.2} × ({} ns) | {} |",
                m.engine_replay.as_nanos(),
                verdict(replay <= 1.0)
            );
        }
        self.peer_targets(out);
    }
}

impl Results {
    /// An operation of three steps against its three writes by hand (≥ 0.8), every concurrency,
    /// and, for the record, against the same writes made resumable by hand.
    fn steps_targets(&self, out: &mut String) {
        for store in ["memory", "SQLite", "PostgreSQL"] {
            let rows: Vec<&Row> = self
                .rows
                .iter()
                .filter(|r| r.store == store && r.workload == Workload::Steps)
                .collect();
            let idem: Vec<&Row> = rows
                .iter()
                .copied()
                .filter(|r| r.variant == crate::steps::IDEM)
                .collect();
            let Some(worst) = idem
                .iter()
                .filter_map(|r| r.ratio)
                .min_by(|a, b| a.total_cmp(b))
            else {
                continue;
            };
            let measured: Vec<String> = idem
                .iter()
                .filter_map(|r| r.ratio.map(|x| format!("@{} {x:.2}", r.concurrency)))
                .collect();
            let over_points: Vec<String> = idem
                .iter()
                .filter_map(|r| {
                    let points = rows.iter().find(|p| {
                        p.variant == crate::steps::RECOVERY_POINTS && p.concurrency == r.concurrency
                    })?;
                    Some(format!(
                        "@{} {:.2}",
                        r.concurrency,
                        r.ops_per_sec / points.ops_per_sec
                    ))
                })
                .collect();
            let points = if over_points.is_empty() {
                String::new()
            } else {
                format!("; ÷ recovery points by hand: {}", over_points.join(", "))
            };
            let _ = writeln!(
                out,
                "| {store} an operation of 3 steps ≥ 0.8 × the same 3 writes by hand, every concurrency | {}{points} | {} |",
                measured.join(", "),
                verdict(worst >= 0.8)
            );
        }
    }
}

/// How much slower the memory full path is with metrics and tracing on, in percent (default
/// latency sampling).
fn overhead(m: &MemoryReport) -> f64 {
    (m.observed.ratio - 1.0) * 100.0
}

/// The attribute's speed over the same calls written by hand (1.0: the same; below: slower),
/// the median over the turns they took.
fn attribute_over_hand(m: &MemoryReport) -> f64 {
    m.attribute_speed
}

/// The same with every call's latencies recorded.
fn overhead_every(m: &MemoryReport) -> f64 {
    (m.observed_every.ratio - 1.0) * 100.0
}

fn short(variant: &str) -> &str {
    match variant {
        "#[idempotent]" => "attr",
        other => other,
    }
}
