//! Store URLs: one parser, and the store each opens, for every tool that takes a store as a
//! URL (the `idem` command, the benchmark, the storm workers, a server's configuration).
//!
//! | URL | store | its namespace is | cargo feature |
//! |---|---|---|---|
//! | `sqlite://PATH`, `sqlite::memory:` (sqlx's SQLite URLs) | `SqliteStore` | the table (default `idem_records`) | `sqlite` |
//! | `postgres://USER@HOST/DB`, `postgresql://…` | `PostgresStore` | the table, `schema.table` allowed (default `idem_records`) | `postgres` |
//! | `redis://[USER:PASSWORD@]HOST:PORT[/DB]` | `RedisStore` on one server | the key prefix (default `idem`) | `redis` |
//! | `redis-cluster://[USER:PASSWORD@]HOST:PORT,HOST:PORT,…` | `RedisStore` on a Redis Cluster, from any of its nodes | the key prefix (default `idem`) | `redis` |
//! | `dynamodb://HOST:PORT`, `dynamodb+http://HOST:PORT` | `DynamoStore` at the endpoint `http://HOST:PORT` (a local emulator) | the table (default `idem_records`) | `dynamodb` |
//! | `dynamodb+https://HOST[:PORT]` | `DynamoStore` at `https://HOST[:PORT]` | the table (default `idem_records`) | `dynamodb` |
//! | `idem+http://HOST:PORT[/PATH]?token=TOKEN` | `RemoteStore`: the idem-server at `http://HOST:PORT[/PATH]`, as the caller whose bearer token is `TOKEN` (taken as written, not percent-decoded) | the server's namespace (default `default`) | `remote` |
//!
//! [`StoreUrl::parse`] accepts only the schemes of the stores this build has: any other URL is a
//! [`StoreUrlError`] whose message lists them and, for a known scheme whose store is not built,
//! names the cargo feature that adds it. [`StoreUrl::connect`] opens the store.
//!
//! ```
//! use idem::store::url::{Scheme, StoreUrl};
//!
//! let url = StoreUrl::parse("redis-cluster://user:secret@10.0.0.1:7000,10.0.0.2:7000")?;
//! assert_eq!(url.scheme(), Scheme::RedisCluster);
//! assert_eq!(
//!     url,
//!     StoreUrl::RedisCluster(vec![
//!         "redis://user:secret@10.0.0.1:7000".into(),
//!         "redis://user:secret@10.0.0.2:7000".into(),
//!     ])
//! );
//! // The password never reaches a message.
//! let err = StoreUrl::parse("mysql://user:secret@db/app").unwrap_err();
//! assert!(err.to_string().contains("unsupported store URL \"mysql://user:***@db/app\""));
//! # Ok::<(), idem::store::url::StoreUrlError>(())
//! ```

use std::fmt;

/// Declares its items only when a store that opens by URL is built.
macro_rules! with_a_url_store {
    ($($item:item)*) => {$(
        #[cfg(any(
            feature = "sqlite",
            feature = "postgres",
            feature = "redis",
            feature = "dynamodb",
            feature = "remote"
        ))]
        $item
    )*};
}

with_a_url_store! {
    mod open;
    pub use open::{ConnectError, ConnectOptions, OpenedStore};
}

/// The kinds of store URL, one per scheme (the `dynamodb` forms are one kind).
///
/// ```
/// use idem::store::url::Scheme;
/// assert_eq!(Scheme::RedisCluster.feature(), "redis");
/// assert_eq!(Scheme::RedisCluster.default_namespace(), "idem");
/// assert_eq!(Scheme::Postgres.is_built(), cfg!(feature = "postgres"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// `sqlite:` URLs.
    Sqlite,
    /// `postgres://` and `postgresql://`.
    Postgres,
    /// `redis://`: one server.
    Redis,
    /// `redis-cluster://`: a Redis Cluster.
    RedisCluster,
    /// `dynamodb://`, `dynamodb+http://` and `dynamodb+https://`.
    DynamoDb,
    /// `idem+http://`: an idem-server.
    Remote,
}

impl Scheme {
    /// Every scheme, in the order messages list them.
    pub const ALL: [Scheme; 6] = [
        Scheme::Sqlite,
        Scheme::Postgres,
        Scheme::Redis,
        Scheme::RedisCluster,
        Scheme::DynamoDb,
        Scheme::Remote,
    ];

