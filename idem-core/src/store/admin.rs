//! What an operator reads of a store: records by state, page by page, and counts. The `idem`
//! command is built on this. The SQL stores answer with a statement each (idem-core's
//! `sql/admin.rs`); the Redis and DynamoDB stores scan (idem-redis's and idem-dynamodb's `admin.rs`), on `scan` below (`idem::store::support` to them).

use std::time::SystemTime;

use async_trait::async_trait;

use crate::error::Error;
use crate::key::Key;
use crate::record::Record;
use crate::store::Store;

/// Which records [`StoreAdmin::list`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListState {
    /// Records whose work is running.
    InProgress,
    /// Completed records.
    Completed,
}

/// Which records [`StoreAdmin::list`] returns: up to `limit` live records of one state (or of
/// any), in key order, starting after `after`.
///
/// ```
/// use idem::{ListQuery, ListState};
///
/// let first_page = ListQuery { state: Some(ListState::InProgress), after: None, limit: 50 };
/// assert_eq!(first_page.after, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListQuery<'a> {
    /// Records of this state only; `None` for records of any state.
    pub state: Option<ListState>,
    /// The last key of the previous page; `None` for the first page.
    pub after: Option<&'a Key>,
    /// The most records a page holds.
    pub limit: u32,
}

/// Counts of a store's records, from [`StoreAdmin::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Live records whose work is running.
    pub in_progress: u64,
    /// Live completed records.
    pub completed: u64,
    /// Records whose lease or retention has ended, not yet pruned.
    pub expired: u64,
    /// The earliest end of lease or retention among the live records.
    pub oldest_expiry: Option<SystemTime>,
    /// The store's size in bytes, when it tells: the table with its indexes on disk (SQL), the
    /// memory of the records' keys (Redis, `MEMORY USAGE`), the table's size as DynamoDB last
    /// measured it (about every six hours).
    pub table_bytes: Option<u64>,
}

/// A [`StoreStats`] of a store of another crate, which cannot build the `#[non_exhaustive]`
/// struct itself: its fields in order (`idem::store::support`; a field added later is a new
/// argument here).
pub fn store_stats(
    in_progress: u64,
    completed: u64,
    expired: u64,
    oldest_expiry: Option<SystemTime>,
    table_bytes: Option<u64>,
) -> StoreStats {
    StoreStats {
        in_progress,
        completed,
        expired,
        oldest_expiry,
        table_bytes,
    }
}

/// Reading a store as an operator does (the `idem` command's `list`, `stats` and `migrate`).
/// Implemented by `SqliteStore` and
/// `PostgresStore` with one statement per call, and by
/// `RedisStore` (idem-redis) and `DynamoStore` (idem-dynamodb) with a scan of the
/// whole prefix or table (each documents its round trips, and what it keeps of the order).
///
/// ```
/// use idem::{Error, StoreAdmin};
///
/// /// One line for a dashboard: how many keys are running, and how many replay.
/// async fn summary(store: &dyn StoreAdmin) -> Result<String, Error> {
///     let stats = store.stats().await?;
///     Ok(format!("{} running, {} completed", stats.in_progress, stats.completed))
/// }
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// # use idem::{Idempotency, Key, SqliteStore};
/// # let store = SqliteStore::open(":memory:").await?;
/// # Idempotency::new(store.clone()).call(Key::derive("s", "", "k")?).run(async { Ok::<_, Error>(1) }).await?;
/// # assert_eq!(summary(&store).await?, "0 running, 1 completed");
/// # let all = idem::ListQuery { state: None, after: None, limit: 10 };
/// # assert_eq!(store.list(all).await?.len(), 1);
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))] fn main() {}
/// ```
#[async_trait]
pub trait StoreAdmin: Store {
    /// Up to `query.limit` live records (of one state, or all), in key order, starting after
    /// `query.after` (the last key of the previous page). SQL: one statement for the keys, one
    /// read per record.
    async fn list(&self, query: ListQuery<'_>) -> Result<Vec<Record>, Error>;

    /// Counts by state, the oldest expiry, and the store's size. SQL: one statement (two on
    /// PostgreSQL, for the size).
    async fn stats(&self) -> Result<StoreStats, Error>;

    /// The highest schema version applied to the records table (SQL), or the version of the
    /// record layout the store writes (Redis, DynamoDB: a constant, no migrations).
    async fn schema_version(&self) -> Result<i64, Error>;
}

pub(crate) mod scan {
    //! What the scanning stores (Redis, DynamoDB) share: the page kept of a scan, the reads of
    //! its records, and the key's hex form.

