//! `idem`: look at and act on the idempotency records of a store, the way the application sees
//! them: SQLite, PostgreSQL, Redis (one server or a cluster) or DynamoDB.
//!
//! ```text
//! idem --url sqlite:///var/lib/app/idem.db inspect --scope charge --caller tenant-7 order-1001
//! idem --url postgres://… evict --hash 089346aca28d14ac…
//! idem --url redis://10.0.0.5:6379 --table payments list --in-progress --limit 50
//! idem --url redis-cluster://10.0.0.1:7000,10.0.0.2:7000 stats --json
//! idem --url dynamodb+https://dynamodb.eu-west-1.amazonaws.com --table idem_records prune
//! idem --url dynamodb://127.0.0.1:8000 migrate
//! idem --url 'idem+http://idem-server:8624?token=…' --table payments inspect --scope charge order-1001
//! ```
//!
//! | `--url` | store | `--table` (alias `--prefix`) names |
//! |---|---|---|
//! | `sqlite://PATH` | SQLite (the file must exist, except for `migrate`, which creates it; `?mode=rwc` creates it for any command) | the table (default `idem_records`) |
//! | `postgres://USER@HOST/DB` | PostgreSQL | the table, `schema.table` allowed (default `idem_records`) |
//! | `redis://[USER:PASSWORD@]HOST:PORT[/DB]` | Redis or Valkey, one server | the key prefix (default `idem`) |
//! | `redis-cluster://[USER:PASSWORD@]HOST:PORT,HOST:PORT,…` | a Redis Cluster, from any of its nodes | the key prefix (default `idem`) |
//! | `dynamodb://HOST:PORT`, `dynamodb+http://HOST:PORT` | DynamoDB at `http://HOST:PORT` (a local emulator) | the table (default `idem_records`) |
//! | `dynamodb+https://HOST[:PORT]` | DynamoDB at `https://HOST[:PORT]` | the table (default `idem_records`) |
//! | `idem+http://HOST:PORT[/PATH]?token=TOKEN` | an idem-server, as the caller whose token is `TOKEN`: `inspect`, `evict` and `prune` (the admin token) through its routes; `list`, `stats` and `migrate` need the server's own store URL | the server's namespace (default `default`) |
//!
//! DynamoDB credentials come from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
//! `AWS_SESSION_TOKEN` (placeholders over plain HTTP when unset), the region from `AWS_REGION`,
//! `AWS_DEFAULT_REGION` or an endpoint `dynamodb.REGION.amazonaws.com` (else `us-east-1`); no
//! profile is read.
//!
//! Output is a table for people, or JSON with `--json`. An error is one line on stderr and exit
//! status 1 (2 for a command line that does not parse). Every command opens the store as the
//! application does, which applies a SQL store's migrations first; only `migrate` creates a
//! missing DynamoDB table. On Redis and DynamoDB, `list` and `stats` scan every record of the
//! prefix or table (the stores' `StoreAdmin` docs give the cost), and `prune` says what the
//! store deletes by itself: Redis everything (key expiry), DynamoDB eventually (TTL).

use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use clap::{Args, Parser, Subcommand};
use idem::{Key, Record, RecordState, StoreStats};
use serde_json::{json, Value};

mod render;
mod stores;

use idem::store::url::{redacted, ConnectError, StoreUrl, StoreUrlError};
use render::{hex, Table};
use stores::{Opened, Upkeep};

/// What `--help` adds below the options.
const AFTER_HELP: &str = "\
DynamoDB: credentials come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN \
(placeholders over plain HTTP when unset), the region from AWS_REGION, AWS_DEFAULT_REGION or an \
endpoint dynamodb.REGION.amazonaws.com (else us-east-1); no profile is read. Only `migrate` \
creates a missing table.
Redis: `redis-cluster://USER:PASSWORD@HOST:PORT,…` gives the credentials once for every node.
idem-server: `idem+http://HOST:PORT?token=TOKEN` reaches the keys of the caller whose token it is \
(inspect, evict; prune with the admin token), in the namespace --table names (default `default`).";

