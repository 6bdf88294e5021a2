//! The store named by `--url`: its scheme, how it is opened, and what the commands say about it.
//!
//! | URL | store | `--table` names |
//! |---|---|---|
//! | `sqlite://PATH` | SQLite (the file must exist) | the table (default `idem_records`) |
//! | `postgres://…`, `postgresql://…` | PostgreSQL | the table, `schema.table` allowed (default `idem_records`) |
//! | `redis://[USER:PASSWORD@]HOST:PORT[/DB]` | Redis or Valkey, one server | the key prefix (default `idem`) |
//! | `redis-cluster://[USER:PASSWORD@]HOST:PORT,HOST:PORT,…` | a Redis Cluster, from any of its nodes | the key prefix (default `idem`) |
//! | `dynamodb://HOST:PORT`, `dynamodb+http://HOST:PORT` | DynamoDB at the endpoint `http://HOST:PORT` (a local emulator) | the table (default `idem_records`) |
//! | `dynamodb+https://HOST[:PORT]` | DynamoDB at `https://HOST[:PORT]` | the table |
//!
//! The schemes are those of `idem-stress` (`idem-stress/src/stores.rs`).

use std::time::Duration;

use idem::{PostgresStore, SqliteStore, Store, StoreAdmin};

use crate::Failure;

/// A store URL, parsed.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreUrl {
    Sqlite(String),
    Postgres(String),
    /// One Redis server, its URL as the redis crate takes it.
    Redis(String),
    /// A Redis Cluster: a `redis://` URL for each node given.
    RedisCluster(Vec<String>),
    /// A DynamoDB endpoint (`http://…` or `https://…`).
    Dynamo(String),
}

impl StoreUrl {
    /// Parses `url`; an unknown scheme is a usage error that lists the known ones.
    pub fn parse(url: &str) -> Result<StoreUrl, Failure> {
        if url.starts_with("sqlite:") {
            Ok(StoreUrl::Sqlite(url.to_owned()))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(StoreUrl::Postgres(url.to_owned()))
        } else if url.starts_with("redis://") {
            Ok(StoreUrl::Redis(url.to_owned()))
        } else if let Some(rest) = url.strip_prefix("redis-cluster://") {
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
                return Err(Failure::Usage(format!(
                    "{url:?} names no node: use redis-cluster://HOST:PORT,HOST:PORT,…"
                )));
            }
            Ok(StoreUrl::RedisCluster(nodes))
        } else if let Some(rest) = url.strip_prefix("dynamodb+https://") {
            Ok(StoreUrl::Dynamo(format!("https://{rest}")))
        } else if let Some(rest) = url
            .strip_prefix("dynamodb+http://")
            .or_else(|| url.strip_prefix("dynamodb://"))
        {
            Ok(StoreUrl::Dynamo(format!("http://{rest}")))
        } else {
            Err(Failure::Usage(format!(
                "unsupported store URL {url:?}: use sqlite://PATH, postgres://USER@HOST/DB, \
                 redis://HOST:PORT, redis-cluster://HOST:PORT,HOST:PORT,…, dynamodb://HOST:PORT \
                 or dynamodb+https://HOST"
            )))
        }
    }

    /// What `--table` defaults to: the store's own default table or prefix.
    pub fn default_table(&self) -> &'static str {
        match self {
            StoreUrl::Redis(_) | StoreUrl::RedisCluster(_) => "idem",
            _ => "idem_records",
        }
    }
}

/// An open store.
pub enum Opened {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
    #[cfg(feature = "redis")]
    Redis(idem::RedisStore),
    #[cfg(feature = "dynamodb")]
    Dynamo {
        store: idem::DynamoStore,
        /// Whether opening it created its table (`migrate` only).
        created: bool,
    },
}

