//! sqlx's errors as [`StoreError`]s: classified by what the caller can do about them, by
//! SQLSTATE (PostgreSQL) or result code (SQLite), never by message text.

use idem_core::{StoreError, StoreErrorKind};

/// Classifies a sqlx error by what the caller can do about it: by variant, and for database
/// errors by SQLSTATE (PostgreSQL) or result code (SQLite), never by message text.
///
/// | backend says | kind |
/// |---|---|
/// | I/O, TLS, pool timed out or closed; SQLSTATE class 08, 57P01–57P05, 53300; SQLite BUSY (5), LOCKED (6) | [`Unavailable`](StoreErrorKind::Unavailable) |
/// | SQLSTATE 57014 (statement timeout, cancel), 55P03 (lock not available), 40001 (serialization failure), 40P01 (deadlock), 53000, 53200 (out of resources, out of memory) | [`Transient`](StoreErrorKind::Transient) |
/// | SQLSTATE 53100 (disk full); SQLite FULL (13) | [`Full`](StoreErrorKind::Full) |
/// | SQLSTATE 25006 (read-only transaction, as on a standby); SQLite READONLY (8) | [`ReadOnly`](StoreErrorKind::ReadOnly) |
/// | a column that cannot be decoded; SQLite CORRUPT (11), NOTADB (26) | [`Corrupt`](StoreErrorKind::Corrupt) |
/// | anything else (a syntax error, a missing table, a violated constraint) | [`Query`](StoreErrorKind::Query) |
///
/// ```
/// use idem::StoreErrorKind;
/// let e = idem::sql_error(sqlx::Error::PoolTimedOut);
/// assert_eq!(e.kind(), StoreErrorKind::Unavailable);
/// ```
pub fn sql_error(e: sqlx::Error) -> StoreError {
    let kind = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreErrorKind::Unavailable,
        sqlx::Error::Database(db) => database_kind(&**db),
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        _ => StoreErrorKind::Query,
    };
    worded(kind, e)
}

/// The kind of an error the database reported.
fn database_kind(db: &dyn sqlx::error::DatabaseError) -> StoreErrorKind {
    sqlite_database_kind(db).unwrap_or_else(|| {
        db.code()
            .map_or(StoreErrorKind::Query, |code| sqlstate_kind(&code))
    })
}

/// The kind of an error SQLite reported, by its result code; `None` for another database's.
#[cfg(feature = "sqlite")]
fn sqlite_database_kind(db: &dyn sqlx::error::DatabaseError) -> Option<StoreErrorKind> {
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    Some(
        db.code()
            .and_then(|code| code.parse::<i32>().ok())
            .map_or(StoreErrorKind::Query, sqlite_kind),
    )
}

/// Without SQLite, no error is SQLite's.
#[cfg(not(feature = "sqlite"))]
fn sqlite_database_kind(_: &dyn sqlx::error::DatabaseError) -> Option<StoreErrorKind> {
    None
}

/// `e` as a [`StoreError`] of `kind`; a damaged SQLite file says what to do about it, as
/// SQLite's own words ("database disk image is malformed") do not.
#[cfg(feature = "sqlite")]
fn worded(kind: StoreErrorKind, e: sqlx::Error) -> StoreError {
    let sqlite = e
        .as_database_error()
        .is_some_and(|db| db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some());
    if kind == StoreErrorKind::Corrupt && sqlite {
        return StoreError::new(kind, DamagedFile(e));
    }
    StoreError::new(kind, e)
}

/// `e` as a [`StoreError`] of `kind`.
#[cfg(not(feature = "sqlite"))]
fn worded(kind: StoreErrorKind, e: sqlx::Error) -> StoreError {
    StoreError::new(kind, e)
}

