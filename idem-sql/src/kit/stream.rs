//! Event streams: appends at an expected version, with event ids derived from the request id.

use std::fmt;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::Connection;
use uuid::Uuid;

use super::backend::{is_unique_violation, Backend, SqlQuery};
use super::{migrate, name, version_from_sql, version_to_sql, ConcurrencyError, Version};
use crate::migrate::Schema;
use crate::name::TableName;
use idem_core::{StoreError, StoreErrorKind};

/// The UUID v5 namespace of the first event id of every request
/// (`uuid5(NAMESPACE_URL, "https://docs.rs/idem/kit/events")`).
///
/// ```
/// assert_eq!(idem::kit::EVENT_NAMESPACE.get_version_num(), 5);
/// ```
pub const EVENT_NAMESPACE: Uuid = Uuid::from_u128(0x87708a3e_cbb2_5391_b851_ce8f2840ef91);

/// The most events one [`EventStreams::append`] takes: each is three bound parameters, and the
/// statement stays well inside every database's parameter limit.
///
/// ```
/// assert!(idem::kit::MAX_EVENTS_PER_APPEND >= 100);
/// ```
pub const MAX_EVENTS_PER_APPEND: usize = 1000;

/// How many times an append reruns after losing a race it could not attribute (a concurrent
/// append that took its version, or a blocking one that then rolled back).
const APPEND_ATTEMPTS: u32 = 5;

/// The longest stream name accepted, in bytes.
const MAX_STREAM_LEN: usize = 255;

/// The version an append expects the stream to be at.
///
/// ```
/// use idem::kit::{ExpectedVersion, Version};
/// let after_open = ExpectedVersion::Exact(Version::INITIAL);
/// assert_ne!(after_open, ExpectedVersion::NoStream);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpectedVersion {
    /// Append at the end, whatever the version. Under heavy concurrent appends to one stream it
    /// can still run out of attempts and return a conflict.
    Any,
    /// The stream must have no event yet.
    NoStream,
    /// The stream's last event must have this version ([`Version::NONE`] means
    /// [`NoStream`](ExpectedVersion::NoStream)).
    Exact(Version),
}

/// The ids of a request's events: UUID v5, chained.
///
/// `id_1 = uuid5(EVENT_NAMESPACE, u64_be(len(stream)) ‖ stream ‖ request_id)` and
/// `id_k = uuid5(id_(k-1), "next")`. The stream is part of the name, so one request may append to
/// several streams; the length prefix keeps `("a", "bc")` and `("ab", "c")` apart. The same
/// request always gets the same ids, and the table holds each id once, so a repeated append is
/// recognised exactly.
///
/// ```
/// use idem::kit::event_ids;
/// let ids: Vec<_> = event_ids("account-1", "req-7").take(2).collect();
/// assert_eq!(ids, event_ids("account-1", "req-7").take(2).collect::<Vec<_>>());
/// assert_ne!(ids[0], ids[1]);
/// assert_ne!(ids[0], event_ids("account-2", "req-7").next().unwrap());
/// ```
pub fn event_ids(stream: &str, request_id: &str) -> EventIds {
    let mut name = Vec::with_capacity(8 + stream.len() + request_id.len());
    name.extend_from_slice(&(stream.len() as u64).to_be_bytes());
    name.extend_from_slice(stream.as_bytes());
    name.extend_from_slice(request_id.as_bytes());
    EventIds {
        next: Uuid::new_v5(&EVENT_NAMESPACE, &name),
    }
}

/// The endless sequence of a request's event ids; see [`event_ids`].
///
/// ```
/// let first = idem::kit::event_ids("s", "r").next();
/// assert!(first.is_some());
/// ```
#[derive(Debug, Clone)]
pub struct EventIds {
    next: Uuid,
}

impl Iterator for EventIds {
    type Item = Uuid;

    fn next(&mut self) -> Option<Uuid> {
        let id = self.next;
        self.next = Uuid::new_v5(&id, b"next");
        Some(id)
    }
}

