//! The PostgreSQL store's schema: its [`Migration`]s, applied by the shared migrator.

use sqlx::postgres::{PgConnection, Postgres};

use crate::error::Error;
use crate::sql::migrate::{unknown_version, Migrated, Migration};
use crate::sql::name::TableName;
use crate::store::sql::schema::StoreSchema;

/// The schema, oldest step first. Never change what an applied step creates; append a new step.
/// Statements are idempotent (`IF NOT EXISTS`): a records table found missing is re-created by
/// running the applied steps again.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "records table and expiry index",
        statements: &[
            "CREATE TABLE IF NOT EXISTS {table} (
            key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
            fingerprint bytea NULL CHECK (octet_length(fingerprint) = 32),
            token bytea NOT NULL CHECK (octet_length(token) = 16),
            state smallint NOT NULL CHECK (state IN (0, 1)),
            expires_at timestamptz NOT NULL,
            response bytea NULL,
            is_error boolean NOT NULL DEFAULT false
        )",
            "CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at)",
        ],
    },
    Migration {
        version: 2,
        description: "steps table and its expiry index",
        statements: &[
            // One row per (operation key, step name); the row named '' at position -1 counts the
            // operation's attempts (docs/steps.md).
            "CREATE TABLE IF NOT EXISTS {steps} (
            key bytea NOT NULL CHECK (octet_length(key) = 32),
            name text NOT NULL CHECK (octet_length(name) <= 255),
            position integer NOT NULL CHECK (position >= -1),
            token bytea NOT NULL CHECK (octet_length(token) = 16),
            attempt bigint NOT NULL DEFAULT 0,
            finished boolean NOT NULL DEFAULT false,
            result bytea NULL,
            expires_at timestamptz NOT NULL,
            PRIMARY KEY (key, name)
        )",
            "CREATE INDEX IF NOT EXISTS {steps_index} ON {steps} (expires_at)",
        ],
    },
];

/// The records table's schema: its migrations, and indexes named `<table>_expires_at_idx` in
/// the table's schema.
const SCHEMA: StoreSchema = StoreSchema {
    migrations: MIGRATIONS,
    index: |table| {
        Ok(table
            .suffixed("index name", "_expires_at_idx")?
            .unqualified())
    },
};

/// The newest schema version.
pub(super) const LATEST: i64 = SCHEMA.latest();

/// Brings `table` (and its `<table>_expires_at_idx` index, in the table's schema) up to date;
/// a ledger listing a version this build does not know (a newer idem) is refused.
pub(super) async fn migrate(conn: &mut PgConnection, table: &TableName) -> Result<(), Error> {
    let names = SCHEMA.names(table)?;
    let migrated = SCHEMA.of(table, &names).migrate::<Postgres>(conn).await?;
    outcome(table, migrated)
}

/// Checks that `table` is up to date, changing nothing and needing no `CREATE` right:
/// [`Error::SchemaNotMigrated`] when it is missing or older; a version this build does not
/// know is refused as by [`migrate`].
pub(super) async fn check(conn: &mut PgConnection, table: &TableName) -> Result<(), Error> {
    let names = SCHEMA.names(table)?;
    let checked = SCHEMA.of(table, &names).check::<Postgres>(conn).await?;
    outcome(table, checked)
}

/// What [`migrate`] runs, as a script for `psql` or a migration tool.
pub(super) fn script(table: &TableName) -> Result<String, Error> {
    let names = SCHEMA.names(table)?;
    SCHEMA.of(table, &names).script::<Postgres>(&format!(
        "The schema of idem's PostgresStore for the table {table}, up to version {LATEST}:\n\
         the statements PostgresStoreBuilder::migrate runs, from PostgresStoreBuilder::schema_sql.\n\
         Apply it in one transaction, as a role that may create tables in the schema\n\
         (psql --single-transaction -f FILE). Every statement is idempotent: this script\n\
         brings an older schema up to date, and applying it again changes nothing. For\n\
         another table, PostgresStore::builder().table(NAME).schema_sql() writes its script."
    ))
}

/// What a migration or a check found, as the store reports it.
fn outcome(table: &TableName, migrated: Migrated) -> Result<(), Error> {
    match migrated {
        Migrated::UpToDate => Ok(()),
        Migrated::UnknownVersion(version) => Err(unknown_version(table, version)),
    }
}
