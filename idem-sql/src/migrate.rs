//! The one migrator of the SQL stores and the kit: versioned [`Migration`]s, applied in one
//! transaction and recorded in a `<table>_migrations` ledger.
//!
//! sqlx's own migrator is not used because it cannot template the table name, and one database
//! may hold several idem tables.

use sqlx::Connection;

use super::dialect::Ops;
use super::name::TableName;
use crate::error::sql_error;
use idem_core::Error;

/// One step of a schema, read from its [`Schema::migrations`] source. Versions only grow; an
/// applied step is never edited, a change is a new step. Statements are idempotent
/// (`IF NOT EXISTS`): a table found missing although its steps are recorded is created again by
/// running the applied steps once more.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Migration {
    /// Position in the source (1 for the first step), recorded in `<table>_migrations` once
    /// applied.
    pub(crate) version: i64,
    /// What the step does, recorded next to the version for whoever inspects the database.
    pub(crate) description: &'static str,
    /// Statements run in order. `{table}` is the quoted table, each name of
    /// [`Schema::names`] its quoted value, and `{now}`, `{timestamp}`, `{bigint}`, `{bytes}`,
    /// `{uuid}` and `{serial}` the database's ([`Dialect::render`](super::dialect::Dialect::render)).
    pub(crate) statements: Vec<String>,
}

impl Migration {
    /// The steps of a migrations source, written as a `.sql` file: each step opens with a line
    /// `-- Version N: what it does.` (N counting from 1, in order) and holds `;`-terminated
    /// statements; other comment lines and blank lines are passed over, as is anything before
    /// the first step. The script [`Schema::script`] writes heads each step with the same line.
    pub(crate) fn parse(source: &'static str) -> Vec<Migration> {
        let mut steps: Vec<Migration> = Vec::new();
        let mut statement = String::new();
        for line in source.lines() {
            if let Some(header) = line.strip_prefix("-- Version ") {
                let description = header.split_once(": ").map_or(header, |(_, what)| what);
                steps.push(Migration {
                    version: steps.len() as i64 + 1,
                    description: description.trim_end().trim_end_matches('.'),
                    statements: Vec::new(),
                });
                continue;
            }
            let Some(step) = steps.last_mut() else {
                continue;
            };
            let text = line.trim_end();
            if text.trim_start().starts_with("--") || text.is_empty() {
                continue;
            }
            if !statement.is_empty() {
                statement.push('\n');
            }
            if let Some(end) = text.strip_suffix(';') {
                statement.push_str(end);
                step.statements.push(std::mem::take(&mut statement));
            } else {
                statement.push_str(text);
            }
        }
        steps
    }
}

/// What a migrator brings up to date: a table, the other names its statements use, its steps.
pub(crate) struct Schema<'a> {
    /// The table whose ledger is `<table>_migrations` and whose absence means "dropped".
    pub(crate) table: &'a TableName,
    /// Other names the statements use, such as `("{index}", index)`.
    pub(crate) names: &'a [(&'static str, TableName)],
    /// Its steps, oldest first, as [`Migration::parse`] reads them: the `.sql` file under
    /// `idem-sql/sql/` that the store includes, or the kit's text.
    pub(crate) migrations: &'static str,
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

const LEDGER: &str = "CREATE TABLE IF NOT EXISTS {ledger} (
    version     {bigint} NOT NULL PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at  {timestamp} NOT NULL DEFAULT ({now})
)";

/// Records a step in the ledger, unless a concurrent migrator (or an earlier run of the script)
/// did: `RETURNING` tells the migrator which.
const RECORD: &str = "INSERT INTO {ledger} (version, description, applied_at) \
    VALUES ({version}, {description}, {now}) ON CONFLICT (version) DO NOTHING";

/// How often creating the ledger is tried: two PostgreSQL sessions creating one table at the
/// same moment may both find it missing, and the loser fails on a catalog's unique index.
const LEDGER_ATTEMPTS: usize = 3;

