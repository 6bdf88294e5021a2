//! The SQLite store's schema: its [`Migration`]s, applied by the shared migrator.

use sqlx::sqlite::{Sqlite, SqliteConnection};

use crate::error::Error;
use crate::sql::migrate::{unknown_version, Migrated, Migration};
use crate::sql::name::TableName;
use crate::store::sql::corrupt;
use crate::store::sql::schema::StoreSchema;

/// The schema, oldest step first. Never change what an applied step creates; append a new step.
/// Statements are idempotent (`IF NOT EXISTS`): a records table found missing is re-created by
/// running the applied steps again.
const MIGRATIONS: &[Migration] = &[
    Migration {
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
    },
    Migration {
        version: 2,
        description: "create the steps table and its expiry index",
        statements: &[
            // One row per (operation key, step name); the row named '' at position -1 counts the
            // operation's attempts (docs/steps.md).
            "CREATE TABLE IF NOT EXISTS {steps} (
            key         BLOB    NOT NULL CHECK (length(key) = 32),
            name        TEXT    NOT NULL CHECK (length(name) <= 255),
            position    INTEGER NOT NULL CHECK (position >= -1),
            token       BLOB    NOT NULL CHECK (length(token) = 16),
            attempt     INTEGER NOT NULL DEFAULT 0,
            finished    INTEGER NOT NULL DEFAULT 0 CHECK (finished IN (0, 1)),
            result      BLOB,
            expires_at  INTEGER NOT NULL,
            PRIMARY KEY (key, name)
        )",
            "CREATE INDEX IF NOT EXISTS {steps_index} ON {steps} (expires_at)",
        ],
    },
];

/// The records table's schema: its migrations, and indexes named `<table>_expires_at`.
const SCHEMA: StoreSchema = StoreSchema {
    migrations: MIGRATIONS,
    index: |table| table.suffixed("index name", "_expires_at"),
};

/// The newest schema version.
pub(super) const LATEST: i64 = SCHEMA.latest();

/// Brings `table` (and its `<table>_expires_at` index) up to date. A ledger listing a version
/// this build does not know is refused, unless `PRAGMA quick_check` finds the file damaged:
/// then the unknown version is garbage read from a damaged page, and the error says so.
pub(super) async fn migrate(conn: &mut SqliteConnection, table: &TableName) -> Result<(), Error> {
    let names = SCHEMA.names(table)?;
    let migrated = SCHEMA.of(table, &names).migrate::<Sqlite>(conn).await?;
    outcome(conn, table, migrated).await
}

/// Checks that `table` is up to date, changing nothing: [`Error::SchemaNotMigrated`] when it
/// is missing or older; a version this build does not know is refused as by [`migrate`].
pub(super) async fn check(conn: &mut SqliteConnection, table: &TableName) -> Result<(), Error> {
    let names = SCHEMA.names(table)?;
    let checked = SCHEMA.of(table, &names).check::<Sqlite>(conn).await?;
    outcome(conn, table, checked).await
}

/// What [`migrate`] runs, as a script for `sqlite3` or a migration tool.
pub(super) fn script(table: &TableName) -> Result<String, Error> {
    let names = SCHEMA.names(table)?;
    SCHEMA.of(table, &names).script::<Sqlite>(&format!(
        "The schema of idem's SqliteStore for the table {table}, up to version {LATEST}:\n\
         the statements SqliteStoreBuilder::migrate runs, from SqliteStoreBuilder::schema_sql.\n\
         Apply it in one transaction (sqlite3: BEGIN; .read FILE; COMMIT;). Every statement\n\
         is idempotent: this script brings an older schema up to date, and applying it again\n\
         changes nothing. For another table, SqliteStore::builder().table(NAME).schema_sql()\n\
         writes its script."
    ))
}

/// What a migration or a check found, as the store reports it.
async fn outcome(
    conn: &mut SqliteConnection,
    table: &TableName,
    migrated: Migrated,
) -> Result<(), Error> {
    match migrated {
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