    /// The URL prefixes of this scheme.
    ///
    /// ```
    /// use idem::store::url::Scheme;
    /// assert_eq!(Scheme::Postgres.prefixes(), ["postgres://", "postgresql://"]);
    /// ```
    pub fn prefixes(self) -> &'static [&'static str] {
        match self {
            Scheme::Sqlite => &["sqlite:"],
            Scheme::Postgres => &["postgres://", "postgresql://"],
            Scheme::Redis => &["redis://"],
            Scheme::RedisCluster => &["redis-cluster://"],
            Scheme::DynamoDb => &["dynamodb://", "dynamodb+http://", "dynamodb+https://"],
            Scheme::Remote => &["idem+http://"],
        }
    }

    /// The URL's form, as messages show it.
    ///
    /// ```
    /// use idem::store::url::Scheme;
    /// assert_eq!(Scheme::Sqlite.form(), "sqlite://PATH");
    /// ```
    pub fn form(self) -> &'static str {
        match self {
            Scheme::Sqlite => "sqlite://PATH",
            Scheme::Postgres => "postgres://USER@HOST/DB",
            Scheme::Redis => "redis://HOST:PORT",
            Scheme::RedisCluster => "redis-cluster://HOST:PORT,HOST:PORT,…",
            Scheme::DynamoDb => "dynamodb://HOST:PORT or dynamodb+https://HOST",
            Scheme::Remote => "idem+http://HOST:PORT?token=TOKEN",
        }
    }

    /// The cargo feature (of `idem`, `idem-core` and `idem-cli` alike) that builds this
    /// scheme's store.
    ///
    /// ```
    /// use idem::store::url::Scheme;
    /// assert_eq!(Scheme::DynamoDb.feature(), "dynamodb");
    /// ```
    pub fn feature(self) -> &'static str {
        match self {
            Scheme::Sqlite => "sqlite",
            Scheme::Postgres => "postgres",
            Scheme::Redis | Scheme::RedisCluster => "redis",
            Scheme::DynamoDb => "dynamodb",
            Scheme::Remote => "remote",
        }
    }

    /// Whether this build has the scheme's store (its [`feature`](Self::feature) is on).
    ///
    /// ```
    /// use idem::store::url::Scheme;
    /// assert_eq!(Scheme::Sqlite.is_built(), cfg!(feature = "sqlite"));
    /// ```
    pub fn is_built(self) -> bool {
        match self {
            Scheme::Sqlite => cfg!(feature = "sqlite"),
            Scheme::Postgres => cfg!(feature = "postgres"),
            Scheme::Redis | Scheme::RedisCluster => cfg!(feature = "redis"),
            Scheme::DynamoDb => cfg!(feature = "dynamodb"),
            Scheme::Remote => cfg!(feature = "remote"),
        }
    }

    /// Where the store keeps its records unless told otherwise: its default table, on Redis
    /// its default key prefix, on an idem-server its default namespace.
    ///
    /// ```
    /// use idem::store::url::Scheme;
    /// assert_eq!(Scheme::Sqlite.default_namespace(), "idem_records");
    /// assert_eq!(Scheme::Redis.default_namespace(), "idem");
    /// assert_eq!(Scheme::Remote.default_namespace(), "default");
    /// ```
    pub fn default_namespace(self) -> &'static str {
        match self {
            Scheme::Redis | Scheme::RedisCluster => "idem",
            Scheme::Remote => "default",
            _ => "idem_records",
        }
    }

    fn of(url: &str) -> Option<Scheme> {
        Scheme::ALL
            .into_iter()
            .find(|s| s.prefixes().iter().any(|p| url.starts_with(p)))
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.form())
    }
}

