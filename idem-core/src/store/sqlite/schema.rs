//! The SQLite store's schema: its [`Migration`]s, applied by the shared migrator.

use sqlx::sqlite::SqliteConnection;

use crate::error::Error;
use crate::store::sql::corrupt;
use crate::store::sql::migrate::{unknown_version, Migrated, Migration, Schema};
use crate::store::sql::name::TableName;

/// The schema, oldest step first. Never change what an applied step creates; append a new step.
/// Statements are idempotent (`IF NOT EXISTS`): a records table found missing is re-created by
/// running the applied steps again.
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "create the records table and its expiry index",
    statements: &[
        "CREATE TABLE IF NOT EXISTS {table} (
            key         BLOB    NOT NULL PRIMARY KEY CHECK (length(key) = 32),
            fingerprint BLOB             CHECK (fingerprint IS NULL OR length(fingerprint) = 32),
            token       BLOB    NOT NULL CHECK (length(token) = 16),
            state       INTEGER NOT NULL CHECK (state IN (0, 1)),
            expires_at  INTEGER NOT NULL,
            response    BLOB,
            is_error    INTEGER NOT NULL DEFAULT 0 CHECK (is_error IN (0, 1))
        )",
        "CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at)",
    ],
}];

/// Brings `table` (and its `<table>_expires_at` index) up to date. A ledger listing a version
/// this build does not know is refused, unless `PRAGMA quick_check` finds the file damaged:
/// then the unknown version is garbage read from a damaged page, and the error says so.
pub(super) async fn migrate(conn: &mut SqliteConnection, table: &TableName) -> Result<(), Error> {
    let index = table.suffixed("index name", "_expires_at")?;
    let schema = Schema {
        table,
        names: &[("{index}", &index)],
        migrations: MIGRATIONS,
    };
    match schema.migrate::<sqlx::Sqlite>(conn).await? {
        Migrated::UpToDate => Ok(()),
        Migrated::UnknownVersion(version) => {
            // Only here, where it is cheap next to the error: a version no idem wrote is as
            // likely a damaged page read as a number as a newer idem.
            check_integrity(conn).await?;
            Err(unknown_version(table, version))
        }
    }
}

/// Runs `PRAGMA quick_check` and fails with a [`Corrupt`](crate::StoreErrorKind::Corrupt) store
/// error if SQLite finds the file damaged.
async fn check_integrity(conn: &mut SqliteConnection) -> Result<(), Error> {
    let findings: Vec<String> = sqlx::query_scalar("PRAGMA quick_check")
        .persistent(false)
        .fetch_all(&mut *conn)
        .await?;
    if findings.len() == 1 && findings[0] == "ok" {
        return Ok(());
    }
    // A finding may span lines, under a "*** in database main ***" heading.
    let problems: Vec<&str> = findings
        .iter()
        .flat_map(|f| f.lines())
        .filter(|line| !line.starts_with("***") && !line.trim().is_empty())
        .collect();
    let first = problems.first().copied().unwrap_or("no details");
    Err(corrupt(format!(
        "the SQLite database file is damaged (PRAGMA quick_check: {first}; {} problem(s) in \
         all): restore it from a backup, or move it aside so that a new, empty one is created \
         (completed keys are then forgotten)",
        problems.len()
    )))
}
