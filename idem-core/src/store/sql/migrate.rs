//! The one migrator of the SQL stores and the kit: versioned [`Migration`]s, applied in one
//! transaction and recorded in a `<table>_migrations` ledger.
//!
//! sqlx's own migrator is not used because it cannot template the table name, and one database
//! may hold several idem tables.

use sqlx::Connection;

use super::dialect::Ops;
use super::name::TableName;
use crate::error::Error;

/// One step of a schema. Versions only grow; an applied step is never edited, a change is a new
/// step. Statements are idempotent (`IF NOT EXISTS`): a table found missing although its steps
/// are recorded is created again by running the applied steps once more.
#[derive(Debug)]
pub(crate) struct Migration {
    /// Position in the list, recorded in `<table>_migrations` once applied.
    pub(crate) version: i64,
    /// What the step does, recorded next to the version for whoever inspects the database.
    pub(crate) description: &'static str,
    /// Statements run in order. `{table}` is the quoted table, each name of
    /// [`Schema::names`] its quoted value, and `{now}`, `{timestamp}`, `{bigint}`, `{bytes}`
    /// and `{uuid}` the database's ([`Dialect::render`](super::dialect::Dialect::render)).
    pub(crate) statements: &'static [&'static str],
}

/// What a migrator brings up to date: a table, the other names its statements use, its steps.
pub(crate) struct Schema<'a> {
    /// The table whose ledger is `<table>_migrations` and whose absence means "dropped".
    pub(crate) table: &'a TableName,
    /// Other names the statements use, such as `("{index}", index)`.
    pub(crate) names: &'a [(&'static str, &'a TableName)],
    /// Oldest first.
    pub(crate) migrations: &'static [Migration],
}

/// What the ledger held.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Migrated {
    /// Every step is applied (now, or before).
    UpToDate,
    /// The ledger lists a version this build does not know (a newer idem, or a damaged
    /// database): nothing was changed.
    UnknownVersion(i64),
}

const LEDGER: &str = "CREATE TABLE IF NOT EXISTS {ledger} ( \
    version {bigint} NOT NULL PRIMARY KEY, \
    description TEXT NOT NULL, \
    applied_at {timestamp} NOT NULL DEFAULT ({now}))";

/// How often creating the ledger is tried: two PostgreSQL sessions creating one table at the
/// same moment may both find it missing, and the loser fails on a catalog's unique index.
const LEDGER_ATTEMPTS: usize = 3;

impl Schema<'_> {
    fn render<DB: Ops>(&self, statement: &str) -> String {
        let mut sql = DB::DIALECT
            .render(statement)
            .replace("{table}", &self.table.to_string());
        for (placeholder, name) in self.names {
            sql = sql.replace(placeholder, &name.to_string());
        }
        sql
    }

    /// Creates `<table>_migrations` if needed and, in one transaction that takes the write lock
    /// (SQLite) or the ledger rows' locks (PostgreSQL), applies the steps it does not list and
    /// records them; re-runs the applied ones when the table was dropped. Running it twice, or
    /// from several pools, processes or nodes at once, applies each step once: a concurrent
    /// migrator inserts the same version row first and waits on its unique index, then skips.
    ///
    /// On a connection already inside a transaction it runs under a savepoint.
    pub(crate) async fn migrate<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
    ) -> Result<Migrated, Error> {
        let ledger = self.table.suffixed("ledger table", "_migrations")?;
        let mut attempt = 1;
        loop {
            match self.migrate_once::<DB>(conn, &ledger).await {
                Err(e) if attempt < LEDGER_ATTEMPTS && is_duplicate_object(&e) => attempt += 1,
                result => return Ok(result?),
            }
        }
    }

    async fn migrate_once<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        ledger: &TableName,
    ) -> Result<Migrated, sqlx::Error> {
        let d = &DB::DIALECT;
        let mut tx = if conn.is_in_transaction() {
            conn.begin().await?
        } else {
            conn.begin_with(d.begin_write).await?
        };
        let create = d.render(LEDGER).replace("{ledger}", &ledger.to_string());
        run::<DB>(&mut *tx, &create).await?;
        // Locking the rows makes nodes that re-create a dropped table queue here.
        let applied: Vec<i64> = {
            let sql = format!("SELECT version FROM {ledger}{lock}", lock = d.lock_rows);
            let rows = DB::fetch_all(&mut *tx, sqlx::query(&sql).persistent(false)).await?;
            rows.iter()
                .map(|row| DB::get_i64(row, 0))
                .collect::<Result<_, _>>()?
        };
        if let Some(unknown) = applied
            .iter()
            .find(|v| !self.migrations.iter().any(|m| m.version == **v))
        {
            return Ok(Migrated::UnknownVersion(*unknown));
        }
        let exists_sql = d
            .table_exists
            .replace("{table}", &self.table.to_string())
            .replace("{name}", self.table.name());
        let exists = DB::fetch_all(&mut *tx, sqlx::query(&exists_sql).persistent(false)).await?;
        let exists = match exists.first() {
            Some(row) => DB::get_bool(row, 0)?,
            None => false,
        };
        if !applied.is_empty() && !exists {
            tracing::warn!(
                table = %self.table.as_configured(),
                "the table is missing although its migrations are recorded (dropped?); \
                 creating it again: the rows it held are gone"
            );
            for step in self
                .migrations
                .iter()
                .filter(|m| applied.contains(&m.version))
            {
                for statement in step.statements {
                    run::<DB>(&mut *tx, &self.render::<DB>(statement)).await?;
                }
            }
        }
        let record = format!(
            "INSERT INTO {ledger} (version, description, applied_at) VALUES ($1, $2, {now}) \
             ON CONFLICT (version) DO NOTHING RETURNING version",
            now = d.now
        );
        for step in self
            .migrations
            .iter()
            .filter(|m| !applied.contains(&m.version))
        {
            // The version row first: a concurrent migrator waits on its unique index until we
            // commit, then finds it taken and skips the step.
            let query = DB::bind_str(
                DB::bind_i64(sqlx::query(&record).persistent(false), step.version),
                step.description,
            );
            if DB::fetch_all(&mut *tx, query).await?.is_empty() {
                continue;
            }
            for statement in step.statements {
                run::<DB>(&mut *tx, &self.render::<DB>(statement)).await?;
            }
        }
        tx.commit().await?;
        Ok(Migrated::UpToDate)
    }
}

async fn run<DB: Ops>(conn: &mut DB::Connection, sql: &str) -> Result<(), sqlx::Error> {
    DB::execute(conn, sqlx::query(sql).persistent(false))
        .await
        .map(drop)
}

/// Two sessions running `CREATE TABLE IF NOT EXISTS` at the same moment may both find the
/// table missing; the loser fails on a catalog's unique index (23505), with "duplicate table"
/// (42P07) or "duplicate object" (42710, the table's row type). The table exists then, so
/// running it again succeeds.
fn is_duplicate_object(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| matches!(&*code, "23505" | "42P07" | "42710"))
}

/// The error of a store whose ledger lists a version this build does not know.
pub(crate) fn unknown_version(table: &TableName, version: i64) -> Error {
    Error::InvalidConfig(format!(
        "table {:?} has schema version {version}, which this version of idem does not know: it \
         was migrated by a newer idem; upgrade idem or use another table",
        table.as_configured()
    ))
}