/// An event to append: its type and its payload.
///
/// ```
/// use idem::kit::NewEvent;
/// let e = NewEvent::json("deposited", &serde_json::json!({ "amount": 10 }))?;
/// assert_eq!(e.event_type(), "deposited");
/// assert_eq!(e.payload(), br#"{"amount":10}"#);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    event_type: String,
    payload: Vec<u8>,
}

impl NewEvent {
    /// An event with a payload of raw bytes.
    ///
    /// ```
    /// let e = idem::kit::NewEvent::new("opened", b"{}".to_vec());
    /// assert_eq!(e.payload(), b"{}");
    /// ```
    pub fn new(event_type: impl Into<String>, payload: Vec<u8>) -> NewEvent {
        NewEvent {
            event_type: event_type.into(),
            payload,
        }
    }

    /// An event whose payload is `value` as JSON.
    ///
    /// ```
    /// let e = idem::kit::NewEvent::json("withdrawn", &5)?;
    /// assert_eq!(e.payload(), b"5");
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn json<T: Serialize + ?Sized>(
        event_type: impl Into<String>,
        value: &T,
    ) -> Result<NewEvent, serde_json::Error> {
        Ok(NewEvent::new(event_type, serde_json::to_vec(value)?))
    }

    /// The event's type.
    ///
    /// ```
    /// assert_eq!(idem::kit::NewEvent::new("t", vec![]).event_type(), "t");
    /// ```
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// The event's payload.
    ///
    /// ```
    /// assert!(idem::kit::NewEvent::new("t", vec![]).payload().is_empty());
    /// ```
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// A stored event, as [`EventStreams::read`] returns it.
///
/// ```
/// use idem::kit::{event_ids, Event, Version};
/// let e = Event {
///     stream: "account-1".into(),
///     version: Version::INITIAL,
///     event_id: event_ids("account-1", "req-1").next().unwrap(),
///     request_id: "req-1".into(),
///     event_type: "deposited".into(),
///     payload: br#"{"amount":10}"#.to_vec(),
/// };
/// let amount: serde_json::Value = e.json()?;
/// assert_eq!(amount["amount"], 10);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The stream it belongs to.
    pub stream: String,
    /// Its position in the stream, from [`Version::INITIAL`] on, without gaps.
    pub version: Version,
    /// Its id, derived from the request id (see [`event_ids`]).
    pub event_id: Uuid,
    /// The request that appended it.
    pub request_id: String,
    /// Its type.
    pub event_type: String,
    /// Its payload.
    pub payload: Vec<u8>,
}

impl Event {
    /// Decodes the payload as JSON.
    ///
    /// ```
    /// # use idem::kit::{Event, Version};
    /// # let e = Event { stream: "s".into(), version: Version::INITIAL, event_id: uuid::Uuid::nil(),
    /// #     request_id: "r".into(), event_type: "t".into(), payload: b"7".to_vec() };
    /// let n: i64 = e.json()?;
    /// assert_eq!(n, 7);
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

/// The outcome of [`EventStreams::append`].
///
/// ```
/// use idem::kit::{Appended, Version};
/// let a = Appended::New { first: Version::new(3), last: Version::new(4) };
/// assert_eq!(a.last(), Version::new(4));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "Duplicate means nothing was appended"]
pub enum Appended {
    /// The events were appended at versions `first..=last`.
    New {
        /// The version of the first appended event.
        first: Version,
        /// The version of the last appended event: the stream's version now.
        last: Version,
    },
    /// This request's events were already in the stream, the first of them at `first`. Nothing
    /// was added.
    Duplicate {
        /// The version of the request's first stored event.
        first: Version,
    },
}

impl Appended {
    /// The version of the first event of this request, new or stored before.
    ///
    /// ```
    /// use idem::kit::{Appended, Version};
    /// assert_eq!(Appended::Duplicate { first: Version::new(2) }.first(), Version::new(2));
    /// ```
    pub fn first(self) -> Version {
        match self {
            Appended::New { first, .. } | Appended::Duplicate { first } => first,
        }
    }