    use std::collections::BTreeSet;

    use crate::error::Error;
    use crate::key::Key;
    use crate::record::Record;
    use crate::store::Store;

    /// The `limit` smallest keys after `after` among those a scan offers, in order: what the scanning
    /// stores keep of a listing (memory for `limit` keys, whatever the number of records; a key
    /// offered twice counts once).
    pub struct Smallest {
        keys: BTreeSet<Key>,
        after: Option<Key>,
        limit: usize,
    }

    impl Smallest {
        /// An empty page of at most `limit` keys, all greater than `after` (when given).
        pub fn new(after: Option<&Key>, limit: u32) -> Smallest {
            Smallest {
                keys: BTreeSet::new(),
                after: after.copied(),
                limit: usize::try_from(limit).unwrap_or(usize::MAX),
            }
        }

        /// Keeps `key` if it belongs on the page: after the cursor, not kept already, and
        /// smaller than the largest kept when the page is full (which it then replaces).
        pub fn offer(&mut self, key: Key) {
            if self.limit == 0 || self.after.is_some_and(|a| key <= a) || self.keys.contains(&key) {
                return;
            }
            if self.keys.len() == self.limit {
                match self.keys.last() {
                    Some(largest) if key < *largest => {
                        self.keys.pop_last();
                    }
                    _ => return,
                }
            }
            self.keys.insert(key);
        }

        /// The keys kept, smallest first.
        pub fn into_keys(self) -> impl Iterator<Item = Key> {
            self.keys.into_iter()
        }
    }

    /// The live records of `keys` (read one by one with [`Store::get`]), skipping any that ended or
    /// went away since the scan saw them.
    pub async fn live_records(
        store: &dyn Store,
        keys: impl Iterator<Item = Key>,
    ) -> Result<Vec<Record>, Error> {
        let mut out = Vec::new();
        for key in keys {
            if let Some(record) = store.get(&key).await? {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// The uncertain operations among the live records of `keys` (read as
    /// [`live_records`] reads them), for a scanning store's
    /// [`find_uncertain`](crate::Store::find_uncertain): a scan finds the candidates, and each
    /// is read again so that one resolved since the scan saw it is left out.
    pub async fn live_uncertain(
        store: &dyn Store,
        keys: impl Iterator<Item = Key>,
    ) -> Result<Vec<crate::record::UncertainOperation>, Error> {
        Ok(live_records(store, keys)
            .await?
            .into_iter()
            .filter_map(|record| match record.state {
                crate::record::RecordState::Uncertain { token, since } => {
                    Some(crate::record::UncertainOperation {
                        key: record.key,
                        token,
                        since,
                    })
                }
                _ => None,
            })
            .collect())
    }

    /// A key from the 64 lowercase hex digits the scanning stores write it as.
    pub fn key_from_hex(hex: &str) -> Option<Key> {
        let hex = hex.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
            *byte = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(Key::from_bytes(bytes))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        #[test]
        fn smallest_keeps_the_limit_smallest_after_the_cursor() {
            let k = |b: u8| Key::from_bytes([b; 32]);
            let mut page = Smallest::new(Some(&k(2)), 3);
            for b in [9, 1, 7, 2, 5, 3, 5, 8] {
                page.offer(k(b));
            }
            assert_eq!(page.into_keys().collect::<Vec<_>>(), [k(3), k(5), k(7)]);
            let mut none = Smallest::new(None, 0);
            none.offer(k(1));
            assert_eq!(none.into_keys().count(), 0);
        }

        #[test]
        fn keys_round_trip_through_hex() {
            let key = Key::derive("s", "c", "k").unwrap();
            assert_eq!(key_from_hex(&key.to_string()), Some(key));
            assert_eq!(key_from_hex("ab"), None);
            assert_eq!(key_from_hex(&"G".repeat(64)), None);
        }
    }
}
