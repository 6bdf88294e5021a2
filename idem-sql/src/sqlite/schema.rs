//! The SQLite store's schema: its migrations (`idem-sql/sql/sqlite/migrations.sql`), applied by the
//! shared migrator.

use sqlx::sqlite::{Sqlite, SqliteConnection};

use crate::corrupt;
use crate::error::sql_error;
use crate::migrate::{unknown_version, Migrated};
use crate::name::TableName;
use crate::schema::StoreSchema;
use idem_core::Error;

/// The schema's steps, oldest first: `idem-sql/sql/sqlite/migrations.sql`, whose header says
/// what it fills in and how a step is added.
const MIGRATIONS: &str = include_str!("../../sql/sqlite/migrations.sql");

/// The records table's schema: its migrations, and indexes named `<table>_<column>`
/// (`<table>_expires_at`).
const SCHEMA: StoreSchema = StoreSchema {
    migrations: MIGRATIONS,
    index: |table, column| table.suffixed(&format!("_{column}")),
    dropped_index: |table, column| table.suffixed(&format!("_{column}")),
};

/// The newest schema version.
pub(super) fn latest() -> i64 {
    SCHEMA.latest()
}

/// Brings `table` (and its `<table>_expires_at` index) up to date. A ledger listing a version
/// this build does not know is refused, unless `PRAGMA quick_check` finds the file damaged:
/// then the unknown version is garbage read from a damaged page, and the error says so.
pub(super) async fn migrate(conn: &mut SqliteConnection, table: &TableName) -> Result<(), Error> {
    let names = SCHEMA.names(table);
    let migrated = SCHEMA.of(table, &names).migrate::<Sqlite>(conn).await?;
    outcome(conn, table, migrated).await
}

/// Checks that `table` is up to date, changing nothing: [`Error::SchemaNotMigrated`] when it
/// is missing or older; a version this build does not know is refused as by [`migrate`].
pub(super) async fn check(conn: &mut SqliteConnection, table: &TableName) -> Result<(), Error> {
    let names = SCHEMA.names(table);
    let checked = SCHEMA.of(table, &names).check::<Sqlite>(conn).await?;
    outcome(conn, table, checked).await
}

/// What [`migrate`] runs, as a script for `sqlite3` or a migration tool.
pub(super) fn script(table: &TableName) -> Result<String, Error> {
    SCHEMA.script::<Sqlite>(
        table,
        "SqliteStore",
        "Apply it in one transaction (sqlite3: BEGIN; .read FILE; COMMIT;).\n\
         Every statement is idempotent but the ADD COLUMNs of versions 3 to 5, which SQLite\n\
         cannot make conditional: this script brings an older schema up to date, and applied\n\
         again to a table at version 3 or later it fails at them (duplicate column name) and\n\
         changes nothing.",
    )
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

/// Runs `PRAGMA quick_check` and fails with a [`Corrupt`](idem_core::StoreErrorKind::Corrupt) store
/// error if SQLite finds the file damaged.
async fn check_integrity(conn: &mut SqliteConnection) -> Result<(), Error> {
    let findings: Vec<String> = sqlx::query_scalar("PRAGMA quick_check")
        .persistent(false)
        .fetch_all(&mut *conn)
        .await
        .map_err(sql_error)?;
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