    /// The version of the last appended event; for a duplicate, of its first stored event.
    ///
    /// ```
    /// use idem::kit::{Appended, Version};
    /// assert_eq!(Appended::Duplicate { first: Version::new(2) }.last(), Version::new(2));
    /// ```
    pub fn last(self) -> Version {
        match self {
            Appended::New { last, .. } => last,
            Appended::Duplicate { first } => first,
        }
    }
}

/// A table of event streams: `(stream, version)` is the primary key, `event_id` is unique.
///
/// An append is one statement that checks the expected version and inserts every event, so it
/// adds all of them or none. When it adds nothing, one read of the stream's version and of the
/// request's first event id tells [`Appended::Duplicate`] (the id is there) from
/// [`ConcurrencyError::Conflict`] (the stream moved on). A concurrent duplicate is stopped by the
/// unique event id (`DatabaseError::kind() == UniqueViolation`, never message text) and told the
/// same way. Inside your own PostgreSQL transaction the statement runs under a savepoint
/// (two more round trips), so a duplicate does not abort your transaction.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem::kit::{Appended, ConcurrencyError, EventStreams, ExpectedVersion, NewEvent, Version};
/// # use sqlx::Connection;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
/// let streams = EventStreams::<sqlx::Sqlite>::new("events")?;
/// streams.ensure_schema(&mut conn).await?;
///
/// let opened = [NewEvent::json("opened", &0)?];
/// let first = streams.append(&mut conn, "account-1", "req-1", ExpectedVersion::NoStream, &opened).await?;
/// assert_eq!(first, Appended::New { first: Version::INITIAL, last: Version::INITIAL });
///
/// // The same request again: recognised by its event ids, nothing added.
/// let again = streams.append(&mut conn, "account-1", "req-1", ExpectedVersion::NoStream, &opened).await?;
/// assert_eq!(again, Appended::Duplicate { first: Version::INITIAL });
///
/// // Another request based on a stale version: a conflict carrying both versions.
/// let deposit = [NewEvent::json("deposited", &10)?];
/// let err = streams.append(&mut conn, "account-1", "req-2", ExpectedVersion::NoStream, &deposit).await.unwrap_err();
/// assert!(matches!(err, ConcurrencyError::Conflict { expected, actual }
///     if expected == Version::NONE && actual == Version::INITIAL));
///
/// assert_eq!(streams.read(&mut conn, "account-1").await?.len(), 1);
/// # Ok(()) }
/// # }
/// ```
pub struct EventStreams<DB> {
    table: TableName,
    _db: PhantomData<fn() -> DB>,
}

impl<DB> fmt::Debug for EventStreams<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventStreams")
            .field("table", &self.table)
            .finish()
    }
}

impl<DB> Clone for EventStreams<DB> {
    fn clone(&self) -> Self {
        EventStreams {
            table: self.table.clone(),
            _db: PhantomData,
        }
    }
}

impl<DB: Backend> EventStreams<DB> {
    /// Streams kept in the table `table`: a plain SQL identifier of at most 63 bytes. Its
    /// ledger is `<table>_migrations`, cut short and ending in a hash of the whole when that
    /// is longer than 63 bytes (docs/stores.md).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use idem::kit::EventStreams;
    /// assert!(EventStreams::<sqlx::Sqlite>::new("events").is_ok());
    /// assert!(EventStreams::<sqlx::Sqlite>::new("my events").is_err());
    /// # }
    /// ```
    pub fn new(table: &str) -> Result<EventStreams<DB>, ConcurrencyError> {
        Ok(EventStreams {
            table: name("event table", table)?,
            _db: PhantomData,
        })
    }