impl Schema<'_> {
    /// A step's statement as it runs and as the script shows it: names and types in place,
    /// laid out as in a `.sql` file.
    fn render<DB: Ops>(&self, statement: &str) -> String {
        let mut sql = DB::DIALECT
            .render(statement)
            .replace("{table}", &self.table.to_string());
        for (placeholder, name) in self.names {
            sql = sql.replace(placeholder, &name.to_string());
        }
        layout(&sql)
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
        let ledger = self.table.suffixed("_migrations");
        let mut attempt = 1;
        loop {
            match self.migrate_once::<DB>(conn, &ledger).await {
                Err(e) if attempt < LEDGER_ATTEMPTS && is_duplicate_object(&e) => attempt += 1,
                result => return Ok(result.map_err(sql_error)?),
            }
        }
    }

    async fn migrate_once<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        ledger: &TableName,
    ) -> Result<Migrated, sqlx::Error> {
        let d = &DB::DIALECT;
        let steps = Migration::parse(self.migrations);
        let mut tx = if conn.is_in_transaction() {
            conn.begin().await?
        } else {
            conn.begin_with(d.begin_write).await?
        };
        run::<DB>(&mut *tx, &create_ledger::<DB>(ledger)).await?;
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
            .find(|v| !steps.iter().any(|m| m.version == **v))
        {
            return Ok(Migrated::UnknownVersion(*unknown));
        }
        if !applied.is_empty() && !exists::<DB>(&mut *tx, self.table).await? {
            tracing::warn!(
                table = %self.table.as_configured(),
                "the table is missing although its migrations are recorded (dropped?); \
                 creating it again: the rows it held are gone"
            );
            for step in steps.iter().filter(|m| applied.contains(&m.version)) {
                for statement in &step.statements {
                    let sql = self.render::<DB>(statement);
                    match run::<DB>(&mut *tx, &sql).await {
                        // SQLite cannot add a column only if it is missing: one added to a
                        // table that was not dropped (the steps table, beside the records
                        // table) is there already, as the step wants it.
                        Err(e) if column_was_there::<DB>(&sql, &e) => {}
                        ran => ran?,
                    }
                }
            }
        }
        let record = format!(
            "{} RETURNING version",
            self.record::<DB>(ledger, "$1", "$2")
        );
        for step in steps.iter().filter(|m| !applied.contains(&m.version)) {
            // The version row first: a concurrent migrator waits on its unique index until we
            // commit, then finds it taken and skips the step.
            let query = DB::bind_str(
                DB::bind_i64(sqlx::query(&record).persistent(false), step.version),
                step.description,
            );
            if DB::fetch_all(&mut *tx, query).await?.is_empty() {
                continue;
            }
            for statement in &step.statements {
                run::<DB>(&mut *tx, &self.render::<DB>(statement)).await?;
            }
        }
        tx.commit().await?;
        Ok(Migrated::UpToDate)
    }
}

