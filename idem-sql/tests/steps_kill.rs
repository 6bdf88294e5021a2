//! The acceptance test of steps (docs/steps.md): a three-step operation (a ride row written in a
//! transactional step, a charge through a real HTTP server on loopback that counts its calls,
//! an outbox row in a transactional step) runs in a child process (this test binary again) that
//! is killed with SIGKILL at every step boundary and inside every step, on SQLite and on
//! PostgreSQL, in both modes of the charge step. The parent then retries the operation, twice:
//!
//! - each finished step's effect happened exactly once (one ride row, one outbox row, one
//!   charge), and a transactional step killed between its write and its commit left nothing
//!   (still one row after the retry ran it again);
//! - the charge killed after its call and before its record ran again (two calls) when it is at
//!   least once; when it is at most once, the holder died inside it with the key uncertain on
//!   lapse (the engine writes `OnLapse::Uncertain` with the step's begin), so both retries get
//!   `Error::Uncertain` naming the key (one call, no outbox row) and nothing runs again until
//!   the operation is resolved (docs/architecture.md, "Past the lease");
//! - both callers get the same final result (the first fresh, at attempt 2; the second replayed),
//!   or the same refusal.

#![cfg(feature = "sqlite")]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::Uri;
use axum::routing::post;
use axum::Router;
use idem_core::{Error, Idempotency, Key, OnLocked, Outcome};
use idem_sql::SqlSteps;
use serde::{Deserialize, Serialize};

/// Set in the child: the scenario it runs, as `KEY=VALUE` lines (see [`Scenario`]).
const CHILD: &str = "IDEM_STEPS_KILL_CHILD";

/// Where the child stops to be killed: before, inside and after each step.
const POINTS: [&str; 7] = [
    "before-ride",
    "in-ride",
    "after-ride",
    "in-charge",
    "after-charge",
    "in-outbox",
    "after-outbox",
];

/// What the operation returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Ride {
    ride: i64,
    charge: String,
    outbox: i64,
    attempt: u32,
}

/// What the operation fails with.
#[derive(Debug)]
enum Failed {
    Idem(Error),
    // Read through `Debug`, in the assertions' messages.
    #[allow(dead_code)]
    Http(String),
}

impl From<Error> for Failed {
    fn from(e: Error) -> Self {
        Failed::Idem(e)
    }
}

impl From<sqlx::Error> for Failed {
    fn from(e: sqlx::Error) -> Self {
        Failed::Idem(idem_sql::sql_error(e).into())
    }
}

impl From<reqwest::Error> for Failed {
    fn from(e: reqwest::Error) -> Self {
        Failed::Http(e.to_string())
    }
}

/// In the child killed at `here`: says so on stdout and waits for the SIGKILL (bounded: a
/// child the parent forgot fails after a minute).
async fn stop(kill_at: &str, here: &str) {
    if kill_at == here {
        println!("AT {here}");
        std::io::stdout().flush().unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        panic!("not killed at {here} within 60 s");
    }
}

/// One run of the operation and what it is given.
#[derive(Debug, Clone)]
struct Scenario {
    /// `sqlite:<path>` or a PostgreSQL URL.
    db: String,
    /// The records table, and the prefix of the rides and outbox tables.
    table: String,
    stub: String,
    point: String,
    at_most_once: bool,
}

impl Scenario {
    /// The operation's key, and the label its rows and charges carry.
    fn label(&self) -> String {
        format!("{}-{}", self.point, self.at_most_once)
    }

    fn key(&self) -> Key {
        Key::derive("rides", "", &self.label()).unwrap()
    }

    fn to_env(&self) -> String {
        format!(
            "db={}\ntable={}\nstub={}\npoint={}\nat_most_once={}",
            self.db, self.table, self.stub, self.point, self.at_most_once
        )
    }

    fn from_env(text: &str) -> Scenario {
        let map: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        Scenario {
            db: map["db"].to_owned(),
            table: map["table"].to_owned(),
            stub: map["stub"].to_owned(),
            point: map["point"].to_owned(),
            at_most_once: map["at_most_once"] == "true",
        }
    }
}