    /// Creates the table if it does not exist: the event table's migrations, applied once in
    /// one transaction and recorded in `<table>_migrations` (the stores' migrator), so any
    /// number of processes may run it at startup together.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// # use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
    /// let streams = idem::kit::EventStreams::<sqlx::Sqlite>::new("events")?;
    /// streams.ensure_schema(&mut conn).await?;
    /// streams.ensure_schema(&mut conn).await?; // idempotent
    /// # Ok(()) }
    /// # }
    /// ```
    pub async fn ensure_schema(&self, conn: &mut DB::Connection) -> Result<(), ConcurrencyError> {
        let schema = Schema {
            table: &self.table,
            names: &[],
            migrations: MIGRATIONS,
        };
        migrate::<DB>(conn, &schema).await
    }

    /// Appends `events` to `stream` on behalf of the request `request_id`, if the stream is at
    /// `expected`.
    ///
    /// - [`Appended::New`]: all events were added, at consecutive versions.
    /// - [`Appended::Duplicate`]: this request's events are already in the stream; nothing was
    ///   added, whatever `expected` says (a retried request is answered as done, not as a
    ///   conflict).
    /// - [`ConcurrencyError::Conflict`]: the stream is not at `expected` (`expected` is
    ///   [`Version::NONE`] for [`ExpectedVersion::NoStream`]); nothing was added.
    ///
    /// `stream` is 1 to 255 bytes, `request_id` 1 to 255 bytes of printable ASCII, and there are
    /// 1 to [`MAX_EVENTS_PER_APPEND`] events; otherwise nothing is touched. One statement when
    /// the events are new; see [`EventStreams`] for the rest and an example.
    pub async fn append(
        &self,
        conn: &mut DB::Connection,
        stream: &str,
        request_id: &str,
        expected: ExpectedVersion,
        events: &[NewEvent],
    ) -> Result<Appended, ConcurrencyError> {
        check_stream(stream)?;
        idem_core::validate_client_key(request_id)?;
        if events.is_empty() || events.len() > MAX_EVENTS_PER_APPEND {
            return Err(ConcurrencyError::InvalidInput(format!(
                "an append takes 1 to {MAX_EVENTS_PER_APPEND} events, got {}",
                events.len()
            )));
        }
        // -1 lets the statement skip the version check for `Any`.
        let required = match expected {
            ExpectedVersion::Any => None,
            ExpectedVersion::NoStream => Some(Version::NONE),
            ExpectedVersion::Exact(v) => Some(v),
        };
        let required_sql = required.map(version_to_sql).transpose()?.unwrap_or(-1);
        let ids: Vec<Uuid> = event_ids(stream, request_id).take(events.len()).collect();
        let insert_sql = self.insert_sql(events.len());
        let follow_up_sql = format!(
            "SELECT (SELECT COALESCE(MAX(version), 0) FROM {t} WHERE stream = $1), \
                    (SELECT version FROM {t} WHERE event_id = $2)",
            t = self.table
        );
        let mut seen: Option<Version> = None;
        let mut attempt = 1;
        loop {
            let mut query = DB::bind_i64(
                DB::bind_str(DB::bind_str(sqlx::query(&insert_sql), stream), request_id),
                required_sql,
            );
            for (event, id) in events.iter().zip(&ids) {
                query = DB::bind_uuid(query, *id);
                query = DB::bind_str(query, &event.event_type);
                query = DB::bind_bytes(query, &event.payload);
            }
            match insert_guarded::<DB>(conn, query).await {
                Ok(rows) => {
                    let mut versions = Vec::with_capacity(rows.len());
                    for row in &rows {
                        versions.push(version_from_sql(DB::get_i64(row, 0)?)?);
                    }
                    if let (Some(first), Some(last)) =
                        (versions.iter().min(), versions.iter().max())
                    {
                        return Ok(Appended::New {
                            first: *first,
                            last: *last,
                        });
                    }
                    // No row: the stream is not at the required version.
                }
                Err(e) if is_unique_violation(&e) => {}
                Err(e) => return Err(e.into()),
            }

            let follow_up =
                DB::bind_uuid(DB::bind_str(sqlx::query(&follow_up_sql), stream), ids[0]);
            let row = DB::fetch_optional(conn, follow_up).await?.ok_or_else(|| {
                StoreError::new(StoreErrorKind::Query, "a scalar select returned no row")
            })?;
            let actual = version_from_sql(DB::get_i64(&row, 0)?)?;
            if let Some(first) = DB::get_opt_i64(&row, 1)? {
                return Ok(Appended::Duplicate {
                    first: version_from_sql(first)?,
                });
            }
            match required {
                Some(required) if required != actual => {
                    return Err(ConcurrencyError::Conflict {
                        expected: required,
                        actual,
                    })
                }
                // The stream is where we need it: a concurrent append that held our version
                // rolled back, or (`Any`) one took the next version first. Run again.
                _ if attempt < APPEND_ATTEMPTS => {
                    seen = Some(actual);
                    attempt += 1;
                }
                _ => {
                    return Err(ConcurrencyError::Conflict {
                        expected: required.or(seen).unwrap_or(actual),
                        actual,
                    })
                }
            }
        }
    }

