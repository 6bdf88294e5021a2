//! `idem`: look at and act on the idempotency records of a SQLite or PostgreSQL store, the way
//! the application sees them.
//!
//! ```text
//! idem --url sqlite:///var/lib/app/idem.db inspect --scope charge --caller tenant-7 order-1001
//! idem --url postgres://… evict --hash 089346aca28d14ac…
//! idem --url postgres://… list --in-progress --limit 50
//! idem --url postgres://… stats --json
//! idem --url postgres://… prune --batch 1000
//! idem --url postgres://… migrate
//! ```
//!
//! Output is a table for people, or JSON with `--json`. An error is one line on stderr and exit
//! status 1 (2 for a command line that does not parse). Every command opens the store as the
//! application does, which applies the store's migrations first.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use clap::{Args, Parser, Subcommand};
use idem::{Key, PostgresStore, Record, RecordState, SqliteStore, Store, StoreAdmin, StoreStats};
use serde_json::{json, Value};

mod render;

use render::{hex, Table};

/// Look at and act on idempotency records.
#[derive(Debug, Parser)]
#[command(name = "idem", version)]
struct Cli {
    /// The store: `sqlite://PATH` (the file must exist) or `postgres://USER@HOST/DB`.
    #[arg(long, env = "IDEM_URL", global = true)]
    url: Option<String>,
    /// The records table (as configured in the application; a `schema.table` on PostgreSQL).
    #[arg(long, default_value = "idem_records", global = true)]
    table: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show one record: its state, the lease or retention left, its fingerprint and its stored
    /// response (decoded as JSON when it is JSON).
    Inspect(Which),
    /// Delete one record, whatever its state: the key runs again on its next call.
    Evict(Which),
    /// List live records in key order, a page at a time.
    List(ListArgs),
    /// Count records by state, and show the oldest and the table's size.
    Stats,
    /// Delete every expired record, in batches, reporting as it goes.
    Prune(PruneArgs),
    /// Apply the store's migrations (every command does so first) and show the schema version.
    Migrate,
}

/// Which record: the parts the application derives its key from, or the key's hash.
#[derive(Debug, Args)]
struct Which {
    /// The operation's scope, as the application names it.
    #[arg(long, required_unless_present = "hash")]
    scope: Option<String>,
    /// Who asked (tenant, user, API key id), as the application's caller; empty by default.
    #[arg(long, default_value = "")]
    caller: String,
    /// The client's key (a request id, an `Idempotency-Key` header value).
    #[arg(required_unless_present = "hash", conflicts_with = "hash")]
    key: Option<String>,
    /// The key's hash (64 hex digits), as logs and hooks show it.
    #[arg(long)]
    hash: Option<String>,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only records whose work is running (with the lease left).
    #[arg(long, conflicts_with = "completed")]
    in_progress: bool,
    /// Only completed records.
    #[arg(long)]
    completed: bool,
    /// How many records at most.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Continue after this record (the `next` of the previous page).
    #[arg(long)]
    after: Option<String>,
}

#[derive(Debug, Args)]
struct PruneArgs {
    /// Records deleted per statement.
    #[arg(long, default_value_t = 1000)]
    batch: u32,
}

/// Why a command failed: one line for the person who ran it.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{0}")]
    Usage(String),
    #[error("no record for {0}")]
    NotFound(String),
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Key(#[from] idem::KeyError),
}

/// The store named by `--url`.
enum Opened {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

impl Opened {
    async fn open(url: &str, table: &str) -> Result<Opened, Failure> {
        if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.trim_start_matches("//");
            let (path, query) = path.split_once('?').unwrap_or((path, ""));
            let creates = query.split('&').any(|p| p == "mode=rwc");
            if !creates && !path.starts_with(':') && !std::path::Path::new(path).exists() {
                return Err(Failure::Usage(format!("no SQLite database at {path:?}")));
            }
            let store = SqliteStore::builder().table(table).connect(url).await?;
            Ok(Opened::Sqlite(store))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            // One connection first: its error says why (refused, bad password, no database),
            // where the pool would only report a timeout.
            use idem::sqlx::Connection;
            let probe = idem::sqlx::PgConnection::connect(url)
                .await
                .map_err(|e| Failure::Usage(format!("cannot connect to PostgreSQL: {e}")))?;
            let _ = probe.close().await;
            let store = PostgresStore::builder().table(table).connect(url).await?;
            Ok(Opened::Postgres(store))
        } else {
            Err(Failure::Usage(format!(
                "unsupported store URL {url:?}: use sqlite://PATH or postgres://USER@HOST/DB"
            )))
        }
    }

