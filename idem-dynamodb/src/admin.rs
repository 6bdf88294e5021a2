//! [`StoreAdmin`] for DynamoDB: paginated `Scan`s of the table, projected to the few attributes
//! each call needs.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::scan::builders::ScanFluentBuilder;
use aws_sdk_dynamodb::types::AttributeValue;

use idem_core::store::support::{
    key_from_hex, live_records, live_uncertain, store_stats, Smallest,
};
use idem_core::{
    AbandonedQuery, Error, Key, ListQuery, ListState, Record, StoreAdmin, StoreError,
    StoreErrorKind, StoreStats, UncertainOperation,
};

use crate::item::{number, time_of, EXPIRES, IN_PROGRESS, PK, RETAINED, STATE, UNCERTAIN};
use crate::store::{DynamoStore, Inner};

/// A live record: it holds its key for a node within the clock-skew margin (`:cutoff` is now
/// minus the margin), as [`Store::get`](idem_core::Store::get) judges it: its lease, retention
/// or tombstone has not ended, or it is an uncertain claim.
const LIVE: &str = "(expires_ms > :cutoff OR attribute_exists(uncertain))";

/// An uncertain claim whose lease has ended for every node within the margin.
const UNCERTAIN_LAPSED: &str =
    "state_n = :in_progress AND attribute_exists(uncertain) AND expires_ms <= :cutoff";

impl DynamoStore {
    /// The version of the item layout this store writes (the attributes in the
    /// [store's docs](DynamoStore#item)), as [`StoreAdmin::schema_version`] reports it. The table
    /// has no schema to migrate beyond its key: the number changes only if a release changes
    /// that layout, and the release notes then say how to move.
    ///
    /// ```
    /// assert_eq!(idem::DynamoStore::SCHEMA_VERSION, 1);
    /// ```
    pub const SCHEMA_VERSION: i64 = 1;
}

pub(crate) type Attrs = HashMap<String, AttributeValue>;