/// The operation, written once for both databases: `$store` its store type, `$begin` how a
/// step's transaction begins.
macro_rules! ride_operation {
    ($name:ident, $store:ty, $begin:literal) => {
        async fn $name(
            engine: &Idempotency,
            store: &$store,
            s: &Scenario,
            kill_at: &str,
        ) -> Result<Outcome<Ride>, Failed> {
            use sqlx::Connection;
            let (t, label, stub) = (&s.table, &s.label(), &s.stub);
            engine
                .call(s.key())
                .on_locked(OnLocked::Wait {
                    timeout: Duration::from_secs(60),
                })
                .run_steps(|steps| async move {
                    stop(kill_at, "before-ride").await;
                    let mut conn = store.pool().acquire().await?;
                    let mut tx = conn.begin_with($begin).await?;
                    // A transactional step's work owns what it uses (it may run for any lifetime
                    // of the connection).
                    let (sql, owned_label, owned_kill) = (
                        format!("INSERT INTO {t}_rides (label) VALUES ($1) RETURNING id"),
                        label.clone(),
                        kill_at.to_owned(),
                    );
                    let ride: i64 = steps
                        .tx(store, &mut tx, "create ride", |tx| {
                            Box::pin(async move {
                                let (label, kill_at) = (&owned_label, owned_kill.as_str());
                                let id = sqlx::query_scalar(&sql)
                                    .bind(label)
                                    .fetch_one(&mut *tx)
                                    .await?;
                                stop(kill_at, "in-ride").await;
                                Ok::<i64, Failed>(id)
                            })
                        })
                        .await?;
                    tx.commit().await?;
                    stop(kill_at, "after-ride").await;

                    let charge = steps.step("charge");
                    let charge = if s.at_most_once {
                        charge.at_most_once()
                    } else {
                        charge
                    };
                    let charge: String = charge
                        .run(|| async move {
                            let url = format!("{stub}/charge?label={label}&ride={ride}");
                            let id = reqwest::Client::new()
                                .post(url)
                                .send()
                                .await?
                                .text()
                                .await?;
                            stop(kill_at, "in-charge").await;
                            Ok::<String, Failed>(id)
                        })
                        .await?;
                    stop(kill_at, "after-charge").await;

                    let mut tx = conn.begin_with($begin).await?;
                    let (sql, owned_label, owned_kill) = (
                        format!(
                            "INSERT INTO {t}_outbox (label, ride) VALUES ($1, $2) RETURNING id"
                        ),
                        label.clone(),
                        kill_at.to_owned(),
                    );
                    let outbox: i64 = steps
                        .tx(store, &mut tx, "queue receipt", |tx| {
                            Box::pin(async move {
                                let (label, kill_at) = (&owned_label, owned_kill.as_str());
                                let id = sqlx::query_scalar(&sql)
                                    .bind(label)
                                    .bind(ride)
                                    .fetch_one(&mut *tx)
                                    .await?;
                                stop(kill_at, "in-outbox").await;
                                Ok::<i64, Failed>(id)
                            })
                        })
                        .await?;
                    tx.commit().await?;
                    stop(kill_at, "after-outbox").await;
                    Ok(Ride {
                        ride,
                        charge,
                        outbox,
                        attempt: steps.attempt().number,
                    })
                })
                .await
        }
    };
}

ride_operation!(ride_on_sqlite, idem_sql::SqliteStore, "BEGIN IMMEDIATE");
#[cfg(feature = "postgres")]
ride_operation!(ride_on_postgres, idem_sql::PostgresStore, "BEGIN");

mod support;
use support::steps_db::Db;

/// What the scenarios do on their database beside the shared [`Db`]: run the operation, count
/// the rows it wrote.
impl Db {
    async fn run(
        &self,
        engine: &Idempotency,
        s: &Scenario,
        kill_at: &str,
    ) -> Result<Outcome<Ride>, Failed> {
        match self {
            Db::Sqlite(store) => ride_on_sqlite(engine, store, s, kill_at).await,
            #[cfg(feature = "postgres")]
            Db::Postgres(store) => ride_on_postgres(engine, store, s, kill_at).await,
        }
    }

    /// How many rows of `table` carry `label`.
    async fn count(&self, table: &str, label: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table} WHERE label = $1");
        match self {
            Db::Sqlite(s) => {
                sqlx::query_scalar(&sql)
                    .bind(label)
                    .fetch_one(s.pool())
                    .await
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => {
                sqlx::query_scalar(&sql)
                    .bind(label)
                    .fetch_one(s.pool())
                    .await
            }
        }
        .unwrap()
    }
}

/// The child's side: runs the scenario in `IDEM_STEPS_KILL_CHILD` on a 1 s lease, to be killed at
/// its point. Without the variable (an ordinary test run) it does nothing: it is the entry the
/// parents start their children through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_kill_child_entry() {
    let Ok(text) = std::env::var(CHILD) else {
        return;
    };
    let s = Scenario::from_env(&text);
    let db = Db::open(&s.db, &s.table).await;
    let engine = db.engine(Duration::from_secs(1));
    let out = db.run(&engine, &s, &s.point).await;
    panic!("the child ran to its end without being killed: {out:?}");
}

/// The HTTP server standing in for the payment provider: counts the charges of each label.
struct Stub {
    url: String,
    calls: Arc<Mutex<HashMap<String, usize>>>,
}