    fn store(&self) -> &dyn Store {
        match self {
            Opened::Sqlite(s) => s,
            Opened::Postgres(s) => s,
        }
    }

    fn admin(&self) -> &dyn StoreAdmin {
        match self {
            Opened::Sqlite(s) => s,
            Opened::Postgres(s) => s,
        }
    }
}

fn key_of(which: &Which) -> Result<Key, Failure> {
    if let Some(hash) = &which.hash {
        return parse_hash(hash);
    }
    match (&which.scope, &which.key) {
        (Some(scope), Some(key)) => Ok(Key::derive(scope, &which.caller, key)?),
        _ => Err(Failure::Usage(
            "give --scope and the client key, or --hash".into(),
        )),
    }
}

fn parse_hash(hash: &str) -> Result<Key, Failure> {
    let bad = || Failure::Usage(format!("--hash {hash:?} is not 64 hex digits"));
    if hash.len() != 64 || !hash.is_ascii() {
        return Err(bad());
    }
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hash[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(Key::from_bytes(bytes))
}

/// Milliseconds from now until `t` (negative when past).
fn millis_until(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::now()) {
        Ok(left) => i64::try_from(left.as_millis()).unwrap_or(i64::MAX),
        Err(past) => -i64::try_from(past.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

fn seconds(ms: i64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// A record as JSON: what `inspect` and `list` print.
fn record_json(record: &Record, with_response: bool) -> Value {
    let mut out = json!({
        "key": record.key.to_string(),
        "fingerprint": record.fingerprint.map(|f| hex(f.as_bytes())),
    });
    match &record.state {
        RecordState::InProgress { lease_until, .. } => {
            out["state"] = json!("in_progress");
            out["lease_left_ms"] = json!(millis_until(*lease_until));
        }
        RecordState::Completed(cached) => {
            out["state"] = json!("completed");
            out["expires_in_ms"] = json!(millis_until(cached.expires_at));
            out["is_error"] = json!(cached.is_error);
            match cached.result() {
                Ok(bytes) => {
                    out["response_bytes"] = json!(bytes.len());
                    if with_response {
                        out["response"] = serde_json::from_slice::<Value>(bytes)
                            .unwrap_or_else(|_| json!({ "not_json": hex(bytes) }));
                    }
                }
                Err(idem::Error::ResultNotRetained { reason }) => {
                    out["not_retained"] = json!(reason);
                }
                Err(e) => out["unreadable"] = json!(e.to_string()),
            }
        }
    }
    out
}

async fn inspect(opened: &Opened, which: &Which, as_json: bool) -> Result<String, Failure> {
    let key = key_of(which)?;
    let Some(record) = opened.store().get(&key).await? else {
        return Err(Failure::NotFound(format!(
            "key {key} (expired records are not shown)"
        )));
    };
    let out = record_json(&record, true);
    if as_json {
        return Ok(out.to_string());
    }
    let mut table = Table::new(["field", "value"]);
    table.row(["key", &key.to_string()]);
    table.row(["state", out["state"].as_str().unwrap_or("")]);
    if let Some(ms) = out["lease_left_ms"].as_i64() {
        table.row(["lease left", &seconds(ms)]);
    }
    if let Some(ms) = out["expires_in_ms"].as_i64() {
        table.row(["expires in", &seconds(ms)]);
    }
    table.row(["fingerprint", out["fingerprint"].as_str().unwrap_or("none")]);
    if let Some(n) = out["response_bytes"].as_u64() {
        table.row(["response", &format!("{n} bytes")]);
    }
    if let Some(reason) = out["not_retained"].as_str() {
        table.row(["response", &format!("not retained: {reason}")]);
    }
    let mut text = table.render();
    if let Some(response) = out.get("response") {
        text.push('\n');
        text.push_str(&serde_json::to_string_pretty(response).unwrap_or_default());
        text.push('\n');
    }
    Ok(text)
}

async fn evict(opened: &Opened, which: &Which, as_json: bool) -> Result<String, Failure> {
    let key = key_of(which)?;
    if !opened.store().evict(&key).await? {
        return Err(Failure::NotFound(format!("key {key}")));
    }
    Ok(if as_json {
        json!({ "evicted": key.to_string() }).to_string()
    } else {
        format!("evicted {key}: its next call runs the work again\n")
    })
}

async fn list(opened: &Opened, args: &ListArgs, as_json: bool) -> Result<String, Failure> {
    let after = args.after.as_deref().map(parse_hash).transpose()?;
    let state = match (args.in_progress, args.completed) {
        (true, _) => Some(idem::ListState::InProgress),
        (_, true) => Some(idem::ListState::Completed),
        _ => None,
    };
    let page = opened
        .admin()
        .list(state, after.as_ref(), args.limit)
        .await?;
    let next = (page.len() == args.limit as usize)
        .then(|| page.last().map(|r| r.key.to_string()))
        .flatten();
    if as_json {
        let records: Vec<Value> = page.iter().map(|r| record_json(r, false)).collect();
        return Ok(json!({ "records": records, "next": next }).to_string());
    }
    let mut table = Table::new(["key", "state", "left", "fingerprint"]);
    for record in &page {
        let out = record_json(record, false);
        let left = out["lease_left_ms"]
            .as_i64()
            .or(out["expires_in_ms"].as_i64())
            .map(seconds)
            .unwrap_or_default();
        table.row([
            &record.key.to_string(),
            out["state"].as_str().unwrap_or(""),
            &left,
            out["fingerprint"].as_str().unwrap_or("none"),
        ]);
    }
    let mut text = table.render();
    if let Some(next) = next {
        text.push_str(&format!("next page: --after {next}\n"));
    }
    Ok(text)
}

async fn stats(opened: &Opened, as_json: bool) -> Result<String, Failure> {
    let StoreStats {
        in_progress,
        completed,
        expired,
        oldest_expiry,
        table_bytes,
        ..
    } = opened.admin().stats().await?;
    let oldest = oldest_expiry.map(millis_until);
    if as_json {
        return Ok(json!({
            "in_progress": in_progress,
            "completed": completed,
            "expired": expired,
            "oldest_expires_in_ms": oldest,
            "table_bytes": table_bytes,
        })
        .to_string());
    }
    let mut table = Table::new(["what", "value"]);
    table.row(["in progress", &in_progress.to_string()]);
    table.row(["completed", &completed.to_string()]);
    table.row(["expired (to prune)", &expired.to_string()]);
    table.row([
        "oldest expiry",
        &oldest.map(seconds).unwrap_or_else(|| "none".into()),
    ]);
    table.row([
        "table size",
        &table_bytes.map_or_else(|| "unknown".into(), |b| format!("{b} bytes")),
    ]);
    Ok(table.render())
}

async fn prune(opened: &Opened, args: &PruneArgs, as_json: bool) -> Result<String, Failure> {
    if args.batch == 0 {
        return Err(Failure::Usage("--batch must be at least 1".into()));
    }
    let started = Instant::now();
    let (mut deleted, mut batches) = (0u64, 0u64);
    // Bounded: every pass but the last deletes a whole batch of the finite expired rows.
    loop {
        let n = opened.store().prune_expired(args.batch).await?;
        deleted += n;
        batches += 1;
        if !as_json {
            eprintln!("batch {batches}: deleted {n} (total {deleted})");
        }
        if n < u64::from(args.batch) {
            break;
        }
    }
    let took = started.elapsed();
    Ok(if as_json {
        json!({ "deleted": deleted, "batches": batches, "seconds": took.as_secs_f64() }).to_string()
    } else {
        format!(
            "pruned {deleted} expired records in {batches} batches, {:.2} s\n",
            took.as_secs_f64()
        )
    })
}

async fn migrate(opened: &Opened, as_json: bool) -> Result<String, Failure> {
    let version = opened.admin().schema_version().await?;
    Ok(if as_json {
        json!({ "schema_version": version }).to_string()
    } else {
        format!("the records table is at schema version {version}\n")
    })
}

async fn run(cli: Cli) -> Result<String, Failure> {
    let url = cli
        .url
        .ok_or_else(|| Failure::Usage("give the store with --url (or IDEM_URL)".into()))?;
    let opened = tokio::time::timeout(Duration::from_secs(30), Opened::open(&url, &cli.table))
        .await
        .map_err(|_| Failure::Usage(format!("could not reach {url:?} within 30 s")))??;
    match &cli.command {
        Command::Inspect(which) => inspect(&opened, which, cli.json).await,
        Command::Evict(which) => evict(&opened, which, cli.json).await,
        Command::List(args) => list(&opened, args, cli.json).await,
        Command::Stats => stats(&opened, cli.json).await,
        Command::Prune(args) => prune(&opened, args, cli.json).await,
        Command::Migrate => migrate(&opened, cli.json).await,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("idem: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(out) => {
            print!("{out}");
            if !out.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idem: {e}");
            ExitCode::FAILURE
        }
    }
}