impl Inner {
    /// Every record of the table that passes `filter`, projected to `projection`, page by
    /// page ([`scan_pages`](Self::scan_pages)).
    async fn scan_all(
        &self,
        filter: Option<&str>,
        projection: &str,
        values: HashMap<String, AttributeValue>,
        visit: impl FnMut(Vec<Attrs>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let filter = records_only(filter);
        let values = (!values.is_empty()).then_some(values);
        self.scan_pages(
            |scan| {
                scan.filter_expression(&filter)
                    .projection_expression(projection)
                    .set_expression_attribute_values(values.clone())
            },
            visit,
        )
        .await
    }

    /// A consistent `Scan` of the whole table, `query` adding its filter, names and values:
    /// `visit` sees each page's items and drops them before the next page is read. For the
    /// admin calls and [`find_abandoned`](idem_core::Store::find_abandoned).
    pub(crate) async fn scan_pages(
        &self,
        query: impl Fn(ScanFluentBuilder) -> ScanFluentBuilder,
        mut visit: impl FnMut(Vec<Attrs>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut start = None;
        loop {
            let scan = self.client.scan().table_name(&self.table);
            let page = query(scan)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.error("Scan", e))?;
            visit(page.items.unwrap_or_default())?;
            match page.last_evaluated_key {
                Some(next) if !next.is_empty() => start = Some(next),
                _ => return Ok(()),
            }
        }
    }

    fn cutoff_ms(&self) -> i64 {
        self.now_ms().saturating_sub(self.margin_ms)
    }
}

/// An item the store did not write in its layout.
fn malformed(pk: Option<&AttributeValue>, what: &str) -> Error {
    Error::Store(StoreError::new(
        StoreErrorKind::Corrupt,
        format!(
            "the DynamoDB item {pk:?} is malformed ({what}); evict the key, or check that nothing \
             else writes to this table"
        ),
    ))
}

fn key_of(item: &Attrs) -> Result<Key, Error> {
    match item.get(PK) {
        Some(AttributeValue::S(hex)) => key_from_hex(hex),
        _ => None,
    }
    .ok_or_else(|| malformed(item.get(PK), "its key is not 64 hex digits"))
}

fn number_of(item: &Attrs, name: &str) -> Result<i64, Error> {
    match item.get(name) {
        Some(AttributeValue::N(n)) => n.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| malformed(item.get(PK), &format!("`{name}` is not an integer")))
}

/// `StoreAdmin` over paginated `Scan`s of the table (DynamoDB has no index in key order, and the
/// store adds none), each page dropped before the next is read.
///
/// | call | requests | memory |
/// |---|---|---|
/// | `list(state, after, limit)` | one `Scan` page per 1 MB of the table, filtered on the server to live records of the state after `after` and projected to the key; then one consistent `GetItem` per record of the page | the `limit` smallest keys, plus one page of keys |
/// | `stats` | one `Scan` page per 1 MB of the table, projected to state and expiry; one `DescribeTable` for the size | one page |
/// | `schema_version` | 0: [`DynamoStore::SCHEMA_VERSION`] | |
///
/// The scans read with `ConsistentRead=true`, and DynamoDB bills a `Scan` for every item it
/// reads, whatever the filter and the projection: each `list` page and each `stats` costs a
/// read of the whole table (about one read capacity unit per 2 KB). These are tools for an
/// operator, not for a service's hot path.
///
/// **Departures from the trait's contract, and why.** `list` reads the whole table to find each
/// page (O(items) requests and capacity, O(`limit`) memory); the page itself is in key order
/// (the keys' hex digits sort as their bytes) and continues exactly after `after`. A record
/// counts as live until its expiry plus the [clock-skew margin](DynamoStore#time-and-clock-skew),
/// as `get` does; `expired` counts the items past that which neither DynamoDB's TTL nor
/// [`prune_expired`](idem_core::Store::prune_expired) has deleted yet. `table_bytes` is DynamoDB's
/// `TableSizeBytes`, which it updates about every six hours (an emulator may report 0).
///
/// **Past the lease.** An uncertain claim (its lease ended with no completion) still holds its
/// key: `list` gives it under [`ListState::InProgress`] (read as [`RecordState::Uncertain`](idem_core::RecordState::Uncertain)) and
/// `stats` counts it in `in_progress`. A tombstone (a completion past its retention, within its
/// `key_retention`, its response dropped by `prune_expired` or not yet) is listed under
/// [`ListState::Completed`] (read as [`RecordState::Expired`](idem_core::RecordState::Expired)) and counted in `completed`.
/// Neither counts as `expired`, and neither takes part in `oldest_expiry`, whose end has passed:
/// that is the earliest end still to come of a running lease or a retention.
///
/// ```no_run
/// use idem::{DynamoStore, ListQuery, ListState, StoreAdmin};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
/// # let client: idem::aws_sdk_dynamodb::Client = unimplemented!();
/// let store = DynamoStore::builder().table("idem_records").build(client).await?;
/// let first_page = ListQuery { state: Some(ListState::InProgress), after: None, limit: 50 };
/// let running = store.list(first_page).await?;
/// let stats = store.stats().await?;
/// println!("{} running, {} completed", stats.in_progress, stats.completed);
/// # let _ = running; Ok(()) }
/// ```
#[async_trait]
impl StoreAdmin for DynamoStore {
    async fn list(&self, query: ListQuery<'_>) -> Result<Vec<Record>, Error> {
        let s = &*self.inner;
        let mut page = Smallest::new(query.after, query.limit);
        if query.limit > 0 {
            let mut filter = LIVE.to_owned();
            let mut values = HashMap::from([(":cutoff".to_owned(), number(s.cutoff_ms()))]);
            match query.state {
                None => {}
                Some(ListState::InProgress) => {
                    filter.push_str(" AND state_n = :running");
                    values.insert(":running".to_owned(), number(0));
                }
                // Tombstones too, stripped of their response or not.
                Some(ListState::Completed) => {
                    filter.push_str(" AND state_n <> :running");
                    values.insert(":running".to_owned(), number(0));
                }
                // A state added to idem-core later: this store lists none of it.
                Some(_) => return Ok(Vec::new()),
            }
            if let Some(after) = query.after {
                filter.push_str(" AND pk > :after");
                values.insert(":after".to_owned(), AttributeValue::S(after.to_string()));
            }
            s.scan_all(Some(&filter), PK, values, |items| {
                for item in &items {
                    page.offer(key_of(item)?);
                }
                Ok(())
            })
            .await?;
        }
        live_records(self, page.into_keys()).await
    }

