//! The PostgreSQL store's schema: its migrations (`idem-sql/sql/postgres/migrations.sql`), applied
//! by the shared migrator.

use sqlx::postgres::{PgConnection, Postgres};

use crate::migrate::{unknown_version, Migrated};
use crate::name::TableName;
use crate::schema::StoreSchema;
use idem_core::Error;

/// The schema's steps, oldest first: `idem-sql/sql/postgres/migrations.sql`, whose header says
/// what it fills in and how a step is added.
const MIGRATIONS: &str = include_str!("../../sql/postgres/migrations.sql");

/// The records table's schema: its migrations, and indexes named `<table>_<column>_idx`
/// (`<table>_expires_at_idx`) in the table's schema.
const SCHEMA: StoreSchema = StoreSchema {
    migrations: MIGRATIONS,
    index: |table, column| table.suffixed(&format!("_{column}_idx")).unqualified(),
    dropped_index: |table, column| table.suffixed(&format!("_{column}_idx")),
};

/// Brings `table` (and its `<table>_expires_at_idx` index, in the table's schema) up to date;
/// a ledger listing a version this build does not know (a newer idem) is refused.
pub(super) async fn migrate(conn: &mut PgConnection, table: &TableName) -> Result<(), Error> {
    let names = SCHEMA.names(table);
    let migrated = SCHEMA.of(table, &names).migrate::<Postgres>(conn).await?;
    outcome(table, migrated)
}

/// Checks that `table` is up to date, changing nothing and needing no `CREATE` right:
/// [`Error::SchemaNotMigrated`] when it is missing or older; a version this build does not
/// know is refused as by [`migrate`].
pub(super) async fn check(conn: &mut PgConnection, table: &TableName) -> Result<(), Error> {
    let names = SCHEMA.names(table);
    let checked = SCHEMA.of(table, &names).check::<Postgres>(conn).await?;
    outcome(table, checked)
}

/// What [`migrate`] runs, as a script for `psql` or a migration tool.
pub(super) fn script(table: &TableName) -> Result<String, Error> {
    SCHEMA.script::<Postgres>(
        table,
        "PostgresStore",
        "Apply it in one transaction, as a role that may create tables in the schema\n\
         (psql --single-transaction -f FILE).\n\
         Every statement is idempotent: this script brings an older schema up to date, and\n\
         applying it again changes nothing.",
    )
}

/// What a migration or a check found, as the store reports it.
fn outcome(table: &TableName, migrated: Migrated) -> Result<(), Error> {
    match migrated {
        Migrated::UpToDate => Ok(()),
        Migrated::UnknownVersion(version) => Err(unknown_version(table, version)),
    }
}