/// A store URL, parsed: what [`connect`](StoreUrl::connect) needs to open the store.
///
/// ```
/// use idem::store::url::StoreUrl;
/// # if cfg!(feature = "dynamodb") {
/// assert_eq!(
///     StoreUrl::parse("dynamodb://127.0.0.1:8000")?,
///     StoreUrl::DynamoDb { endpoint: "http://127.0.0.1:8000".into() },
/// );
/// # }
/// # Ok::<(), idem::store::url::StoreUrlError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// A SQLite database: the URL as given, which sqlx reads (`?mode=rwc` creates the file).
    Sqlite(String),
    /// A PostgreSQL database: the URL as given.
    Postgres(String),
    /// One Redis server: the URL as given, which the redis crate reads.
    Redis(String),
    /// A Redis Cluster: a `redis://` URL for each node given, each with the credentials given
    /// once before the first node.
    RedisCluster(Vec<String>),
    /// DynamoDB at an endpoint (`http://HOST:PORT` or `https://HOST[:PORT]`).
    DynamoDb {
        /// The endpoint the client sends its requests to.
        endpoint: String,
    },
    /// An idem-server (`RemoteStore`).
    Remote {
        /// Its address, `http://HOST:PORT[/PATH]`.
        server: String,
        /// The bearer token the store sends.
        token: String,
    },
}

impl StoreUrl {
    /// Parses `url`. Fails when the scheme is unknown or its store is not in this build, and
    /// when a Redis Cluster URL names no node or a DynamoDB URL no host; nothing is opened.
    ///
    /// ```
    /// use idem::store::url::{StoreUrl, StoreUrlError};
    /// # if cfg!(feature = "sqlite") {
    /// assert_eq!(
    ///     StoreUrl::parse("sqlite:///var/lib/app/idem.db")?,
    ///     StoreUrl::Sqlite("sqlite:///var/lib/app/idem.db".into()),
    /// );
    /// # }
    /// assert!(matches!(
    ///     StoreUrl::parse("/var/lib/app/idem.db"),
    ///     Err(StoreUrlError::UnknownScheme { .. }),
    /// ));
    /// # Ok::<(), StoreUrlError>(())
    /// ```
    pub fn parse(url: &str) -> Result<StoreUrl, StoreUrlError> {
        let Some(scheme) = Scheme::of(url) else {
            return Err(StoreUrlError::UnknownScheme { url: redacted(url) });
        };
        if !scheme.is_built() {
            return Err(StoreUrlError::NotBuilt {
                url: redacted(url),
                scheme,
            });
        }
        let rest = |prefixes: &[&str]| {
            prefixes
                .iter()
                .find_map(|p| url.strip_prefix(p))
                .unwrap_or_default()
        };
        match scheme {
            Scheme::Sqlite => Ok(StoreUrl::Sqlite(url.to_owned())),
            Scheme::Postgres => Ok(StoreUrl::Postgres(url.to_owned())),
            Scheme::Redis => Ok(StoreUrl::Redis(url.to_owned())),
            Scheme::RedisCluster => {
                let rest = rest(scheme.prefixes());
                // Credentials given once, before the first node, apply to every node.
                let (auth, nodes) = match rest.rsplit_once('@') {
                    Some((auth, nodes)) => (format!("{auth}@"), nodes),
                    None => (String::new(), rest),
                };
                let nodes: Vec<String> = nodes
                    .split(',')
                    .filter(|n| !n.is_empty())
                    .map(|n| format!("redis://{auth}{n}"))
                    .collect();
                if nodes.is_empty() {
                    return Err(StoreUrlError::NoHost {
                        url: redacted(url),
                        scheme,
                    });
                }
                Ok(StoreUrl::RedisCluster(nodes))
            }
            Scheme::DynamoDb => {
                let host = rest(scheme.prefixes());
                if host.is_empty() || host.starts_with('/') {
                    return Err(StoreUrlError::NoHost {
                        url: redacted(url),
                        scheme,
                    });
                }
                let protocol = if url.starts_with("dynamodb+https://") {
                    "https"
                } else {
                    "http"
                };
                Ok(StoreUrl::DynamoDb {
                    endpoint: format!("{protocol}://{host}"),
                })
            }
            Scheme::Remote => {
                let (address, query) = rest(scheme.prefixes())
                    .split_once('?')
                    .unwrap_or((rest(scheme.prefixes()), ""));
                if address.is_empty() || address.starts_with('/') {
                    return Err(StoreUrlError::NoHost {
                        url: redacted(url),
                        scheme,
                    });
                }
                let token = query
                    .split('&')
                    .find_map(|pair| pair.strip_prefix("token="))
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| StoreUrlError::NoToken { url: redacted(url) })?;
                Ok(StoreUrl::Remote {
                    server: format!("http://{address}"),
                    token: token.to_owned(),
                })
            }
        }
    }

    /// The URL's scheme.
    ///
    /// ```
    /// use idem::store::url::{Scheme, StoreUrl};
    /// assert_eq!(StoreUrl::Redis("redis://127.0.0.1:6379".into()).scheme(), Scheme::Redis);
    /// ```
    pub fn scheme(&self) -> Scheme {
        match self {
            StoreUrl::Sqlite(_) => Scheme::Sqlite,
            StoreUrl::Postgres(_) => Scheme::Postgres,
            StoreUrl::Redis(_) => Scheme::Redis,
            StoreUrl::RedisCluster(_) => Scheme::RedisCluster,
            StoreUrl::DynamoDb { .. } => Scheme::DynamoDb,
            StoreUrl::Remote { .. } => Scheme::Remote,
        }
    }

    /// Where the store keeps its records unless told otherwise: [`Scheme::default_namespace`].
    ///
    /// ```
    /// use idem::store::url::StoreUrl;
    /// assert_eq!(StoreUrl::Postgres("postgres://localhost/app".into()).default_namespace(), "idem_records");
    /// ```
    pub fn default_namespace(&self) -> &'static str {
        self.scheme().default_namespace()
    }
}