/// The kind of a PostgreSQL error by its SQLSTATE.
fn sqlstate_kind(code: &str) -> StoreErrorKind {
    match code {
        // Class 08 is connection exceptions; 57P01..57P05 are admin shutdown, crash shutdown,
        // "cannot connect now" (starting or stopping), database dropped and idle session
        // timeout; 53300 is too many connections. The server cannot serve this session.
        c if c.starts_with("08") || c.starts_with("57P") => StoreErrorKind::Unavailable,
        "53300" => StoreErrorKind::Unavailable,
        // Statement timeout or cancel, lock timeout (or NOWAIT), serialization failure,
        // deadlock, out of resources or memory: the statement lost a race or waited too long,
        // and the same statement may pass on a retry.
        "57014" | "55P03" | "40001" | "40P01" | "53000" | "53200" => StoreErrorKind::Transient,
        "53100" => StoreErrorKind::Full,
        "25006" => StoreErrorKind::ReadOnly,
        // 53400 (a limit from the server's configuration) and everything else: the same
        // statement would fail again.
        _ => StoreErrorKind::Query,
    }
}

/// The kind of a SQLite error by its primary result code (the low byte of the extended code).
#[cfg(feature = "sqlite")]
fn sqlite_kind(code: i32) -> StoreErrorKind {
    match code & 0xff {
        // BUSY, LOCKED: another connection held the lock past the busy timeout.
        5 | 6 => StoreErrorKind::Unavailable,
        8 => StoreErrorKind::ReadOnly,
        13 => StoreErrorKind::Full,
        // CORRUPT, NOTADB: the file is damaged, or is not a database at all.
        11 | 26 => StoreErrorKind::Corrupt,
        _ => StoreErrorKind::Query,
    }
}

/// A SQLite error saying that the database file is damaged, worded for whoever has to act.
#[cfg(feature = "sqlite")]
#[derive(Debug, thiserror::Error)]
#[error(
    "the SQLite database file is damaged ({0}): restore it from a backup, or move it aside \
     so that a new, empty one is created (completed keys are then forgotten)"
)]
struct DamagedFile(#[source] sqlx::Error);
#[cfg(test)]
mod tests {
    use super::*;

    /// Codes a test server cannot easily be made to send; the others are produced for real by
    /// the stores' tests (`idem-sql/tests/sqlite_store.rs`, `idem-sql/tests/postgres_store.rs`).
    #[test]
    fn sqlstates_map_by_class_and_code() {
        for (code, kind) in [
            ("08006", StoreErrorKind::Unavailable),
            ("57P01", StoreErrorKind::Unavailable),
            ("57P03", StoreErrorKind::Unavailable),
            ("53300", StoreErrorKind::Unavailable),
            ("57014", StoreErrorKind::Transient),
            ("55P03", StoreErrorKind::Transient),
            ("40001", StoreErrorKind::Transient),
            ("40P01", StoreErrorKind::Transient),
            ("53000", StoreErrorKind::Transient),
            ("53200", StoreErrorKind::Transient),
            ("53100", StoreErrorKind::Full),
            ("25006", StoreErrorKind::ReadOnly),
            ("53400", StoreErrorKind::Query),
            ("42P01", StoreErrorKind::Query),
            ("23505", StoreErrorKind::Query),
        ] {
            assert_eq!(sqlstate_kind(code), kind, "{code}");
        }
    }

    #[test]
    #[cfg(feature = "sqlite")]
    fn sqlite_codes_map_by_primary_code() {
        for (code, kind) in [
            (5, StoreErrorKind::Unavailable),
            (517, StoreErrorKind::Unavailable), // SQLITE_BUSY_SNAPSHOT
            (6, StoreErrorKind::Unavailable),
            (8, StoreErrorKind::ReadOnly),
            (1032, StoreErrorKind::ReadOnly), // SQLITE_READONLY_DBMOVED
            (13, StoreErrorKind::Full),
            (11, StoreErrorKind::Corrupt),
            (779, StoreErrorKind::Corrupt), // SQLITE_CORRUPT_INDEX
            (26, StoreErrorKind::Corrupt),
            (1, StoreErrorKind::Query),
            (2067, StoreErrorKind::Query), // SQLITE_CONSTRAINT_UNIQUE
        ] {
            assert_eq!(sqlite_kind(code), kind, "{code}");
        }
    }
}