    /// Every event of `stream`, in order. One statement.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use idem::kit::{EventStreams, ExpectedVersion, NewEvent};
    /// # use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
    /// let streams = EventStreams::<sqlx::Sqlite>::new("events")?;
    /// streams.ensure_schema(&mut conn).await?;
    /// let events = [NewEvent::json("opened", &0)?, NewEvent::json("deposited", &5)?];
    /// let _ = streams.append(&mut conn, "acct", "req-1", ExpectedVersion::Any, &events).await?;
    /// let stored = streams.read(&mut conn, "acct").await?;
    /// assert_eq!(stored.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>(), ["opened", "deposited"]);
    /// # Ok(()) }
    /// # }
    /// ```
    pub async fn read(
        &self,
        conn: &mut DB::Connection,
        stream: &str,
    ) -> Result<Vec<Event>, ConcurrencyError> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM {t} WHERE stream = $1 ORDER BY version",
            t = self.table
        );
        let rows = DB::fetch_all(conn, DB::bind_str(sqlx::query(&sql), stream)).await?;
        rows.iter().map(event_from_row::<DB>).collect()
    }

    /// At most `limit` events of `stream` after version `after`, in order: to read a long
    /// stream page by page. One statement.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use idem::kit::{EventStreams, ExpectedVersion, NewEvent, Version};
    /// # use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
    /// let streams = EventStreams::<sqlx::Sqlite>::new("events")?;
    /// streams.ensure_schema(&mut conn).await?;
    /// let events: Vec<_> = (0..5).map(|i| NewEvent::json("tick", &i)).collect::<Result<_, _>>()?;
    /// let _ = streams.append(&mut conn, "clock", "req-1", ExpectedVersion::NoStream, &events).await?;
    /// let page = streams.read_after(&mut conn, "clock", Version::new(2), 2).await?;
    /// assert_eq!(page.iter().map(|e| e.version.get()).collect::<Vec<_>>(), [3, 4]);
    /// # Ok(()) }
    /// # }
    /// ```
    pub async fn read_after(
        &self,
        conn: &mut DB::Connection,
        stream: &str,
        after: Version,
        limit: u32,
    ) -> Result<Vec<Event>, ConcurrencyError> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM {t} WHERE stream = $1 AND version > $2 \
             ORDER BY version LIMIT $3",
            t = self.table
        );
        let query = DB::bind_i64(
            DB::bind_i64(
                DB::bind_str(sqlx::query(&sql), stream),
                version_to_sql(after)?,
            ),
            i64::from(limit),
        );
        let rows = DB::fetch_all(conn, query).await?;
        rows.iter().map(event_from_row::<DB>).collect()
    }

    /// The version of the last event of `stream`; [`Version::NONE`] when it has none. One
    /// statement.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use idem::kit::{EventStreams, Version};
    /// # use sqlx::Connection;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
    /// let streams = EventStreams::<sqlx::Sqlite>::new("events")?;
    /// streams.ensure_schema(&mut conn).await?;
    /// assert_eq!(streams.version(&mut conn, "nobody").await?, Version::NONE);
    /// # Ok(()) }
    /// # }
    /// ```
    pub async fn version(
        &self,
        conn: &mut DB::Connection,
        stream: &str,
    ) -> Result<Version, ConcurrencyError> {
        let sql = format!(
            "SELECT COALESCE(MAX(version), 0) FROM {t} WHERE stream = $1",
            t = self.table
        );
        let row = DB::fetch_optional(conn, DB::bind_str(sqlx::query(&sql), stream)).await?;
        match row {
            Some(row) => version_from_sql(DB::get_i64(&row, 0)?),
            None => Ok(Version::NONE),
        }
    }

    /// One statement that inserts `n` events after the stream's current version, only if that
    /// version is `$3` (or `$3` is -1), and returns the versions it used.
    ///
    /// Parameters: `$1` stream, `$2` request id, `$3` required version, then per event its id,
    /// type and payload.
    fn insert_sql(&self, n: usize) -> String {
        let values: Vec<String> = (0..n)
            .map(|i| {
                let p = 4 + 3 * i;
                format!("({}, ${p}, ${}, ${})", i + 1, p + 1, p + 2)
            })
            .collect();
        // VALUES columns are named column1, column2, … on both SQLite and PostgreSQL.
        format!(
            "WITH cur AS (SELECT COALESCE(MAX(version), 0) AS v FROM {t} WHERE stream = $1) \
             INSERT INTO {t} (stream, version, event_id, request_id, event_type, payload, recorded_at) \
             SELECT $1, cur.v + e.column1, e.column2, $2, e.column3, e.column4, {now} \
             FROM cur, (VALUES {values}) AS e \
             WHERE $3 < 0 OR cur.v = $3 \
             RETURNING version",
            t = self.table,
            now = DB::DIALECT.now,
            values = values.join(", "),
        )
    }
}