/// Why a store URL was refused. Its message names the URL (its password hidden) and what to
/// write instead.
///
/// ```
/// use idem::store::url::{StoreUrl, StoreUrlError};
/// let err = StoreUrl::parse("redis-cluster://").unwrap_err();
/// if cfg!(feature = "redis") {
///     assert!(matches!(err, StoreUrlError::NoHost { .. }));
///     assert!(err.to_string().contains("names no node"));
/// } else {
///     assert!(err.to_string().contains("cargo feature `redis`"));
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreUrlError {
    /// No store has the URL's scheme.
    #[error("unsupported store URL {url:?}: {}", Supported(true))]
    UnknownScheme {
        /// The URL, its password hidden.
        url: String,
    },
    /// The URL's store is not in this build.
    #[error(
        "{url:?} names a store this build lacks: rebuild with the cargo feature `{feature}` \
         (`--features {feature}`); {supported}",
        feature = scheme.feature(),
        supported = Supported(false)
    )]
    NotBuilt {
        /// The URL, its password hidden.
        url: String,
        /// Its scheme.
        scheme: Scheme,
    },
    /// An `idem+http://` URL without `?token=`.
    #[error("{url:?} names no token: use {}", Scheme::Remote.form())]
    NoToken {
        /// The URL, its token hidden.
        url: String,
    },
    /// A `redis-cluster://` URL without a node, or a `dynamodb://` or `idem+http://` URL
    /// without a host.
    #[error("{url:?} names no {}: use {}", if *scheme == Scheme::RedisCluster { "node" } else { "host" }, scheme.form())]
    NoHost {
        /// The URL, its password hidden.
        url: String,
        /// Its scheme.
        scheme: Scheme,
    },
}

/// The schemes this build takes and, when `.0`, the features that would add the others.
struct Supported(bool);

impl fmt::Display for Supported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (built, missing): (Vec<Scheme>, Vec<Scheme>) =
            Scheme::ALL.into_iter().partition(|s| s.is_built());
        if built.is_empty() {
            f.write_str("this build has no store that opens by URL")?;
        } else {
            f.write_str("this build takes ")?;
            for (i, s) in built.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                f.write_str(s.form())?;
            }
        }
        if self.0 {
            for (i, s) in missing.iter().enumerate() {
                let sep = if i == 0 { "; " } else { ", " };
                write!(
                    f,
                    "{sep}{} needs the cargo feature `{}`",
                    s.prefixes()[0],
                    s.feature()
                )?;
            }
        }
        Ok(())
    }
}

