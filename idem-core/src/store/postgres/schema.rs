//! The PostgreSQL store's schema: its [`Migration`]s, applied by the shared migrator.

use sqlx::postgres::PgConnection;

use crate::error::Error;
use crate::store::sql::migrate::{unknown_version, Migrated, Migration, Schema};
use crate::store::sql::name::TableName;

/// The schema, oldest step first. Never change what an applied step creates; append a new step.
/// Statements are idempotent (`IF NOT EXISTS`): a records table found missing is re-created by
/// running the applied steps again.
const MIGRATIONS: &[Migration] = &[Migration {
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
}];

/// Brings `table` (and its `<table>_expires_at_idx` index, in the table's schema) up to date;
/// a ledger listing a version this build does not know (a newer idem) is refused.
pub(super) async fn migrate(conn: &mut PgConnection, table: &TableName) -> Result<(), Error> {
    let index = table
        .suffixed("index name", "_expires_at_idx")?
        .unqualified();
    let schema = Schema {
        table,
        names: &[("{index}", &index)],
        migrations: MIGRATIONS,
    };
    match schema.migrate::<sqlx::Postgres>(conn).await? {
        Migrated::UpToDate => Ok(()),
        Migrated::UnknownVersion(version) => Err(unknown_version(table, version)),
    }
}
