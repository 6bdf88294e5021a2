//! The `idem-server` binary: flags (or the environment), the store, the routes, and a graceful
//! shutdown on SIGTERM or Ctrl-C, which answers the requests in flight and then closes the store
//! (a SQLite store checkpoints its log, so no `-wal` or `-shm` file stays behind).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

// The binary opens its store from a URL, so it needs at least one store built in; without one
// the build stops here, saying so, instead of at the imports below.
#[cfg(not(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "dynamodb"
)))]
compile_error!(
    "idem-server needs a store to serve from: build it with at least one of the features \
     `sqlite`, `postgres`, `redis`, `dynamodb` (the default is `sqlite` and `postgres`), \
     e.g. `cargo build -p idem-server --no-default-features --features redis`"
);
use idem::store::url::{ConnectOptions, Scheme, StoreUrl};
use idem_server::{auth::Tokens, router, App, Config};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Idempotency as a service: Diom's idempotency protocol on idem's engine and stores.
#[derive(Debug, Parser)]
#[command(name = "idem-server", version)]
struct Args {
    /// Where to listen.
    #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8624")]
    listen: SocketAddr,
    /// The store, as a URL the `idem` command takes (sqlite, postgres, redis, redis-cluster,
    /// dynamodb).
    #[arg(long, env = "IDEM_STORE", default_value = "sqlite://idem.db")]
    store: String,
    /// The admin token: configures namespaces (at least 16 characters).
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
    /// A caller's token, as NAME=TOKEN; repeat it, or separate pairs with commas in the
    /// environment. Each caller's keys live in a key space of its own.
    #[arg(
        long = "caller-token",
        env = "IDEM_CALLER_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    caller_tokens: Vec<String>,
    /// Refuse complete and abort without the claim's token in every namespace.
    #[arg(long, env = "IDEM_REQUIRE_TOKEN")]
    require_token: bool,
    /// The largest request body, in bytes.
    #[arg(long, env = "IDEM_MAX_BODY_BYTES", default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// How long a request may take, in milliseconds.
    #[arg(long, env = "IDEM_REQUEST_TIMEOUT_MS", default_value_t = 30_000)]
    request_timeout_ms: u64,
    /// How long, in milliseconds, a key the server resolves on its own account (an admin's
    /// `uncertain.resolve`) is kept as a tombstone after its result's retention; 0 for none. A
    /// `complete` keeps the tombstone its `key_retention_ms` asks for (none when absent, as in
    /// Diom). At most ten years.
    #[arg(
        long,
        env = "IDEM_KEY_RETENTION_MS",
        default_value_t = idem_core::DEFAULT_KEY_RETENTION.as_millis() as u64,
        value_parser = clap::value_parser!(u64).range(0..=MAX_PERIOD_MS)
    )]
    key_retention_ms: u64,
    /// The store's table (SQL, DynamoDB) or key prefix (Redis).
    #[arg(long, env = "IDEM_TABLE")]
    table: Option<String>,
    /// The SQL store's pool size, 1 to 1024 connections (default: SQLite 8, PostgreSQL 10).
    /// Only for sqlite and postgres stores.
    #[arg(
        long,
        env = "IDEM_MAX_CONNECTIONS",
        value_parser = clap::value_parser!(u32).range(1..=MAX_POOL)
    )]
    max_connections: Option<u32>,
    /// Log lines as JSON objects.
    #[arg(long, env = "IDEM_LOG_JSON")]
    log_json: bool,
}

/// The largest pool `--max-connections` takes: more is a typo, not a deployment.
const MAX_POOL: i64 = 1024;

/// The longest period the stores take, ten years, in milliseconds.
const MAX_PERIOD_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.log_json {
        tracing_subscriber::fmt().json().init();
    } else {
        tracing_subscriber::fmt().init();
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "idem-server stopped");
            eprintln!("idem-server: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let tokens = Tokens::new(&args.admin_token, &args.caller_tokens)?;
    let url = StoreUrl::parse(&args.store)?;
    // The server's SQLite file holds only its store's records: its writers take turns for the
    // write lock rather than all meeting it taken (docs/performance.md, "Side by side with
    // Diom").
    let mut options = ConnectOptions::new()
        .create_table_if_missing(true)
        .sqlite_writers_take_turns(true);
    if let Some(table) = &args.table {
        options = options.namespace(table.clone());
    }
    if let Some(n) = args.max_connections {
        if !matches!(url.scheme(), Scheme::Sqlite | Scheme::Postgres) {
            return Err(format!(
                "--max-connections sizes the pool of a sqlite or postgres store; the {} store \
                 keeps no such pool: leave it out",
                url.scheme().form()
            )
            .into());
        }
        options = options.max_connections(n);
    }
    let opened = url.connect(&options).await?;
    let store = opened.clone().into_store();
    let mut prometheus = PrometheusBuilder::new();
    for (name, bounds) in idem_core::PROMETHEUS_BUCKETS {
        prometheus =
            prometheus.set_buckets_for_metric(Matcher::Full((*name).to_owned()), bounds)?;
    }
    let metrics = prometheus.install_recorder()?;
    let config = Config {
        max_body_bytes: args.max_body_bytes,
        request_timeout: Duration::from_millis(args.request_timeout_ms),
        require_token: args.require_token,
        key_retention: Duration::from_millis(args.key_retention_ms),
        ..Config::default()
    };
    let app = App::new(store, tokens, config, Some(metrics))?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(
        listen = %listener.local_addr()?,
        store = url.scheme().form(),
        max_connections = args.max_connections,
        "idem-server listening"
    );
    axum::serve(listener, router(app))
        .with_graceful_shutdown(shutdown())
        .await?;
    opened.close().await?;
    tracing::info!("idem-server stopped: every request in flight was answered, the store closed");
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C: the server then stops accepting and finishes what it has.
async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(e) => {
                    tracing::warn!(error = %e, "no SIGTERM handler; stopping on Ctrl-C only");
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("shutting down: no new connections; finishing requests in flight");
}