/// Where `migrate` and `prune` differ between stores.
pub enum Upkeep {
    /// Migrations applied on open; `prune` deletes expired rows.
    Sql,
    /// Nothing to migrate; the server deletes ended records itself.
    #[cfg(feature = "redis")]
    Redis,
    /// The table created if missing (by `migrate`); `prune` scans and deletes, and DynamoDB's
    /// TTL deletes too, in its own time.
    #[cfg(feature = "dynamodb")]
    Dynamo { created: bool, table: String },
}

impl Opened {
    /// Opens the store at `url` with its records under `table` (a table, or Redis's key prefix).
    /// With `create`, a missing DynamoDB table is created; every other command leaves a
    /// misspelled table an error rather than a new table.
    #[cfg_attr(not(feature = "dynamodb"), allow(unused_variables))]
    pub async fn open(url: &str, table: &str, create: bool) -> Result<Opened, Failure> {
        match StoreUrl::parse(url)? {
            StoreUrl::Sqlite(url) => {
                let rest = url.trim_start_matches("sqlite:");
                let path = rest.trim_start_matches("//");
                let (path, query) = path.split_once('?').unwrap_or((path, ""));
                let creates = query.split('&').any(|p| p == "mode=rwc");
                if !creates && !path.starts_with(':') && !std::path::Path::new(path).exists() {
                    return Err(Failure::Usage(format!("no SQLite database at {path:?}")));
                }
                // A command runs once and reports what it did: no pruner deleting behind it
                // (`prune` is the command for that).
                let store = SqliteStore::builder()
                    .table(table)
                    .pruner(None)
                    .connect(&url)
                    .await?;
                Ok(Opened::Sqlite(store))
            }
            StoreUrl::Postgres(url) => {
                // One connection first: its error says why (refused, bad password, no
                // database), where the pool would only report a timeout.
                use idem::sqlx::Connection;
                let probe = idem::sqlx::PgConnection::connect(&url)
                    .await
                    .map_err(|e| Failure::Usage(format!("cannot connect to PostgreSQL: {e}")))?;
                let _ = probe.close().await;
                // As for SQLite: no background pruner in a command that runs once.
                let store = PostgresStore::builder()
                    .table(table)
                    .pruner(None)
                    .connect(&url)
                    .await?;
                Ok(Opened::Postgres(store))
            }
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => Ok(Opened::Redis(
                idem::RedisStore::builder()
                    .prefix(table)
                    .connect(&url)
                    .await?,
            )),
            #[cfg(feature = "redis")]
            StoreUrl::RedisCluster(nodes) => Ok(Opened::Redis(
                idem::RedisStore::builder()
                    .prefix(table)
                    .connect_cluster(&nodes)
                    .await?,
            )),
            #[cfg(feature = "dynamodb")]
            StoreUrl::Dynamo(endpoint) => dynamo::open(&endpoint, table, create).await,
            #[allow(unreachable_patterns)]
            _ => Err(Failure::Usage(format!(
                "this idem was built without the store of {url:?} (cargo features `redis`, \
                 `dynamodb`)"
            ))),
        }
    }

    pub fn store(&self) -> &dyn Store {
        match self {
            Opened::Sqlite(s) => s,
            Opened::Postgres(s) => s,
            #[cfg(feature = "redis")]
            Opened::Redis(s) => s,
            #[cfg(feature = "dynamodb")]
            Opened::Dynamo { store, .. } => store,
        }
    }

    pub fn admin(&self) -> &dyn StoreAdmin {
        match self {
            Opened::Sqlite(s) => s,
            Opened::Postgres(s) => s,
            #[cfg(feature = "redis")]
            Opened::Redis(s) => s,
            #[cfg(feature = "dynamodb")]
            Opened::Dynamo { store, .. } => store,
        }
    }

    pub fn upkeep(&self) -> Upkeep {
        match self {
            Opened::Sqlite(_) | Opened::Postgres(_) => Upkeep::Sql,
            #[cfg(feature = "redis")]
            Opened::Redis(_) => Upkeep::Redis,
            #[cfg(feature = "dynamodb")]
            Opened::Dynamo { store, created } => Upkeep::Dynamo {
                created: *created,
                table: store.table().to_owned(),
            },
        }
    }

