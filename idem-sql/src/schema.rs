//! What the two SQL stores' schemas share: the names their migrations fill in besides
//! `{table}`, and the migrator's [`Schema`] of a records table with them. Each store keeps its
//! own migrations (a `.sql` file under `idem-sql/sql/`) and the way it names an index.

use super::steps::steps_table;
use crate::dialect::Ops;
use crate::migrate::{self, Schema};
use crate::name::TableName;
use idem_core::Error;

/// A SQL store's schema for any records table.
pub(crate) struct StoreSchema {
    /// Its steps, oldest first (see [`Migration::parse`](migrate::Migration::parse)). Never
    /// change what an applied step creates; append a new step.
    pub(crate) migrations: &'static str,
    /// The name of a table's index on a column (`expires_at`: the records table's expiry
    /// index, the pruner's index since version 6, and the steps table's; `result_until` and
    /// `uncertain`: the records table's partial indexes of version 3).
    pub(crate) index: fn(&TableName, &str) -> TableName,
    /// The same name as `DROP INDEX` takes it (in the table's schema, where the store has
    /// schemas).
    pub(crate) dropped_index: fn(&TableName, &str) -> TableName,
}

impl StoreSchema {
    /// The newest schema version.
    pub(crate) fn latest(&self) -> i64 {
        migrate::latest(self.migrations)
    }

    /// The names the migrations of `table` fill in: its expiry index, its steps table
    /// ([`steps_table`]) and that table's expiry index, its partial indexes of the responses
    /// a tombstone sheds and of the uncertain claims, and the names version 6 drops the first
    /// and the third by (as `DROP INDEX` takes them) before the pruner's index takes the
    /// first's name.
    pub(crate) fn names(&self, table: &TableName) -> [(&'static str, TableName); 7] {
        let steps = steps_table(table);
        [
            ("{index}", (self.index)(table, "expires_at")),
            ("{steps_index}", (self.index)(&steps, "expires_at")),
            ("{result_index}", (self.index)(table, "result_until")),
            ("{uncertain_index}", (self.index)(table, "uncertain")),
            ("{drop_index}", (self.dropped_index)(table, "expires_at")),
            (
                "{drop_result_index}",
                (self.dropped_index)(table, "result_until"),
            ),
            ("{steps}", steps),
        ]
    }

    /// The migrator's schema of `table`, whose migrations fill in `names` ([`names`](Self::names)).
    pub(crate) fn of<'a>(
        &self,
        table: &'a TableName,
        names: &'a [(&'static str, TableName)],
    ) -> Schema<'a> {
        Schema {
            table,
            names,
            migrations: self.migrations,
        }
    }

    /// What the store's `migrate` runs on `table`, as a script to apply out of band, headed by
    /// what it is: the schema of `store` (`SqliteStore`, `PostgresStore`) for `table`, and
    /// `apply`, how to apply it and what applying it again does.
    pub(crate) fn script<DB: Ops>(
        &self,
        table: &TableName,
        store: &str,
        apply: &str,
    ) -> Result<String, Error> {
        let names = self.names(table);
        self.of(table, &names).script::<DB>(&format!(
            "The schema of idem's {store} for the table {table}, up to version {latest}:\n\
             the statements {store}Builder::migrate runs, from {store}Builder::schema_sql.\n\
             {apply}\n\
             For another table, {store}::builder().table(NAME).schema_sql() writes its script.",
            latest = self.latest(),
        ))
    }
}