/// Look at and act on idempotency records.
#[derive(Debug, Parser)]
#[command(name = "idem", version, after_help = AFTER_HELP)]
struct Cli {
    /// The store: `sqlite://PATH` (the file must exist, but `migrate` creates it),
    /// `postgres://USER@HOST/DB`,
    /// `redis://HOST:PORT` (one server), `redis-cluster://HOST:PORT,HOST:PORT,…` (a cluster,
    /// from any of its nodes), `dynamodb://HOST:PORT` or `dynamodb+http://HOST:PORT` (an
    /// endpoint over HTTP, such as a local emulator), `dynamodb+https://HOST[:PORT]` or
    /// `idem+http://HOST:PORT?token=TOKEN` (an idem-server).
    #[arg(long, env = "IDEM_URL", global = true, hide_env_values = true)]
    url: Option<String>,
    /// Where the records are, as configured in the application: the table on SQLite,
    /// PostgreSQL (`schema.table` allowed) and DynamoDB (default `idem_records`); the key
    /// prefix on Redis (default `idem`); the namespace on an idem-server (default `default`).
    #[arg(long, visible_alias = "prefix", global = true)]
    table: Option<String>,
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
    /// List the uncertain operations, in key order, a page at a time: claims made with
    /// `OnLapse::Uncertain` that lapsed with no result. Nobody runs them again until each is
    /// resolved (`idem resolve`); alert on any.
    Uncertain(PageArgs),
    /// Resolve one uncertain operation, fenced (a resolution that another reached first, or of
    /// an operation that is not uncertain, is refused and changes nothing): as completed with
    /// the result every retry then replays, as failed (the key frees; the next retry runs), or
    /// as abandoned (retries are told so until the retention ends).
    Resolve(ResolveArgs),
    /// List live records in key order, a page at a time (on Redis and DynamoDB each page scans
    /// every record).
    List(ListArgs),
    /// Count records by state, and show the oldest and the store's size (on Redis and DynamoDB
    /// a scan of every record).
    Stats,
    /// Delete every expired record, in batches, reporting as it goes. Redis deletes ended
    /// records itself (nothing to do); DynamoDB's TTL does too, in its own time, and this scans
    /// the table to delete them now.
    Prune(PruneArgs),
    /// SQL: apply the migrations (every command does so first). DynamoDB: create the table if
    /// it is missing. Redis: nothing to do. Shows the schema version.
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
struct PageArgs {
    /// How many operations at most.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Continue after this operation (the `next` of the previous page).
    #[arg(long)]
    after: Option<String>,
}

#[derive(Debug, Args)]
struct ResolveArgs {
    #[command(flatten)]
    which: Which,
    /// Its effect happened: the result every retry replays, as the application stores it
    /// (JSON for a call's value).
    #[arg(long, value_name = "JSON", group = "resolution")]
    completed: Option<String>,
    /// Its effect did not happen: free the key so the next retry runs the work.
    #[arg(long, group = "resolution")]
    failed: bool,
    /// Neither, and it must not run again: retries are told this reason.
    #[arg(long, value_name = "REASON", group = "resolution")]
    abandoned: Option<String>,
    /// How long a completed or abandoned resolution is kept, in seconds.
    #[arg(long, default_value_t = 86_400)]
    retention_secs: u64,
}

#[derive(Debug, Args)]
struct PruneArgs {
    /// Records deleted per call (one statement on SQL; on DynamoDB, Scan pages with one
    /// DeleteItem per expired item).
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
    #[error(transparent)]
    Url(#[from] StoreUrlError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
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
                        out["response"] = response_json(bytes);
                    }
                }
                Err(idem::Error::ResultNotRetained { reason }) => {
                    out["not_retained"] = json!(reason);
                }
                Err(idem::Error::Abandoned { reason }) => {
                    out["abandoned"] = json!(reason);
                }
                Err(e) => out["unreadable"] = json!(e.to_string()),
            }
        }
        RecordState::Uncertain { since, .. } => {
            out["state"] = json!("uncertain");
            out["uncertain_for_ms"] = json!(-millis_until(*since));
        }
        RecordState::Expired { since } => {
            out["state"] = json!("expired");
            out["expired_for_ms"] = json!(-millis_until(*since));
        }
    }
    out
}

