//! What the two SQL stores' schemas share: the names their migrations fill in besides
//! `{table}`, and the migrator's [`Schema`] of a records table with them. Each store keeps its
//! own [`Migration`]s and the way it names an index.

use super::steps::steps_table;
use crate::error::Error;
use crate::sql::migrate::{Migration, Schema};
use crate::sql::name::TableName;

/// A SQL store's schema for any records table.
pub(crate) struct StoreSchema {
    /// Oldest step first. Never change what an applied step creates; append a new step.
    pub(crate) migrations: &'static [Migration],
    /// The name of a table's expiry index (the records table's, and the steps table's).
    pub(crate) index: fn(&TableName) -> Result<TableName, Error>,
}

impl StoreSchema {
    /// The newest schema version.
    pub(crate) const fn latest(&self) -> i64 {
        self.migrations[self.migrations.len() - 1].version
    }

    /// The names the migrations of `table` fill in: its expiry index, its steps table
    /// ([`steps_table`]) and that table's expiry index.
    pub(crate) fn names(&self, table: &TableName) -> Result<[(&'static str, TableName); 3], Error> {
        let steps = steps_table(table)?;
        Ok([
            ("{index}", (self.index)(table)?),
            ("{steps_index}", (self.index)(&steps)?),
            ("{steps}", steps),
        ])
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
}