    async fn stats(&self) -> Result<StoreStats, Error> {
        let s = &*self.inner;
        let cutoff = s.cutoff_ms();
        let (mut in_progress, mut completed, mut expired) = (0u64, 0u64, 0u64);
        let mut oldest: Option<i64> = None;
        let projection = format!("{PK}, {STATE}, {EXPIRES}, {UNCERTAIN}, {RETAINED}");
        s.scan_all(None, &projection, HashMap::new(), |items| {
            for item in &items {
                let expires_ms = number_of(item, EXPIRES)?;
                let state = number_of(item, STATE)?;
                let uncertain = matches!(item.get(UNCERTAIN), Some(AttributeValue::Bool(true)));
                if expires_ms <= cutoff && !(state == 0 && uncertain) {
                    expired += 1;
                    continue;
                }
                // The end still to come of a lease or a retention, if any: not an uncertain
                // claim's, nor a tombstone's.
                let ends = match state {
                    0 => {
                        in_progress += 1;
                        Some(expires_ms).filter(|e| *e > cutoff)
                    }
                    1 | 2 => {
                        completed += 1;
                        let retention = match item.get(RETAINED) {
                            Some(_) => number_of(item, RETAINED)?,
                            None => expires_ms,
                        };
                        Some(retention).filter(|e| state == 1 && *e > cutoff)
                    }
                    _ => return Err(malformed(item.get(PK), "its state is not 0, 1 or 2")),
                };
                if let Some(end) = ends {
                    oldest = Some(oldest.map_or(end, |o| o.min(end)));
                }
            }
            Ok(())
        })
        .await?;
        let described = s
            .client
            .describe_table()
            .table_name(&s.table)
            .send()
            .await
            .map_err(|e| s.error("DescribeTable", e))?;
        let table_bytes = described
            .table()
            .and_then(|t| t.table_size_bytes())
            .and_then(|b| u64::try_from(b).ok());
        Ok(store_stats(
            in_progress,
            completed,
            expired,
            oldest.map(time_of),
            table_bytes,
        ))
    }

    async fn schema_version(&self) -> Result<i64, Error> {
        Ok(DynamoStore::SCHEMA_VERSION)
    }
}

impl DynamoStore {
    /// [`Store::find_uncertain`](idem_core::Store::find_uncertain): a `Scan` of the whole table
    /// as `list`'s, filtered on the server to uncertain claims whose lease ended (for every node
    /// within the margin) after `after`, keeping the `limit` smallest keys, then one consistent
    /// `GetItem` per key kept, so that each operation returned is uncertain when read (one
    /// resolved meanwhile is left out).
    pub(crate) async fn uncertain_page(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<UncertainOperation>, Error> {
        let s = &*self.inner;
        let mut page = Smallest::new(query.after, query.limit);
        if query.limit > 0 {
            let mut filter = UNCERTAIN_LAPSED.to_owned();
            let mut values = HashMap::from([
                (":cutoff".to_owned(), number(s.cutoff_ms())),
                (
                    ":in_progress".to_owned(),
                    AttributeValue::N(IN_PROGRESS.to_owned()),
                ),
            ]);
            if let Some(after) = query.after {
                filter.push_str(" AND pk > :after");
                values.insert(":after".to_owned(), AttributeValue::S(after.to_string()));
            }
            s.scan_all(Some(&filter), PK, values, |items| {
                for item in &items {
                    page.offer(key_of(item)?);
                }
                Ok(())
            })
            .await?;
        }
        live_uncertain(self, page.into_keys()).await
    }
}

/// `filter`, for records only: the steps items beside them (`steps.rs`) carry no
/// state. A filter in parentheses already is not put in more: DynamoDB refuses an expression
/// with redundant parentheses.
fn records_only(filter: Option<&str>) -> String {
    match filter {
        Some(filter) if parenthesized(filter) => {
            format!("{filter} AND attribute_exists({STATE})")
        }
        Some(filter) => format!("({filter}) AND attribute_exists({STATE})"),
        None => format!("attribute_exists({STATE})"),
    }
}

/// Whether `expression` is one group in parentheses, from its first character to its last.
fn parenthesized(expression: &str) -> bool {
    let mut depth = 0usize;
    for (i, c) in expression.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 && i + 1 < expression.len() {
                    return false;
                }
            }
            _ if depth == 0 => return false,
            _ => {}
        }
    }
    depth == 0 && expression.starts_with('(')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filter is parenthesized once: DynamoDB refuses `((a OR b)) AND c`.
    #[test]
    fn filters_get_one_pair_of_parentheses() {
        assert_eq!(
            records_only(Some(LIVE)),
            format!("{LIVE} AND attribute_exists({STATE})")
        );
        let both = format!("{LIVE} AND state_n = :running");
        assert_eq!(
            records_only(Some(&both)),
            format!("({both}) AND attribute_exists({STATE})")
        );
        assert!(!parenthesized("(a) AND (b)"));
        assert!(parenthesized("((a) AND (b))"));
    }

    #[test]
    fn items_decode_or_are_named_malformed() {
        let key = Key::from_bytes([0xab; 32]);
        let mut item = Attrs::new();
        item.insert(PK.to_owned(), AttributeValue::S(key.to_string()));
        item.insert(EXPIRES.to_owned(), AttributeValue::N("42".into()));
        assert_eq!(key_of(&item).ok(), Some(key));
        assert_eq!(number_of(&item, EXPIRES).ok(), Some(42));
        let Err(Error::Store(e)) = number_of(&item, STATE) else {
            panic!("a missing state is malformed");
        };
        assert_eq!(e.kind(), StoreErrorKind::Corrupt);
        item.insert(PK.to_owned(), AttributeValue::S("xyz".into()));
        assert!(key_of(&item).is_err());
    }
}