/// A stored result as JSON: a value `Idempotency::run` or `#[idempotent]` stored (JSON), a
/// response the HTTP or gRPC layer stored (its status, headers, trailers and body), or else its
/// bytes in hex.
fn response_json(bytes: &[u8]) -> Value {
    if let Ok(value) = serde_json::from_slice::<Value>(bytes) {
        return value;
    }
    let Ok(stored) = idem::StoredResponse::decode(bytes) else {
        return json!({ "not_json": hex(bytes) });
    };
    let trailers = stored.trailers.as_ref().map(|t| {
        fields_json(
            t.iter()
                .map(|(name, value)| (name.as_str(), value.as_bytes())),
        )
    });
    json!({
        "stored_response": {
            "status": stored.status.as_u16(),
            "headers": fields_json(
                stored.headers.iter().map(|(name, value)| (name.as_str(), value.as_bytes()))
            ),
            "trailers": trailers,
            "body": body_json(&stored.body),
        }
    })
}

/// Header or trailer fields as `[name, value]` pairs, in order (a name may repeat); a value
/// that is not text is shown in hex, as `{"hex": …}`.
fn fields_json<'a>(fields: impl Iterator<Item = (&'a str, &'a [u8])>) -> Value {
    fields
        .map(|(name, value)| json!([name, text_json(value)]))
        .collect()
}

/// A body as JSON when it is JSON, else as text when it is UTF-8, else `{"hex": …}`.
fn body_json(body: &[u8]) -> Value {
    serde_json::from_slice::<Value>(body).unwrap_or_else(|_| text_json(body))
}

/// Bytes as text when they are UTF-8, else `{"hex": …}`.
fn text_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => json!(text),
        Err(_) => json!({ "hex": hex(bytes) }),
    }
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

async fn uncertain(opened: &Opened, args: &PageArgs, as_json: bool) -> Result<String, Failure> {
    let after = args.after.as_deref().map(parse_hash).transpose()?;
    let query = idem::AbandonedQuery {
        after: after.as_ref(),
        limit: args.limit,
    };
    let page = opened.engine(None)?.uncertain(query).await?;
    let next = (page.len() == args.limit as usize)
        .then(|| page.last().map(|op| op.key.to_string()))
        .flatten();
    if as_json {
        let operations: Vec<Value> = page
            .iter()
            .map(|op| {
                json!({
                    "key": op.key.to_string(),
                    "uncertain_for_ms": -millis_until(op.since),
                })
            })
            .collect();
        return Ok(json!({ "operations": operations, "next": next }).to_string());
    }
    if page.is_empty() {
        return Ok("no uncertain operation\n".to_owned());
    }
    let mut table = Table::new(["key", "uncertain for"]);
    for op in &page {
        table.row([&op.key.to_string(), &seconds(-millis_until(op.since))]);
    }
    let mut text = table.render();
    if let Some(next) = next {
        text.push_str(&format!("next page: --after {next}\n"));
    }
    text.push_str(
        "resolve each: idem resolve --hash KEY --completed JSON | --failed | --abandoned REASON\n",
    );
    Ok(text)
}