impl Schema<'_> {
    /// Checks that the schema is up to date without changing anything (nor needing the right to
    /// create tables): the ledger and the table exist and the ledger lists every step.
    /// A missing or older schema is [`Error::SchemaNotMigrated`]; a ledger listing a version
    /// this build does not know is [`Migrated::UnknownVersion`], as [`migrate`](Self::migrate)
    /// reports it.
    pub(crate) async fn check<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
    ) -> Result<Migrated, Error> {
        let ledger = self.table.suffixed("_migrations");
        let steps = Migration::parse(self.migrations);
        let not_migrated = |found| Error::SchemaNotMigrated {
            table: self.table.as_configured().to_owned(),
            found,
            needed: self.latest(),
        };
        if !exists::<DB>(conn, &ledger).await.map_err(sql_error)? {
            return Err(not_migrated(None));
        }
        let sql = format!("SELECT version FROM {ledger}");
        let rows = DB::fetch_all(conn, sqlx::query(&sql).persistent(false))
            .await
            .map_err(sql_error)?;
        let applied: Vec<i64> = rows
            .iter()
            .map(|row| DB::get_i64(row, 0))
            .collect::<Result<_, _>>()
            .map_err(sql_error)?;
        if let Some(unknown) = applied
            .iter()
            .find(|v| !steps.iter().any(|m| m.version == **v))
        {
            return Ok(Migrated::UnknownVersion(*unknown));
        }
        if !exists::<DB>(conn, self.table).await.map_err(sql_error)? {
            return Err(not_migrated(None));
        }
        if steps.iter().any(|m| !applied.contains(&m.version)) {
            return Err(not_migrated(Some(
                applied.iter().copied().max().unwrap_or(0),
            )));
        }
        Ok(Migrated::UpToDate)
    }

    /// Every statement [`migrate`](Self::migrate) may run, as one script to apply out of band
    /// (`psql -1 -f`, `sqlite3`, a migration tool): the ledger, then each step's ledger row and
    /// statements, `;`-terminated, under `header` (comment lines). Every statement is
    /// idempotent, so the script brings a schema of any older version up to date and changes
    /// nothing when applied again.
    pub(crate) fn script<DB: Ops>(&self, header: &str) -> Result<String, Error> {
        let ledger = self.table.suffixed("_migrations");
        let mut script = String::new();
        for line in header.lines() {
            script.push_str(format!("-- {line}").trim_end());
            script.push('\n');
        }
        script.push_str(&format!("\n{};\n", create_ledger::<DB>(&ledger)));
        for step in Migration::parse(self.migrations) {
            script.push_str(&format!(
                "\n-- Version {}: {}.\n{};\n",
                step.version,
                step.description,
                self.record::<DB>(
                    &ledger,
                    &step.version.to_string(),
                    &format!("'{}'", step.description.replace('\'', "''"))
                )
            ));
            for statement in &step.statements {
                script.push_str(&format!("{};\n", self.render::<DB>(statement)));
            }
        }
        Ok(script)
    }

    /// The newest version of the schema.
    fn latest(&self) -> i64 {
        latest(self.migrations)
    }

    /// The statement recording a step in `ledger`, with `version` and `description` (SQL
    /// placeholders or literals) in place.
    fn record<DB: Ops>(&self, ledger: &TableName, version: &str, description: &str) -> String {
        DB::DIALECT
            .render(RECORD)
            .replace("{ledger}", &ledger.to_string())
            .replace("{version}", version)
            .replace("{description}", description)
    }
}

/// Whether `e`, from the statement `sql` run again to re-create a dropped table, says that the
/// column `sql` adds is there already: an `ALTER TABLE … ADD COLUMN` on a database where a
/// failed statement leaves its transaction usable (SQLite, which has no `ADD COLUMN IF NOT
/// EXISTS`) and names the column as a duplicate.
fn column_was_there<DB: Ops>(sql: &str, e: &sqlx::Error) -> bool {
    !DB::DIALECT.failed_statement_aborts_transaction
        && sql.trim_start().starts_with("ALTER TABLE")
        && sql.contains("ADD COLUMN")
        && matches!(e, sqlx::Error::Database(db) if db.message().contains("duplicate column name"))
}

/// The newest version in a migrations source: how many steps it has.
pub(crate) fn latest(migrations: &'static str) -> i64 {
    Migration::parse(migrations).len() as i64
}

/// The statement that creates `ledger` if it is missing.
fn create_ledger<DB: Ops>(ledger: &TableName) -> String {
    layout(
        &DB::DIALECT
            .render(LEDGER)
            .replace("{ledger}", &ledger.to_string()),
    )
}

/// `statement` laid out as in a `.sql` file: its first line as it is, the lines after it
/// indented by four spaces, the closing parenthesis of a column list at the margin.
fn layout(statement: &str) -> String {
    let mut lines = statement.lines();
    let mut out = lines.next().unwrap_or_default().trim_end().to_owned();
    for line in lines {
        let line = line.trim();
        out.push('\n');
        if !line.starts_with(')') {
            out.push_str("    ");
        }
        out.push_str(line);
    }
    out
}

