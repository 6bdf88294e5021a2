//! [`TableName`]: the one way a table (or column) name reaches SQL, for the stores and the kit.

use std::fmt;

use sha2::{Digest, Sha256};

use idem_core::Error;

/// The longest name, of a table or of anything derived from one: the longest identifier
/// PostgreSQL keeps (it truncates longer ones). SQLite has no limit, but one rule for both keeps
/// a name portable. This is the one limit of a table name (the SQL stores' and the kit's); the
/// names derived from it always fit too ([`TableName::suffixed`]).
pub(crate) const MAX_LEN: usize = 63;

/// How many hex digits of a hash stand for the cut end of a derived name too long to keep whole.
const HASH_DIGITS: usize = 8;

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

    /// A name derived from this one (`<table>_migrations`, `<table>_steps_expires_at_idx`), in
    /// the same schema, that fits [`MAX_LEN`] whatever this name's length: `<table><suffix>`
    /// when that fits, which is every name up to `MAX_LEN - suffix.len()` bytes (so the names a
    /// schema already holds keep theirs); otherwise the table name cut short, `_`, the first 8
    /// hex digits of the SHA-256 of the whole derived name, and the suffix. The cut is stable
    /// (the same name gives the same derived name in every version and on every machine), and
    /// two table names that share the kept part differ in the hash. `suffix` is one of idem's own
    /// (ASCII letters, digits and `_`, far shorter than `MAX_LEN`).
    pub(crate) fn suffixed(&self, suffix: &str) -> TableName {
        let whole = format!("{}{suffix}", self.name);
        let name = if whole.len() <= MAX_LEN {
            whole
        } else {
            let keep = MAX_LEN.saturating_sub(1 + HASH_DIGITS + suffix.len());
            let digest = Sha256::digest(whole.as_bytes());
            let hash: String = digest
                .iter()
                .take(HASH_DIGITS / 2)
                .map(|b| format!("{b:02x}"))
                .collect();
            // A validated name is ASCII, so any byte is a character boundary.
            let kept = self.name.get(..keep).unwrap_or(&self.name);
            format!("{kept}_{hash}{suffix}")
        };
        TableName {
            configured: match &self.schema {
                Some(schema) => format!("{schema}.{name}"),
                None => name.clone(),
            },
            schema: self.schema.clone(),
            name,
        }
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

    /// Every suffix idem derives a name with, longest last.
    const SUFFIXES: [&str; 8] = [
        "_steps",
        "_pruner",
        "_migrations",
        "_expires_at",
        "_created_at",
        "_expires_at_idx",
        "_steps_expires_at",
        "_steps_expires_at_idx",
    ];

    #[test]
    fn a_derived_name_is_the_name_and_suffix_while_it_fits() {
        let t = TableName::new("table", "jobs").unwrap();
        assert_eq!(t.suffixed("_migrations").to_string(), "\"jobs_migrations\"");
        // 48 + 15 = 63: the longest table whose index v1 named whole keeps that name.
        let t = TableName::new("table", &"t".repeat(48)).unwrap();
        assert_eq!(
            t.suffixed("_expires_at_idx").name(),
            format!("{}_expires_at_idx", "t".repeat(48))
        );
    }

    #[test]
    fn a_derived_name_always_fits_and_is_a_valid_identifier() {
        for len in 1..=MAX_LEN {
            let t = TableName::new("table", &"t".repeat(len)).unwrap();
            for suffix in SUFFIXES {
                let derived = t.suffixed(suffix);
                assert!(derived.name().len() <= MAX_LEN, "{len} {suffix}");
                assert!(derived.name().ends_with(suffix), "{len} {suffix}");
                check("derived", derived.name()).unwrap();
                // Derived twice (the steps table's index).
                let twice = derived.suffixed(suffix);
                assert!(twice.name().len() <= MAX_LEN, "{len} {suffix} twice");
            }
        }
    }

    #[test]
    fn a_cut_name_is_stable_and_tells_names_apart() {
        let a = TableName::new("table", &format!("{}a", "t".repeat(62))).unwrap();
        let b = TableName::new("table", &format!("{}b", "t".repeat(62))).unwrap();
        let cut = a.suffixed("_steps_expires_at_idx");
        // The same in every version: a schema created with it must be found again.
        assert_eq!(
            cut.name(),
            format!("{}_{}_steps_expires_at_idx", "t".repeat(33), "b4fc678b")
        );
        assert_eq!(cut.name().len(), MAX_LEN);
        assert_ne!(cut, b.suffixed("_steps_expires_at_idx"));
    }

    #[test]
    #[cfg(feature = "postgres")]
    fn qualified_names_render_both_parts() {
        let t = TableName::qualified("table name", "app.Idem").unwrap();
        assert_eq!(t.to_string(), "\"app\".\"Idem\"");
        assert_eq!(t.as_configured(), "app.Idem");
        let ledger = t.suffixed("_migrations");
        assert_eq!(ledger.to_string(), "\"app\".\"Idem_migrations\"");
        assert_eq!(ledger.as_configured(), "app.Idem_migrations");
        let long = TableName::qualified("table name", &format!("app.{}", "t".repeat(63))).unwrap();
        let cut = long.suffixed("_migrations");
        assert_eq!(cut.as_configured(), format!("app.{}", cut.name()));
        assert_eq!(t.unqualified().to_string(), "\"Idem\"");
        for bad in ["a.b.c", ".t", "s.", "a-b.c"] {
            assert!(TableName::qualified("table name", bad).is_err(), "{bad}");
        }
    }
}