impl Stub {
    async fn start() -> Stub {
        let calls: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let app = Router::new()
            .route(
                "/charge",
                post(
                    |State(calls): State<Arc<Mutex<HashMap<String, usize>>>>, uri: Uri| async move {
                        // `label=…&ride=…`, written by the operation: no escaping needed.
                        let query: HashMap<&str, &str> = uri
                            .query()
                            .unwrap_or_default()
                            .split('&')
                            .filter_map(|pair| pair.split_once('='))
                            .collect();
                        let (label, ride) = (query["label"], query["ride"]);
                        let mut calls = calls.lock().unwrap();
                        let n = calls.entry(label.to_owned()).or_default();
                        *n += 1;
                        format!("ch_{label}_{ride}_{n}")
                    },
                ),
            )
            .with_state(calls.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Stub { url, calls }
    }

    fn calls(&self, label: &str) -> usize {
        self.calls.lock().unwrap().get(label).copied().unwrap_or(0)
    }
}

/// Starts the child for `s`, waits until it reports that it stopped at its point, and kills it
/// with SIGKILL.
fn run_child_and_kill(s: &Scenario) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "steps_kill_child_entry", "--nocapture"])
        .env(CHILD, s.to_env())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(point) = line.strip_prefix("AT ") {
                let _ = tx.send(point.to_owned());
            }
        }
    });
    let reached = rx.recv_timeout(Duration::from_secs(120));
    // `Child::kill` is SIGKILL on Unix: no destructor, no rollback, no release runs.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        reached.as_deref(),
        Ok(s.point.as_str()),
        "the child did not reach {}",
        s.point
    );
}

/// Every point in both modes on `db`: the child is killed there, then two callers retry.
async fn every_point(db_url: String, table: String) {
    let stub = Stub::start().await;
    let mut s = Scenario {
        db: db_url,
        table,
        stub: stub.url.clone(),
        point: String::new(),
        at_most_once: false,
    };
    let db = Db::open(&s.db, &s.table).await;
    let (t, id) = (
        &s.table,
        if s.db.starts_with("sqlite:") {
            "INTEGER PRIMARY KEY"
        } else {
            "BIGSERIAL PRIMARY KEY"
        },
    );
    db.exec(&format!(
        "CREATE TABLE {t}_rides (id {id}, label TEXT NOT NULL); \
         CREATE TABLE {t}_outbox (id {id}, label TEXT NOT NULL, ride BIGINT NOT NULL)"
    ))
    .await;
    let engine = db.engine(Duration::from_secs(30));
    for at_most_once in [false, true] {
        for point in POINTS {
            s.point = point.to_owned();
            s.at_most_once = at_most_once;
            let label = s.label();
            run_child_and_kill(&s);
            // The child's claim frees when its 1 s lease ends; the retry waits for it.
            let first = db.run(&engine, &s, "").await;
            let second = db.run(&engine, &s, "").await;
            let rides = db.count(&format!("{t}_rides"), &label).await;
            let outbox = db.count(&format!("{t}_outbox"), &label).await;
            let charges = stub.calls(&label);
            let at = format!("killed at {point}, at most once: {at_most_once}");
            assert_eq!(rides, 1, "{at}: ride rows");
            if at_most_once && point == "in-charge" {
                // Killed inside an at-most-once step: uncertain, never run again by a retry.
                for retry in [&first, &second] {
                    assert!(
                        matches!(retry, Err(Failed::Idem(Error::Uncertain { operation, .. })) if *operation == s.key()),
                        "{at}: {retry:?}"
                    );
                }
                assert_eq!((charges, outbox), (1, 0), "{at}: charges and outbox rows");
                continue;
            }
            let Ok(Outcome::Fresh(ride)) = first else {
                panic!("{at}: the retry did not finish: {first:?}");
            };
            assert!(
                matches!(&second, Ok(Outcome::Replayed(again)) if *again == ride),
                "{at}: the second caller got {second:?}, the first {ride:?}"
            );
            assert_eq!(ride.attempt, 2, "{at}: the retry is the second attempt");
            assert_eq!(outbox, 1, "{at}: outbox rows");
            let expected = if point == "in-charge" { 2 } else { 1 };
            assert_eq!(charges, expected, "{at}: charges");
            assert!(
                ride.charge.ends_with(&format!("_{expected}")),
                "{at}: {ride:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_steps_survive_sigkill_at_every_point() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rides.db");
    every_point(format!("sqlite:{}", path.display()), "idem_records".into()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_steps_survive_sigkill_at_every_point() {
    let Some(url) =
        idem_test_support::postgres::pg_url("postgres_steps_survive_sigkill_at_every_point")
    else {
        return;
    };
    let table = idem_test_support::unique_name("idem_kill");
    every_point(url.clone(), table.clone()).await;
    idem_test_support::postgres::drop_tables_now(
        &url,
        &[
            &table,
            &format!("{table}_steps"),
            &format!("{table}_migrations"),
            &format!("{table}_rides"),
            &format!("{table}_outbox"),
        ],
    );
}
