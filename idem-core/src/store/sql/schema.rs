//! What the two SQL stores' schemas share: the names their migrations fill in besides
//! `{table}`, and migrating, checking or scripting a records table with them. Each store keeps
//! its own [`Migration`]s and the way it names an index.

use super::steps::steps_table;
use crate::error::Error;
use crate::sql::dialect::Ops;
use crate::sql::migrate::{Migrated, Migration, Schema};
use crate::sql::name::TableName;

/// A SQL store's schema for any records table.
pub(crate) struct StoreSchema {
    /// Oldest step first. Never change what an applied step creates; append a new step.
    pub(crate) migrations: &'static [Migration],
    /// The name of a table's expiry index (the records table's, and the steps table's).
    pub(crate) index: fn(&TableName) -> Result<TableName, Error>,
}

/// The names the migrations of `table` use: `{index}`, `{steps}` and `{steps_index}`.
struct Names {
    index: TableName,
    steps: TableName,
    steps_index: TableName,
}

impl Names {
    /// Each placeholder with its name, as [`Schema::names`] takes them.
    fn placeholders(&self) -> [(&'static str, &TableName); 3] {
        [
            ("{index}", &self.index),
            ("{steps_index}", &self.steps_index),
            ("{steps}", &self.steps),
        ]
    }
}

impl StoreSchema {
    /// The newest schema version.
    pub(crate) const fn latest(&self) -> i64 {
        self.migrations[self.migrations.len() - 1].version
    }

    /// `table`'s expiry index, its steps table ([`steps_table`]) and that table's expiry index.
    fn names(&self, table: &TableName) -> Result<Names, Error> {
        let steps = steps_table(table)?;
        Ok(Names {
            index: (self.index)(table)?,
            steps_index: (self.index)(&steps)?,
            steps,
        })
    }

    /// The migrator's schema of `table` with the names `names` fills in.
    fn of<'a>(
        &self,
        table: &'a TableName,
        names: &'a [(&'static str, &'a TableName)],
    ) -> Schema<'a> {
        Schema {
            table,
            names,
            migrations: self.migrations,
        }
    }

    /// Brings `table`, its steps table and their indexes up to date ([`Schema::migrate`]).
    pub(crate) async fn migrate<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        table: &TableName,
    ) -> Result<Migrated, Error> {
        let names = self.names(table)?;
        self.of(table, &names.placeholders())
            .migrate::<DB>(conn)
            .await
    }

    /// Checks that `table` is up to date, changing nothing ([`Schema::check`]).
    pub(crate) async fn check<DB: Ops>(
        &self,
        conn: &mut DB::Connection,
        table: &TableName,
    ) -> Result<Migrated, Error> {
        let names = self.names(table)?;
        self.of(table, &names.placeholders())
            .check::<DB>(conn)
            .await
    }

    /// What [`migrate`](Self::migrate) runs, as a script headed by `header`
    /// ([`Schema::script`]).
    pub(crate) fn script<DB: Ops>(&self, table: &TableName, header: &str) -> Result<String, Error> {
        let names = self.names(table)?;
        self.of(table, &names.placeholders()).script::<DB>(header)
    }
}
