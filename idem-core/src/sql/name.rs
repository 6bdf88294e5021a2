//! [`TableName`]: the one way a table (or column) name reaches SQL, for the stores and the kit.

use std::fmt;

use crate::error::Error;

/// The longest identifier PostgreSQL keeps (it truncates longer ones); SQLite has no limit, but
/// one rule for both keeps a name portable.
const MAX_LEN: usize = 63;

/// A table or column name checked to be a plain SQL identifier, `[A-Za-z_][A-Za-z0-9_]{0,62}`,
/// optionally schema-qualified (`schema.table`, PostgreSQL only).
///
/// It renders quoted (`"name"`, `"schema"."name"`), so a keyword such as `order` works as a
/// name. Quoting also makes a name case-sensitive on PostgreSQL: `Idem` and `idem` are two
/// tables, and the kit's lower-case default names mean what they always meant. A validated
/// name holds no quote, so the quoting cannot be escaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableName {
    schema: Option<String>,
    name: String,
    /// `schema.name` or `name`, as given.
    configured: String,
}

impl TableName {
    /// Validates the plain (unqualified) `name`; `what` names it in the error ("table name",
    /// "id column", …).
    pub(crate) fn new(what: &str, name: &str) -> Result<TableName, Error> {
        check(what, name)?;
        Ok(TableName {
            schema: None,
            name: name.to_owned(),
            configured: name.to_owned(),
        })
    }

    /// Validates `name` or `schema.name`.
    #[cfg(feature = "postgres")]
    pub(crate) fn qualified(what: &str, name: &str) -> Result<TableName, Error> {
        match name.split_once('.') {
            Some((schema, table)) => {
                check(what, schema)?;
                check(what, table)?;
                Ok(TableName {
                    schema: Some(schema.to_owned()),
                    name: table.to_owned(),
                    configured: name.to_owned(),
                })
            }
            None => TableName::new(what, name),
        }
    }

    /// A name derived from this one (`<table>_migrations`), in the same schema, validated in
    /// turn (so the base name must leave room for the suffix).
    pub(crate) fn suffixed(&self, what: &str, suffix: &str) -> Result<TableName, Error> {
        let name = format!("{}{suffix}", self.name);
        check(what, &name)?;
        Ok(TableName {
            configured: format!("{}{suffix}", self.configured),
            schema: self.schema.clone(),
            name,
        })
    }

    /// The same name without its schema: an index always lives in its table's schema, so its
    /// name is never qualified.
    #[cfg(feature = "postgres")]
    pub(crate) fn unqualified(&self) -> TableName {
        TableName {
            schema: None,
            name: self.name.clone(),
            configured: self.name.clone(),
        }
    }

    /// The name without its schema, unquoted.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The name as configured: `schema.name` or `name`, unquoted.
    pub(crate) fn as_configured(&self) -> &str {
        &self.configured
    }
}

/// Renders the quoted name: `"name"` or `"schema"."name"`.
impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(schema) = &self.schema {
            write!(f, "\"{schema}\".")?;
        }
        write!(f, "\"{}\"", self.name)
    }
}

fn check(what: &str, name: &str) -> Result<(), Error> {
    let mut bytes = name.bytes();
    let starts_well = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !starts_well || !rest_ok || name.len() > MAX_LEN {
        return Err(Error::InvalidConfig(format!(
            "{what} {name:?} is not a plain SQL identifier: use 1 to {MAX_LEN} ASCII letters, \
             digits or underscores, not starting with a digit"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_identifiers_pass_and_render_quoted() {
        for name in ["idem_records", "_x", "A1", &"a".repeat(63)] {
            let t = TableName::new("table name", name).unwrap();
            assert_eq!(t.name(), name);
            assert_eq!(t.to_string(), format!("\"{name}\""));
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
            "a.b",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(
                    TableName::new("table name", name),
                    Err(Error::InvalidConfig(_))
                ),
                "{name:?} was accepted"
            );
        }
    }

    #[test]
    fn suffixes_are_validated_and_keep_the_schema() {
        let long = TableName::new("table", &"a".repeat(60)).unwrap();
        assert!(long.suffixed("lease table", "_pruner").is_err());
        let t = TableName::new("table", "jobs").unwrap();
        assert_eq!(
            t.suffixed("ledger", "_migrations").unwrap().to_string(),
            "\"jobs_migrations\""
        );
    }

    #[test]
    #[cfg(feature = "postgres")]
    fn qualified_names_render_both_parts() {
        let t = TableName::qualified("table name", "app.Idem").unwrap();
        assert_eq!(t.to_string(), "\"app\".\"Idem\"");
        assert_eq!(t.as_configured(), "app.Idem");
        assert_eq!(
            t.suffixed("ledger", "_migrations").unwrap().to_string(),
            "\"app\".\"Idem_migrations\""
        );
        assert_eq!(t.unqualified().to_string(), "\"Idem\"");
        for bad in ["a.b.c", ".t", "s.", "a-b.c"] {
            assert!(TableName::qualified("table name", bad).is_err(), "{bad}");
        }
    }
}