    /// Whether the last `prune_expired` stopped before the end of what it scans, so a call
    /// that deleted less than its batch is not yet the end (DynamoDB's examination budget).
    pub fn prune_unfinished(&self) -> bool {
        match self {
            #[cfg(feature = "dynamodb")]
            Opened::Dynamo { store, .. } => store.prune_scan_unfinished(),
            _ => false,
        }
    }

    /// The `stats` labels of the expired count and of the size, as each store means them.
    pub fn stats_labels(&self) -> (&'static str, &'static str) {
        match self.upkeep() {
            Upkeep::Sql => ("expired (to prune)", "table size"),
            #[cfg(feature = "redis")]
            Upkeep::Redis => ("ended (Redis deletes them)", "memory of the records"),
            #[cfg(feature = "dynamodb")]
            Upkeep::Dynamo { .. } => (
                "expired (to prune, or TTL)",
                "table size (DynamoDB's, up to 6 h old)",
            ),
        }
    }
}

/// How long a store gets to answer before the command gives up.
pub const OPEN_WITHIN: Duration = Duration::from_secs(30);

#[cfg(feature = "dynamodb")]
mod dynamo {
    //! DynamoDB: the client from the environment, and the table.

    use idem::DynamoStore;

    use super::Opened;
    use crate::Failure;

    pub async fn open(endpoint: &str, table: &str, create: bool) -> Result<Opened, Failure> {
        // Credentials and region from the environment: `DynamoStore::client_from_env`.
        let client =
            DynamoStore::client_from_env(endpoint).map_err(|e| Failure::Usage(e.to_string()))?;
        let described = client.describe_table().table_name(table).send().await;
        let missing = matches!(&described, Err(e) if e
            .as_service_error()
            .is_some_and(|e| e.is_resource_not_found_exception()));
        // Any other failure: the builder's own check below reports it.
        let created = missing && create;
        if created {
            DynamoStore::create_table(&client, table).await?;
        } else if missing {
            return Err(Failure::Usage(format!(
                "no DynamoDB table {table:?} at {endpoint}: check --table (and AWS_REGION), or \
                 create it with `idem migrate`"
            )));
        }
        let store = DynamoStore::builder().table(table).build(client).await?;
        Ok(Opened::Dynamo { store, created })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_store() {
        let parse = |url: &str| StoreUrl::parse(url).ok();
        assert_eq!(
            parse("redis://127.0.0.1:6379"),
            Some(StoreUrl::Redis("redis://127.0.0.1:6379".into()))
        );
        assert_eq!(
            parse("redis-cluster://a:7000,b:7001"),
            Some(StoreUrl::RedisCluster(vec![
                "redis://a:7000".into(),
                "redis://b:7001".into()
            ]))
        );
        assert_eq!(
            parse("redis-cluster://u:p@a:7000,b:7001"),
            Some(StoreUrl::RedisCluster(vec![
                "redis://u:p@a:7000".into(),
                "redis://u:p@b:7001".into()
            ]))
        );
        assert_eq!(parse("redis-cluster://"), None);
        assert_eq!(
            parse("dynamodb://127.0.0.1:8000"),
            Some(StoreUrl::Dynamo("http://127.0.0.1:8000".into()))
        );
        assert_eq!(
            parse("dynamodb+http://h:8000"),
            Some(StoreUrl::Dynamo("http://h:8000".into()))
        );
        assert_eq!(
            parse("dynamodb+https://dynamodb.eu-west-1.amazonaws.com"),
            Some(StoreUrl::Dynamo(
                "https://dynamodb.eu-west-1.amazonaws.com".into()
            ))
        );
        assert_eq!(parse("mysql://x"), None);
        assert_eq!(
            StoreUrl::Redis(String::new()).default_table(),
            "idem",
            "Redis's own default prefix"
        );
    }
}