async fn resolve(opened: &Opened, args: &ResolveArgs, as_json: bool) -> Result<String, Failure> {
    let key = key_of(&args.which)?;
    let (resolution, said) = match (&args.completed, args.failed, &args.abandoned) {
        (Some(result), false, None) => {
            serde_json::from_str::<Value>(result).map_err(|e| {
                Failure::Usage(format!("--completed takes the result as JSON: {e}"))
            })?;
            (
                idem::Resolution::Completed(result.clone().into_bytes()),
                "completed: retries replay its result",
            )
        }
        (None, true, None) => (
            idem::Resolution::Failed,
            "failed: its key is free, the next retry runs",
        ),
        (None, false, Some(reason)) => (
            idem::Resolution::Abandoned(reason.clone()),
            "abandoned: retries are told so",
        ),
        _ => {
            return Err(Failure::Usage(
                "say how it ended: --completed JSON, --failed or --abandoned REASON".into(),
            ))
        }
    };
    let retention = std::time::Duration::from_secs(args.retention_secs);
    opened
        .engine(Some(retention))?
        .resolve(&key, resolution)
        .await?;
    Ok(if as_json {
        json!({ "resolved": key.to_string() }).to_string()
    } else {
        format!("resolved {key} as {said}\n")
    })
}

async fn list(opened: &Opened, args: &ListArgs, as_json: bool) -> Result<String, Failure> {
    let after = args.after.as_deref().map(parse_hash).transpose()?;
    let state = match (args.in_progress, args.completed) {
        (true, _) => Some(idem::ListState::InProgress),
        (_, true) => Some(idem::ListState::Completed),
        _ => None,
    };
    let query = idem::ListQuery {
        state,
        after: after.as_ref(),
        limit: args.limit,
    };
    let page = opened.admin().list(query).await?;
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
    let (expired_label, size_label) = opened.stats_labels();
    let mut table = Table::new(["what", "value"]);
    table.row(["in progress", &in_progress.to_string()]);
    table.row(["completed", &completed.to_string()]);
    table.row([expired_label, &expired.to_string()]);
    table.row([
        "oldest expiry",
        &oldest.map(seconds).unwrap_or_else(|| "none".into()),
    ]);
    table.row([
        size_label,
        &table_bytes.map_or_else(|| "not reported".into(), |b| format!("{b} bytes")),
    ]);
    Ok(table.render())
}

/// What `prune` says of a store that deletes ended records itself.
#[cfg(feature = "redis")]
const REDIS_PRUNES_ITSELF: &str = "nothing to prune: Redis deletes each record itself when its \
    lease or retention ends (key expiry); `idem stats` counts the ended ones it has not deleted yet";
#[cfg(feature = "dynamodb")]
const DYNAMO_TTL: &str = "DynamoDB's TTL also deletes expired items by itself, typically within \
    two days; this scan read (and billed) the whole table";

async fn prune(opened: &Opened, args: &PruneArgs, as_json: bool) -> Result<String, Failure> {
    if args.batch == 0 {
        return Err(Failure::Usage("--batch must be at least 1".into()));
    }
    let note = match opened.upkeep() {
        #[cfg(feature = "redis")]
        Upkeep::Redis => {
            return Ok(if as_json {
                json!({
                    "deleted": 0,
                    "batches": 0,
                    "seconds": 0.0,
                    "deletes_expired_itself": true,
                    "note": REDIS_PRUNES_ITSELF,
                })
                .to_string()
            } else {
                format!("{REDIS_PRUNES_ITSELF}\n")
            });
        }
        #[cfg(feature = "dynamodb")]
        Upkeep::Dynamo { .. } => Some(DYNAMO_TTL),
        Upkeep::Sql => None,
    };
    let started = Instant::now();
    let (mut deleted, mut batches) = (0u64, 0u64);
    // Bounded: every pass but the last deletes a whole batch of the finite expired records, or
    // (DynamoDB) goes on scanning the table where the previous one stopped.
    loop {
        let n = opened.store().prune_expired(args.batch).await?;
        deleted += n;
        batches += 1;
        if !as_json {
            eprintln!("batch {batches}: deleted {n} (total {deleted})");
        }
        if n < u64::from(args.batch) && !opened.prune_unfinished() {
            break;
        }
    }
    let took = started.elapsed();
    Ok(if as_json {
        let mut out = json!({
            "deleted": deleted,
            "batches": batches,
            "seconds": took.as_secs_f64(),
            "deletes_expired_itself": note.is_some(),
        });
        if let Some(note) = note {
            out["note"] = json!(note);
        }
        out.to_string()
    } else {
        let mut text = format!(
            "pruned {deleted} expired records in {batches} batches, {:.2} s\n",
            took.as_secs_f64()
        );
        if let Some(note) = note {
            text.push_str(note);
            text.push('\n');
        }
        text
    })
}

