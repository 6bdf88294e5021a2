//! What the SQL stores share: the validated table name that their SQL is rendered with, and the
//! shape of a versioned migration.
//!
//! A store keeps its schema as a list of [`Migration`]s whose statements name the records table
//! `{table}`. On connect the store renders them with its [`TableName`] and applies the missing
//! ones in one transaction that holds the database's write lock, recording each version in
//! `<table>_migrations`. sqlx's own migrator is not used because it cannot template the table
//! name, and one database may hold several idem tables.

use crate::error::Error;

/// The records table a store uses unless configured otherwise.
pub(crate) const DEFAULT_TABLE: &str = "idem_records";

/// A table name that is safe to splice into SQL: `[A-Za-z_][A-Za-z0-9_]{0,62}`.
///
/// Stores still quote it (`"name"`) so that a keyword such as `order` works as a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableName(String);

impl TableName {
    /// Validates `name`, or says why it is refused.
    pub(crate) fn new(name: &str) -> Result<TableName, Error> {
        let mut bytes = name.bytes();
        let starts_well = bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
        let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !starts_well || !rest_ok || name.len() > 63 {
            return Err(Error::InvalidConfig(format!(
                "table name {name:?} is not a plain SQL identifier: use 1 to 63 ASCII letters, \
                 digits or underscores, not starting with a digit"
            )));
        }
        Ok(TableName(name.to_owned()))
    }

    /// The name as given.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// `template` with every `{table}` replaced by this name.
    #[cfg(feature = "sqlite")]
    pub(crate) fn render(&self, template: &str) -> String {
        template.replace("{table}", &self.0)
    }
}

/// One step of a store's schema. Versions only grow; an applied step is never edited, a change
/// is a new step.
#[derive(Debug)]
pub(crate) struct Migration {
    /// Position in the list, recorded in `<table>_migrations` once applied.
    pub(crate) version: i64,
    /// What the step does, recorded next to the version for whoever inspects the database.
    pub(crate) description: &'static str,
    /// Statements naming the records table `{table}`, run in order.
    pub(crate) statements: &'static [&'static str],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_identifiers_pass() {
        for name in ["idem_records", "_x", "A1", &"a".repeat(63)] {
            assert_eq!(TableName::new(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn anything_else_is_invalid_config() {
        for name in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a\"b",
            "t;drop",
            "é",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(TableName::new(name), Err(Error::InvalidConfig(_))),
                "{name:?} was accepted"
            );
        }
    }

    #[test]
    #[cfg(feature = "sqlite")]
    fn render_substitutes_every_occurrence() {
        let t = TableName::new("jobs").unwrap();
        assert_eq!(
            t.render("CREATE INDEX \"{table}_x\" ON \"{table}\" (x)"),
            "CREATE INDEX \"jobs_x\" ON \"jobs\" (x)"
        );
    }
}