/// `url` with the password of its user info, and the value of a `token=` in its query,
/// replaced by `***`, so a message or a log line never shows them. What every message of this
/// module does; for a program's own messages that name a store URL.
///
/// ```
/// use idem::store::url::redacted;
/// assert_eq!(redacted("postgres://app:s3cret@db/app"), "postgres://app:***@db/app");
/// assert_eq!(redacted("sqlite://idem.db"), "sqlite://idem.db");
/// assert_eq!(redacted("idem+http://h:8624?token=s3cret&x=1"), "idem+http://h:8624?token=***&x=1");
/// ```
pub fn redacted(url: &str) -> String {
    match url.split_once('?') {
        Some((before, query)) if query.split('&').any(|p| p.starts_with("token=")) => {
            let query: Vec<&str> = query
                .split('&')
                .map(|p| {
                    if p.starts_with("token=") {
                        "token=***"
                    } else {
                        p
                    }
                })
                .collect();
            format!("{}?{}", redacted_user(before), query.join("&"))
        }
        _ => redacted_user(url),
    }
}

/// `url` with the password of its user info replaced by `***`.
fn redacted_user(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, hosts)) => {
            let user = user_info
                .split_once(':')
                .map_or(user_info, |(user, _)| user);
            let hidden = if user_info.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{hosts}{path}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `url` parses to `expected` when its store is built, and otherwise is refused naming the
    /// feature to turn on.
    fn parses(url: &str, expected: StoreUrl) {
        let scheme = expected.scheme();
        match StoreUrl::parse(url) {
            Ok(got) => {
                assert!(scheme.is_built(), "{url} parsed without its store");
                assert_eq!(got, expected, "{url}");
                assert_eq!(got.scheme(), scheme);
            }
            Err(e) => {
                assert!(!scheme.is_built(), "{url}: {e}");
                assert_eq!(
                    e,
                    StoreUrlError::NotBuilt {
                        url: redacted(url),
                        scheme
                    }
                );
                let message = e.to_string();
                assert!(
                    message.contains(&format!("`--features {}`", scheme.feature())),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn every_scheme_parses() {
        for url in [
            "sqlite:///var/lib/app/idem.db",
            "sqlite://idem.db?mode=rwc",
            "sqlite::memory:",
        ] {
            parses(url, StoreUrl::Sqlite(url.into()));
        }
        for url in [
            "postgres://app:secret@db.internal:5432/app",
            "postgresql://localhost/app?sslmode=require",
        ] {
            parses(url, StoreUrl::Postgres(url.into()));
        }
        for url in ["redis://127.0.0.1:6379", "redis://:secret@cache:6380/2"] {
            parses(url, StoreUrl::Redis(url.into()));
        }
        parses(
            "redis-cluster://a:7000,b:7001",
            StoreUrl::RedisCluster(vec!["redis://a:7000".into(), "redis://b:7001".into()]),
        );
        parses(
            "redis-cluster://u:p@a:7000,,b:7001",
            StoreUrl::RedisCluster(vec![
                "redis://u:p@a:7000".into(),
                "redis://u:p@b:7001".into(),
            ]),
        );
        let dynamo = |endpoint: &str| StoreUrl::DynamoDb {
            endpoint: endpoint.into(),
        };
        parses("dynamodb://127.0.0.1:8000", dynamo("http://127.0.0.1:8000"));
        parses("dynamodb+http://h:8000", dynamo("http://h:8000"));
        parses(
            "dynamodb+https://dynamodb.eu-west-1.amazonaws.com",
            dynamo("https://dynamodb.eu-west-1.amazonaws.com"),
        );
        parses(
            "idem+http://idem-server:8624/idem?x=1&token=t0k3n",
            StoreUrl::Remote {
                server: "http://idem-server:8624/idem".into(),
                token: "t0k3n".into(),
            },
        );
    }

    /// Each of `urls` is refused; when `scheme`'s store is built, with an error that `is`
    /// accepts and whose message says each of `says`.
    fn refused(scheme: Scheme, urls: &[&str], is: fn(&StoreUrlError) -> bool, says: &[&str]) {
        for url in urls {
            let err = StoreUrl::parse(url).unwrap_err();
            if scheme.is_built() {
                assert!(is(&err), "{url}: {err}");
                for part in says {
                    assert!(err.to_string().contains(part), "{url}: {err}");
                }
            }
        }
    }

    fn no_host(err: &StoreUrlError) -> bool {
        matches!(err, StoreUrlError::NoHost { .. })
    }

    #[test]
    fn a_server_url_names_a_host_and_a_token() {
        let urls = [
            "idem+http://",
            "idem+http://?token=t",
            "idem+http:///p?token=t",
        ];
        refused(Scheme::Remote, &urls, no_host, &[]);
        let urls = [
            "idem+http://h:1",
            "idem+http://h:1?token=",
            "idem+http://h:1?tok=x",
        ];
        let no_token = |err: &StoreUrlError| matches!(err, StoreUrlError::NoToken { .. });
        refused(Scheme::Remote, &urls, no_token, &["?token=TOKEN"]);
        let err = StoreUrl::parse("idem+http://?token=hunter2").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn namespaces_default_per_store() {
        assert_eq!(StoreUrl::Redis(String::new()).default_namespace(), "idem");
        assert_eq!(StoreUrl::RedisCluster(vec![]).default_namespace(), "idem");
        for url in [
            StoreUrl::Sqlite(String::new()),
            StoreUrl::Postgres(String::new()),
            StoreUrl::DynamoDb {
                endpoint: String::new(),
            },
        ] {
            assert_eq!(url.default_namespace(), "idem_records", "{url:?}");
        }
    }

    #[test]
    fn an_unknown_scheme_lists_what_this_build_takes() {
        for url in [
            "mysql://app@db/app",
            "/var/lib/app/idem.db",
            "",
            "http://127.0.0.1:8000",
            "rediss://cache:6380",
            "SQLITE://idem.db",
        ] {
            let err = StoreUrl::parse(url).unwrap_err();
            assert_eq!(err, StoreUrlError::UnknownScheme { url: url.into() });
            let message = err.to_string();
            assert!(message.starts_with("unsupported store URL"), "{message}");
            for scheme in Scheme::ALL {
                if scheme.is_built() {
                    assert!(message.contains(scheme.form()), "{message}");
                } else {
                    assert!(
                        message.contains(&format!("cargo feature `{}`", scheme.feature())),
                        "{message}"
                    );
                }
            }
            assert!(!message.contains('\n'), "one line: {message}");
        }
    }

    #[test]
    fn urls_without_a_host_are_refused() {
        let urls = [
            "redis-cluster://",
            "redis-cluster://u:p@",
            "redis-cluster://,",
        ];
        let says = ["names no node", "redis-cluster://HOST:PORT"];
        refused(Scheme::RedisCluster, &urls, no_host, &says);
        let urls = ["dynamodb://", "dynamodb+https://", "dynamodb:///path"];
        refused(Scheme::DynamoDb, &urls, no_host, &["names no host"]);
    }

    #[test]
    fn messages_hide_passwords() {
        assert_eq!(redacted("mysql://app:pw@db/x"), "mysql://app:***@db/x");
        assert_eq!(redacted("mysql://app@db/x"), "mysql://app@db/x");
        assert_eq!(
            redacted("redis-cluster://u:p@a:1,b:2"),
            "redis-cluster://u:***@a:1,b:2"
        );
        assert_eq!(
            redacted("x://h/p@q"),
            "x://h/p@q",
            "an @ in the path is no user"
        );
        assert_eq!(redacted("no scheme:pw@x"), "no scheme:pw@x");
        let err = StoreUrl::parse("redis-cluster://u:hunter2@").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = StoreUrl::parse("mongodb://u:hunter2@db").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn a_missing_feature_is_named() {
        let missing = Scheme::ALL.into_iter().filter(|s| !s.is_built());
        for scheme in missing {
            let url = format!("{}host", scheme.prefixes()[0]);
            let message = StoreUrl::parse(&url).unwrap_err().to_string();
            assert!(
                message.contains(&format!("cargo feature `{}`", scheme.feature())),
                "{message}"
            );
        }
        assert_eq!(Scheme::Sqlite.is_built(), cfg!(feature = "sqlite"));
        assert_eq!(Scheme::Postgres.is_built(), cfg!(feature = "postgres"));
        assert_eq!(Scheme::Redis.is_built(), cfg!(feature = "redis"));
        assert_eq!(Scheme::RedisCluster.is_built(), cfg!(feature = "redis"));
        assert_eq!(Scheme::DynamoDb.is_built(), cfg!(feature = "dynamodb"));
        assert_eq!(Scheme::Remote.is_built(), cfg!(feature = "remote"));
    }
}