async fn migrate(opened: &Opened, as_json: bool) -> Result<String, Failure> {
    let version = opened.admin().schema_version().await?;
    // What was done, and (DynamoDB) whether the table was created.
    let (done, created): (String, Option<bool>) = match opened.upkeep() {
        Upkeep::Sql => (
            format!("the records table is at schema version {version}"),
            None,
        ),
        #[cfg(feature = "redis")]
        Upkeep::Redis => (
            format!("nothing to migrate on Redis: records are hashes of layout version {version}"),
            None,
        ),
        #[cfg(feature = "dynamodb")]
        Upkeep::Dynamo { created, table } => (
            if created {
                format!(
                    "created the DynamoDB table {table:?} (on-demand, key `pk`, TTL on `ttl_s`); \
                     item layout version {version}"
                )
            } else {
                format!(
                    "the DynamoDB table {table:?} exists with the store's key; item layout \
                     version {version}"
                )
            },
            Some(created),
        ),
    };
    Ok(if as_json {
        let mut out = json!({ "schema_version": version, "done": done });
        if let Some(created) = created {
            out["created_table"] = json!(created);
        }
        out.to_string()
    } else {
        format!("{done}\n")
    })
}

async fn run(cli: Cli) -> Result<String, Failure> {
    let url = cli
        .url
        .ok_or_else(|| Failure::Usage("give the store with --url (or IDEM_URL)".into()))?;
    let store_url = StoreUrl::parse(&url)?;
    let table = match &cli.table {
        Some(table) => table.clone(),
        None => store_url.default_namespace().to_owned(),
    };
    let create = matches!(cli.command, Command::Migrate);
    let opened = tokio::time::timeout(
        stores::OPEN_WITHIN,
        Opened::open(&store_url, &table, create),
    )
    .await
    .map_err(|_| Failure::Usage(unreachable(&url)))??;
    match &cli.command {
        Command::Inspect(which) => inspect(&opened, which, cli.json).await,
        Command::Evict(which) => evict(&opened, which, cli.json).await,
        Command::Uncertain(args) => uncertain(&opened, args, cli.json).await,
        Command::Resolve(args) => resolve(&opened, args, cli.json).await,
        Command::List(args) => list(&opened, args, cli.json).await,
        Command::Stats => stats(&opened, cli.json).await,
        Command::Prune(args) => prune(&opened, args, cli.json).await,
        Command::Migrate => migrate(&opened, cli.json).await,
    }
}

/// What the CLI says of a store it could not reach in time: the URL without its password.
fn unreachable(url: &str) -> String {
    format!(
        "could not reach {:?} within {} s",
        redacted(url),
        stores::OPEN_WITHIN.as_secs()
    )
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

#[cfg(test)]
mod tests {
    #[test]
    fn an_unreachable_store_is_named_without_its_password() {
        let message = super::unreachable("postgres://app:s3cret@db.internal:5432/app");
        assert!(!message.contains("s3cret"), "{message}");
        assert!(
            message.contains("postgres://app:***@db.internal:5432/app"),
            "{message}"
        );
    }
}
