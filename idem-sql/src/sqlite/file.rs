//! Where a `SqliteStore`'s database is and how it is written: the `sqlite:` URL as the store
//! reads it (sqlx's URL, less the `synchronous` parameter idem reads itself), the durability
//! setting, and the error that names a file SQLite could not open.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use sqlx::sqlite::SqliteSynchronous;

use crate::error::sql_error;
use idem_core::Error;

/// When a [`SqliteStore`](crate::SqliteStore) acknowledges a write: SQLite's
/// `PRAGMA synchronous` in WAL mode, set on every connection of the pool the store makes
/// (builder: [`synchronous`](crate::SqliteStoreBuilder::synchronous); URL:
/// `?synchronous=full` or `?synchronous=normal`).
///
/// ```
/// use idem::SqliteSync;
/// assert_eq!(SqliteSync::default(), SqliteSync::Full);
/// assert_eq!("normal".parse::<SqliteSync>()?, SqliteSync::Normal);
/// assert_eq!(SqliteSync::Normal.to_string(), "normal");
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum SqliteSync {
    /// `FULL`, the default: every commit is synced to disk (an `fsync` of the log) before the
    /// statement returns, so a claim or completion the store acknowledged survives an OS crash
    /// or a power loss, not only the process crashing.
    #[default]
    Full,
    /// `NORMAL`: a commit is written to the log but synced only at checkpoints. It survives the
    /// process crashing, never corrupts the file, and costs no `fsync` per write; an OS crash or
    /// power loss may roll back the last commits (a completed key may then run once more).
    Normal,
}

impl SqliteSync {
    /// sqlx's value of the pragma.
    pub(crate) fn pragma(self) -> SqliteSynchronous {
        match self {
            SqliteSync::Full => SqliteSynchronous::Full,
            SqliteSync::Normal => SqliteSynchronous::Normal,
        }
    }
}

/// `full` or `normal`, any case, as the URL parameter takes it.
impl FromStr for SqliteSync {
    type Err = Error;

    fn from_str(s: &str) -> Result<SqliteSync, Error> {
        match s.to_ascii_lowercase().as_str() {
            "full" => Ok(SqliteSync::Full),
            "normal" => Ok(SqliteSync::Normal),
            _ => Err(Error::InvalidConfig(format!(
                "synchronous={s:?} is not a SqliteStore setting: use synchronous=full (sync \
                 every commit to disk, the default) or synchronous=normal"
            ))),
        }
    }
}

/// `full` or `normal`, as the URL parameter takes it.
impl fmt::Display for SqliteSync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SqliteSync::Full => "full",
            SqliteSync::Normal => "normal",
        })
    }
}

/// A `sqlite:` URL as the store reads it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SqliteUrl {
    /// The URL sqlx parses: this one without `synchronous`.
    pub(crate) sqlx: String,
    /// What the URL's `mode` says of a missing file: create it (`rwc`, `memory`), or it must
    /// exist (`rw`, `ro`); `None` when the URL has no `mode`.
    pub(crate) creates: Option<bool>,
    /// The URL's `synchronous`, if it has one.
    pub(crate) synchronous: Option<SqliteSync>,
    /// Whether the database lives only as long as a connection to it: `:memory:`,
    /// `mode=memory`, or an empty file name (SQLite's private temporary database).
    pub(crate) private: bool,
}

impl SqliteUrl {
    /// Reads `url`, which must start with `sqlite:`.
    pub(crate) fn parse(url: &str) -> Result<SqliteUrl, Error> {
        let Some(rest) = url.strip_prefix("sqlite:") else {
            return Err(Error::InvalidConfig(format!(
                "{url:?} is not a SQLite URL: use sqlite://path/to/file.db or sqlite::memory:"
            )));
        };
        let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
        let mut creates = None;
        let mut synchronous = None;
        let mut kept = Vec::new();
        for param in params.split('&').filter(|p| !p.is_empty()) {
            match param.split_once('=') {
                Some(("synchronous", value)) => synchronous = Some(value.parse()?),
                Some(("mode", mode)) => {
                    creates = match mode {
                        "rwc" | "memory" => Some(true),
                        "rw" | "ro" => Some(false),
                        // sqlx refuses it, naming the value.
                        _ => None,
                    };
                    kept.push(param);
                }
                _ => kept.push(param),
            }
        }
        let path = database.strip_prefix("//").unwrap_or(database);
        let private = path == ":memory:" || path.is_empty() || params_have(params, "mode=memory");
        let sqlx = if kept.is_empty() {
            format!("sqlite:{database}")
        } else {
            format!("sqlite:{database}?{}", kept.join("&"))
        };
        Ok(SqliteUrl {
            sqlx,
            creates,
            synchronous,
            private,
        })
    }
}