/// Whether `table` exists (read only).
async fn exists<DB: Ops>(
    conn: &mut DB::Connection,
    table: &TableName,
) -> Result<bool, sqlx::Error> {
    let sql = DB::DIALECT
        .table_exists
        .replace("{table}", &table.to_string())
        .replace("{name}", table.name());
    let rows = DB::fetch_all(conn, sqlx::query(&sql).persistent(false)).await?;
    Ok(match rows.first() {
        Some(row) => DB::get_bool(row, 0)?,
        None => false,
    })
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

#[cfg(test)]
mod tests {
    /// A shipped `.sql` file is the script the migrator's statements make for the default
    /// table, so the two cannot drift. `IDEM_WRITE_SQL=1` rewrites the file from the script.
    fn assert_shipped(store: &str, script: String) {
        let path = format!(
            "{}/sql/{store}/idem_records.sql",
            env!("CARGO_MANIFEST_DIR")
        );
        if std::env::var("IDEM_WRITE_SQL").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &script).unwrap();
        }
        let shipped = std::fs::read_to_string(&path).unwrap();
        assert!(
            shipped == script,
            "{path} differs from schema_sql(); run this test with IDEM_WRITE_SQL=1 to rewrite \
             it, and review the change:\n{script}"
        );
    }

    #[test]
    fn the_shipped_sql_files_are_what_migrate_runs() {
        #[cfg(feature = "sqlite")]
        assert_shipped(
            "sqlite",
            crate::SqliteStore::builder().schema_sql().unwrap(),
        );
        #[cfg(feature = "postgres")]
        assert_shipped(
            "postgres",
            crate::PostgresStore::builder().schema_sql().unwrap(),
        );
    }

    /// Each step's `-- Version N` line numbers it as the parser does (its position), so the
    /// versions recorded in a ledger are the ones the file shows.
    #[test]
    fn a_migrations_file_numbers_its_steps_in_order() {
        for source in [
            include_str!("../sql/sqlite/migrations.sql"),
            include_str!("../sql/postgres/migrations.sql"),
        ] {
            let headers: Vec<&str> = source
                .lines()
                .filter_map(|line| line.strip_prefix("-- Version "))
                .collect();
            let steps = super::Migration::parse(source);
            assert_eq!(steps.len(), headers.len());
            // A table and its index (1, 2); two columns and two partial indexes (3); the steps'
            // journal (4); the journal in the record's row (5); the pruner's index made and the
            // two it replaces dropped (6).
            let statements = [2, 2, 4, 1, 2, 3];
            assert_eq!(steps.len(), statements.len());
            for ((step, header), n) in steps.iter().zip(headers).zip(statements) {
                assert!(
                    header.starts_with(&format!("{}: ", step.version)),
                    "{header}"
                );
                assert_eq!(step.statements.len(), n, "{header}");
            }
        }
    }

    #[test]
    fn a_migrations_source_parses_into_steps_and_statements() {
        let steps = super::Migration::parse(
            "-- anything before the first step is passed over\n\
             -- Version 1: make t.\n\
             CREATE TABLE t (\n    a INT -- a comment stays in its line\n);\n\
             \n\
             -- a comment between statements\n\
             CREATE INDEX i ON t (a);\n\
             -- Version 2: make u\n\
             CREATE TABLE u (b INT);\n",
        );
        assert_eq!(
            steps,
            vec![
                super::Migration {
                    version: 1,
                    description: "make t",
                    statements: vec![
                        "CREATE TABLE t (\n    a INT -- a comment stays in its line\n)".to_owned(),
                        "CREATE INDEX i ON t (a)".to_owned(),
                    ],
                },
                super::Migration {
                    version: 2,
                    description: "make u",
                    statements: vec!["CREATE TABLE u (b INT)".to_owned()],
                },
            ]
        );
    }

    #[test]
    fn a_statement_is_laid_out_as_in_a_file() {
        assert_eq!(
            super::layout("CREATE TABLE t (\n            a INT,\n            b INT\n        )"),
            "CREATE TABLE t (\n    a INT,\n    b INT\n)"
        );
        assert_eq!(
            super::layout("CREATE INDEX i ON t (a)"),
            "CREATE INDEX i ON t (a)"
        );
    }
}