/// The event table's schema, oldest step first (as
/// [`Migration::parse`](crate::migrate::Migration::parse) reads it).
const MIGRATIONS: &str = "
-- Version 1: event table.
CREATE TABLE IF NOT EXISTS {table} (
    stream TEXT NOT NULL,
    version {bigint} NOT NULL,
    event_id {uuid} NOT NULL UNIQUE,
    request_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    payload {bytes} NOT NULL,
    recorded_at {timestamp} NOT NULL,
    PRIMARY KEY (stream, version)
);
";

const EVENT_COLUMNS: &str = "stream, version, event_id, request_id, event_type, payload";

fn event_from_row<DB: Backend>(row: &DB::Row) -> Result<Event, ConcurrencyError> {
    Ok(Event {
        stream: DB::get_string(row, 0)?,
        version: version_from_sql(DB::get_i64(row, 1)?)?,
        event_id: DB::get_uuid(row, 2)?,
        request_id: DB::get_string(row, 3)?,
        event_type: DB::get_string(row, 4)?,
        payload: DB::get_bytes(row, 5)?,
    })
}

fn check_stream(stream: &str) -> Result<(), ConcurrencyError> {
    if stream.is_empty() || stream.len() > MAX_STREAM_LEN {
        return Err(ConcurrencyError::InvalidInput(format!(
            "a stream name is 1 to {MAX_STREAM_LEN} bytes, got {}",
            stream.len()
        )));
    }
    Ok(())
}

/// Runs the insert; inside a transaction on a database where a failed statement aborts the
/// whole transaction, under a savepoint, so a duplicate or a conflict leaves the caller's
/// transaction usable.
async fn insert_guarded<DB: Backend>(
    conn: &mut DB::Connection,
    query: SqlQuery<'_, DB>,
) -> Result<Vec<DB::Row>, sqlx::Error> {
    if !(DB::DIALECT.failed_statement_aborts_transaction && conn.is_in_transaction()) {
        return DB::fetch_all(conn, query).await;
    }
    let mut savepoint = conn.begin().await?;
    match DB::fetch_all(&mut *savepoint, query).await {
        Ok(rows) => {
            savepoint.commit().await?;
            Ok(rows)
        }
        Err(e) => {
            savepoint.rollback().await?;
            Err(e)
        }
    }
}