impl super::SqliteStore {
    /// The path of the file `url` names when opening it needs that file to exist already and it
    /// does not; `None` when it exists or would be created. A URL's `mode=rwc` or
    /// `mode=memory` creates the file, `mode=rw` or `mode=ro` does not; a URL without `mode`
    /// creates it when `create_missing` is true (as [`SqliteStore::connect`] does). What
    /// `idem::store::url` asks before it opens a URL whose file must exist.
    ///
    /// ```
    /// use idem::SqliteStore;
    /// let missing = SqliteStore::missing_file("sqlite:///no/such/dir/idem.db?mode=rw", true)?;
    /// assert_eq!(missing.as_deref(), Some("/no/such/dir/idem.db"));
    /// assert_eq!(SqliteStore::missing_file("sqlite:///no/such/dir/idem.db", true)?, None);
    /// assert_eq!(SqliteStore::missing_file("sqlite::memory:", false)?, None);
    /// # Ok::<(), idem::Error>(())
    /// ```
    ///
    /// [`SqliteStore::connect`]: super::SqliteStore::connect
    pub fn missing_file(url: &str, create_missing: bool) -> Result<Option<String>, Error> {
        let parsed = SqliteUrl::parse(url)?;
        let creates = parsed.creates.unwrap_or(create_missing);
        let path = url.trim_start_matches("sqlite:").trim_start_matches("//");
        let path = path.split_once('?').map_or(path, |(path, _)| path);
        Ok((!creates && !parsed.private && !Path::new(path).exists()).then(|| path.to_owned()))
    }
}

fn params_have(params: &str, param: &str) -> bool {
    params.split('&').any(|p| p == param)
}

/// The error of a database file SQLite could not open (`SQLITE_CANTOPEN`), naming the path and
/// what is wrong with it; any other error as it is.
pub(crate) fn cannot_open(path: &Path, e: sqlx::Error) -> Error {
    let cant_open = e
        .as_database_error()
        .and_then(|db| db.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 14);
    if !cant_open {
        return sql_error(e).into();
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let reason = if !dir.exists() {
        format!(
            "its directory {dir:?} does not exist: create it first, or give a path in a \
             directory that exists"
        )
    } else if !dir.is_dir() {
        format!("{dir:?} is not a directory")
    } else if path.is_dir() {
        "it is a directory: name a file in it, such as idem.db".to_owned()
    } else if !path.exists() {
        format!(
            "the file does not exist and was not created: a URL with mode=rw or mode=ro never \
             creates it (leave mode out, or use mode=rwc); otherwise check that this process \
             may create files in {dir:?}"
        )
    } else {
        format!("SQLite could not open it ({e}): check that this process may read and write it")
    };
    Error::SqliteFile {
        path: path.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idem_reads_synchronous_and_mode_and_passes_the_rest_to_sqlx() {
        let url = SqliteUrl::parse("sqlite://idem.db?synchronous=NORMAL&cache=shared").unwrap();
        assert_eq!(
            url,
            SqliteUrl {
                sqlx: "sqlite://idem.db?cache=shared".into(),
                creates: None,
                synchronous: Some(SqliteSync::Normal),
                private: false,
            }
        );
        let url = SqliteUrl::parse("sqlite://idem.db?mode=rw&synchronous=full").unwrap();
        assert_eq!(url.sqlx, "sqlite://idem.db?mode=rw");
        assert_eq!(url.creates, Some(false));
        assert_eq!(url.synchronous, Some(SqliteSync::Full));
        assert_eq!(
            SqliteUrl::parse("sqlite://idem.db?mode=rwc")
                .unwrap()
                .creates,
            Some(true)
        );
        assert!(matches!(
            SqliteUrl::parse("sqlite://idem.db?synchronous=off"),
            Err(Error::InvalidConfig(m)) if m.contains("synchronous=\"off\"")
        ));
        assert!(SqliteUrl::parse("postgres://x").is_err());
    }

    #[test]
    fn in_memory_urls_are_recognised() {
        for url in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://?mode=memory",
            "sqlite://",
            "sqlite::memory:?synchronous=normal",
        ] {
            assert!(SqliteUrl::parse(url).unwrap().private, "{url}");
        }
        for url in [
            "sqlite://idem.db",
            "sqlite://idem.db?mode=rwc",
            "sqlite:x:memory:",
        ] {
            assert!(!SqliteUrl::parse(url).unwrap().private, "{url}");
        }
    }
}
