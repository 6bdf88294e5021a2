//! [`StoreAdmin`] for Redis: a `SCAN` of the store's prefix on every master, the state of each
//! batch of keys read in one pipelined round trip.

use async_trait::async_trait;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisError, Value};

use idem_core::store::support::{
    key_from_hex, live_records, live_uncertain, store_stats, Smallest,
};
use idem_core::{
    AbandonedQuery, Error, Key, ListQuery, ListState, Record, StoreAdmin, StoreStats,
    UncertainOperation,
};

use crate::store::{bytes, corrupt, int, store_error, time, Conn, Inner, RedisStore, RESPONSE};

/// How many keys each `SCAN` step asks for (a hint: the server may return more or fewer).
const SCAN_COUNT: usize = 1_000;

impl RedisStore {
    /// The version of the record layout this store writes (one hash per record, with the fields
    /// listed in `scripts.rs`), as [`StoreAdmin::schema_version`] reports it. Redis
    /// has no schema to migrate: the number changes only if a release changes that layout, and
    /// the release notes then say how to move.
    ///
    /// ```
    /// assert_eq!(idem::RedisStore::SCHEMA_VERSION, 1);
    /// ```
    pub const SCHEMA_VERSION: i64 = 1;
}

/// A master whose keys a scan reads: the one server, or a cluster primary by its address.
pub(super) enum Node {
    Single,
    Primary { host: String, port: u16 },
}

/// What a scan saw of one record.
struct Seen {
    key: Key,
    in_progress: bool,
    expires_ms: i64,
    /// It holds its key on its node's clock: a lease that runs, an uncertain claim (lapsed or
    /// not), a retention or a tombstone that has not ended.
    live: bool,
    /// An uncertain claim whose lease has ended, or a tombstone: live past its `expires_ms`.
    past_expiry: bool,
    /// An uncertain claim whose lease has ended.
    uncertain: bool,
    /// `MEMORY USAGE` of its key (and of its response's, kept apart with a tombstone), when
    /// asked and answered.
    bytes: Option<u64>,
}

/// A scan of the prefix, master after master, a batch of keys at a time.
struct Scan<'a> {
    inner: &'a Inner,
    /// Each master with its clock (epoch milliseconds) read when the scan began.
    nodes: Vec<(Node, i64)>,
    at: usize,
    cursor: u64,
    pattern: String,
    memory: bool,
}

impl Conn {
    /// `cmd` on `node`.
    pub(super) async fn query_on(&self, node: &Node, cmd: &Cmd) -> Result<Value, RedisError> {
        match (self, node) {
            (Conn::Cluster(p), Node::Primary { host, port }) => {
                let mut conn = p.pick().ok_or_else(crate::store::no_connection)?;
                conn.route_command(cmd.clone(), by_address(host, *port))
                    .await
            }
            _ => self.query(cmd).await,
        }
    }

    /// `pipe` on `node`, its replies in order (a command's error as a [`Value::ServerError`]).
    pub(super) async fn pipe_on(
        &self,
        node: &Node,
        pipe: &Pipeline,
    ) -> Result<Vec<Value>, RedisError> {
        match (self, node) {
            (Conn::Cluster(p), Node::Primary { host, port }) => {
                let mut conn = p.pick().ok_or_else(crate::store::no_connection)?;
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                conn.route_pipeline(pipe.clone(), 0, pipe.len(), route)
                    .await
            }
            _ => self.pipe(pipe).await,
        }
    }

    /// The masters, each with its clock: `TIME` on the server, or on every cluster primary at
    /// once (which also names them).
    pub(super) async fn masters(&self) -> Result<Vec<(Node, i64)>, Error> {
        let failed = |e| store_error("admin TIME", e);
        match self {
            Conn::Single(_) => {
                let now = self.query(&redis::cmd("TIME")).await.map_err(failed)?;
                Ok(vec![(Node::Single, clock(&now)?)])
            }
            Conn::Cluster(p) => {
                let mut conn = p
                    .pick()
                    .ok_or_else(crate::store::no_connection)
                    .map_err(failed)?;
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let answers = conn
                    .route_command(redis::cmd("TIME"), all)
                    .await
                    .map_err(failed)?;
                let Value::Map(answers) = answers else {
                    return Err(corrupt(format!(
                        "TIME on every master answered {answers:?}"
                    )));
                };
                let mut nodes = Vec::with_capacity(answers.len());
                for (address, now) in answers {
                    let address = bytes(&address)
                        .and_then(|a| std::str::from_utf8(a).ok())
                        .and_then(|a| a.rsplit_once(':'))
                        .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
                        .ok_or_else(|| corrupt(format!("a master's address is {address:?}")))?;
                    if let Value::ServerError(e) = now {
                        return Err(store_error("admin TIME", e.into()));
                    }
                    let (host, port) = address;
                    nodes.push((Node::Primary { host, port }, clock(&now)?));
                }
                Ok(nodes)
            }
        }
    }
}

fn by_address(host: &str, port: u16) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    })
}

/// Epoch milliseconds from a `TIME` reply.
fn clock(now: &Value) -> Result<i64, Error> {
    let part = |v: &Value| {
        bytes(v)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse::<i64>().ok())
    };
    match now {
        Value::Array(parts) => match parts.as_slice() {
            [secs, micros] => match (part(secs), part(micros)) {
                (Some(s), Some(us)) => Ok(s.saturating_mul(1000).saturating_add(us / 1000)),
                _ => Err(corrupt(format!("TIME answered {now:?}"))),
            },
            _ => Err(corrupt(format!("TIME answered {now:?}"))),
        },
        _ => Err(corrupt(format!("TIME answered {now:?}"))),
    }
}

impl<'a> Scan<'a> {
    async fn start(inner: &'a Inner, memory: bool) -> Result<Scan<'a>, Error> {
        Ok(Scan {
            nodes: inner.conn.masters().await?,
            inner,
            at: 0,
            cursor: 0,
            // The prefix holds no glob characters (the builder allows `A-Z a-z 0-9 _ - . :`).
            pattern: format!("{}:{{*}}", inner.prefix),
            memory,
        })
    }

    /// The next batch of records, or `None` once every master is done. A batch may be empty.
    async fn next(&mut self) -> Result<Option<Vec<Seen>>, Error> {
        let Some((node, now_ms)) = self.nodes.get(self.at) else {
            return Ok(None);
        };
        let conn = &self.inner.conn;
        let mut scan = redis::cmd("SCAN");
        scan.arg(self.cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let answer = conn
            .query_on(node, &scan)
            .await
            .map_err(|e| store_error("admin SCAN", e))?;
        let (cursor, keys) = match &answer {
            Value::Array(parts) => match parts.as_slice() {
                [cursor, Value::Array(keys)] => (
                    bytes(cursor)
                        .and_then(|c| std::str::from_utf8(c).ok())
                        .and_then(|c| c.parse::<u64>().ok()),
                    keys,
                ),
                _ => (None, &Vec::new()),
            },
            _ => (None, &Vec::new()),
        };
        let cursor = cursor.ok_or_else(|| corrupt(format!("SCAN answered {answer:?}")))?;
        let keys: Vec<(Key, &[u8])> = keys
            .iter()
            .filter_map(|k| {
                let name = bytes(k)?;
                let hex = std::str::from_utf8(name)
                    .ok()?
                    .strip_prefix(self.inner.prefix.as_str())?
                    .strip_prefix(":{")?
                    .strip_suffix('}')?;
                Some((key_from_hex(hex)?, name))
            })
            .collect();
        let seen = if keys.is_empty() {
            Vec::new()
        } else {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for (_, name) in &keys {
                pipe.cmd("HMGET")
                    .arg(*name)
                    .arg("s")
                    .arg("e")
                    .arg("u")
                    .arg("k");
                if self.memory {
                    pipe.cmd("MEMORY").arg("USAGE").arg(*name);
                    let mut response = name.to_vec();
                    response.extend_from_slice(RESPONSE.as_bytes());
                    pipe.cmd("MEMORY").arg("USAGE").arg(response);
                }
            }
            let replies = conn
                .pipe_on(node, &pipe)
                .await
                .map_err(|e| store_error("admin HMGET", e))?;
            let per_key = if self.memory { 3 } else { 1 };
            let mut seen = Vec::with_capacity(keys.len());
            for ((key, _), replies) in keys.iter().zip(replies.chunks(per_key)) {
                if let Some(record) = decode(*key, replies, *now_ms)? {
                    seen.push(record);
                }
            }
            seen
        };
        if cursor == 0 {
            self.at += 1;
        }
        self.cursor = cursor;
        Ok(Some(seen))
    }
}

/// One key's `HMGET s e u k` (and the two `MEMORY USAGE`s) replies; `None` when the key went
/// away since the `SCAN` saw it.
fn decode(key: Key, replies: &[Value], now_ms: i64) -> Result<Option<Seen>, Error> {
    let fields = match replies.first() {
        Some(Value::Array(fields)) => fields,
        Some(Value::ServerError(e)) => return Err(store_error("admin HMGET", e.clone().into())),
        other => return Err(corrupt(format!("HMGET of key {key} answered {other:?}"))),
    };
    let (state, expires, uncertain, kept) = match fields.as_slice() {
        [Value::Nil, Value::Nil, ..] => return Ok(None),
        [state, expires, uncertain, kept] => (
            bytes(state),
            bytes(expires),
            bytes(uncertain) == Some(b"1".as_slice()),
            bytes(kept),
        ),
        _ => return Err(corrupt(format!("HMGET of key {key} answered {fields:?}"))),
    };
    let in_progress = match state {
        Some(b"p") => true,
        Some(b"c") => false,
        _ => {
            return Err(corrupt(format!(
                "the stored state of key {key} is {state:?}"
            )))
        }
    };
    let expires_ms = expires
        .and_then(|e| std::str::from_utf8(e).ok())
        .and_then(|e| e.parse::<i64>().ok())
        .ok_or_else(|| corrupt(format!("the stored expiry of key {key} is {expires:?}")))?;
    let kept_ms = match kept {
        None => 0,
        Some(k) => std::str::from_utf8(k)
            .ok()
            .and_then(|k| k.parse::<i64>().ok())
            .ok_or_else(|| corrupt(format!("the stored tombstone of key {key} is {k:?}")))?
            .saturating_mul(1000),
    };
    let ended = expires_ms <= now_ms;
    let live = if in_progress {
        !ended || uncertain
    } else {
        expires_ms.saturating_add(kept_ms) > now_ms
    };
    let memory = |i: usize| {
        replies
            .get(i)
            .and_then(int)
            .and_then(|b| u64::try_from(b).ok())
    };
    Ok(Some(Seen {
        key,
        in_progress,
        expires_ms,
        live,
        past_expiry: live && ended,
        uncertain: in_progress && uncertain && ended,
        // A response kept apart that is gone (or never was) adds nothing.
        bytes: memory(1).map(|b| b.saturating_add(memory(2).unwrap_or(0))),
    }))
}

/// `StoreAdmin` over a `SCAN` of the prefix on every master (the server, or each cluster
/// primary), without loading the keyspace: each `SCAN` step returns about 1,000 keys and their
/// state is read with one pipelined `HMGET` per key, in one round trip per step, on the master
/// that holds them; a record counts as live by that master's clock, as
/// [`Store::get`](idem_core::Store::get) judges it.
///
/// | call | round trips | memory |
/// |---|---|---|
/// | `list(state, after, limit)` | 1 `TIME` (fanned out to every primary in a cluster), then 2 per `SCAN` step on each master (about one step per 1,000 keys of the prefix), then one `get` per record of the page | the `limit` smallest keys seen, plus one step's keys |
/// | `stats` | the same scan, with `MEMORY USAGE` of each key in the same pipeline | one step's keys |
/// | `schema_version` | 0: [`RedisStore::SCHEMA_VERSION`] | |
///
/// **Departures from the trait's contract, and why.** Redis keeps no index in key order: `list`
/// reads every key of the prefix to find the page (O(records) time and round trips for each page,
/// O(`limit`) memory); the page itself is in key order and continues exactly after `after`.
/// `SCAN` may return a key twice while the keyspace grows or shrinks (Redis rehashing): `list`
/// keeps each key once, but `stats` may count such a key twice, so its counts are exact only on a
/// keyspace that does not change size during the scan. `expired` counts records whose lease or
/// retention has ended and that Redis has not yet deleted (it deletes them itself, within
/// [`LAPSED_CLAIMS_KEPT`](idem_core::LAPSED_CLAIMS_KEPT) of the end for a claim, at once for a
/// completion when next touched or sampled); `table_bytes` is the sum of `MEMORY USAGE` over the
/// records' keys and their responses kept apart (`None` when the server refuses the command),
/// not the server's whole memory.
///
/// **Past the lease.** An uncertain claim (its lease ended with no completion) still holds its
/// key: `list` gives it under [`ListState::InProgress`] (read as
/// [`RecordState::Uncertain`](idem_core::RecordState::Uncertain)) and `stats` counts it in `in_progress`. A tombstone (a completion
/// past its retention, within its `key_retention`) is listed under [`ListState::Completed`]
/// (read as [`RecordState::Expired`](idem_core::RecordState::Expired)) and counted in `completed`. Neither counts as `expired`,
/// and neither takes part in `oldest_expiry`, whose end has passed: that is the earliest end
/// still to come of a running lease or a retention.
///
/// ```no_run
/// use idem::{ListQuery, ListState, RedisStore, StoreAdmin};
/// # async fn f() -> Result<(), idem::Error> {
/// let store = RedisStore::builder().prefix("payments").connect("redis://127.0.0.1:6379").await?;
/// let first_page = ListQuery { state: Some(ListState::InProgress), after: None, limit: 50 };
/// let running = store.list(first_page).await?;
/// let stats = store.stats().await?;
/// println!("{} running, {} completed", stats.in_progress, stats.completed);
/// # let _ = running; Ok(()) }
/// ```
#[async_trait]
impl StoreAdmin for RedisStore {
    async fn list(&self, query: ListQuery<'_>) -> Result<Vec<Record>, Error> {
        let mut page = Smallest::new(query.after, query.limit);
        if query.limit > 0 {
            let mut scan = Scan::start(&self.inner, false).await?;
            while let Some(batch) = scan.next().await? {
                for seen in batch {
                    let wanted = match query.state {
                        None => true,
                        Some(ListState::InProgress) => seen.in_progress,
                        Some(ListState::Completed) => !seen.in_progress,
                        // A state added to idem-core later: this store lists none of it.
                        Some(_) => false,
                    };
                    if seen.live && wanted {
                        page.offer(seen.key);
                    }
                }
            }
        }
        live_records(self, page.into_keys()).await
    }

    async fn stats(&self) -> Result<StoreStats, Error> {
        let (mut in_progress, mut completed, mut expired) = (0u64, 0u64, 0u64);
        let mut oldest: Option<i64> = None;
        let mut size = Some(0u64);
        let mut scan = Scan::start(&self.inner, true).await?;
        while let Some(batch) = scan.next().await? {
            for seen in batch {
                size = size.zip(seen.bytes).map(|(a, b)| a.saturating_add(b));
                if !seen.live {
                    expired += 1;
                    continue;
                }
                if seen.in_progress {
                    in_progress += 1;
                } else {
                    completed += 1;
                }
                if !seen.past_expiry {
                    oldest = Some(oldest.map_or(seen.expires_ms, |o| o.min(seen.expires_ms)));
                }
            }
        }
        Ok(store_stats(
            in_progress,
            completed,
            expired,
            oldest.map(time),
            size,
        ))
    }

    async fn schema_version(&self) -> Result<i64, Error> {
        Ok(RedisStore::SCHEMA_VERSION)
    }
}

impl RedisStore {
    /// [`Store::find_uncertain`](idem_core::Store::find_uncertain): the scan of `list` (every
    /// record of the prefix, on every master), keeping the `limit` smallest keys after `after`
    /// of uncertain claims whose lease had ended on their master's clock, then one `get` per
    /// key kept, so that each operation returned is uncertain when read (one that was resolved
    /// meanwhile is left out).
    pub(crate) async fn uncertain_page(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<UncertainOperation>, Error> {
        let mut page = Smallest::new(query.after, query.limit);
        if query.limit > 0 {
            let mut scan = Scan::start(&self.inner, false).await?;
            while let Some(batch) = scan.next().await? {
                for seen in batch.into_iter().filter(|seen| seen.uncertain) {
                    page.offer(seen.key);
                }
            }
        }
        live_uncertain(self, page.into_keys()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_replies_become_milliseconds() {
        let reply = Value::Array(vec![
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ]);
        assert_eq!(clock(&reply).ok(), Some(1_700_000_000_123));
        assert!(clock(&Value::Nil).is_err());
    }

    #[test]
    fn a_key_gone_since_the_scan_is_skipped() {
        let key = Key::from_bytes([1; 32]);
        let gone = [Value::Array(vec![Value::Nil; 4])];
        assert!(decode(key, &gone, 0).unwrap().is_none());
        let fields = |s: &[u8], e: &[u8], u: Option<&[u8]>, k: Option<&[u8]>| {
            let field = |v: Option<&[u8]>| v.map_or(Value::Nil, |v| Value::BulkString(v.to_vec()));
            Value::Array(vec![field(Some(s)), field(Some(e)), field(u), field(k)])
        };
        let running = [
            fields(b"p", b"2000", None, None),
            Value::Int(72),
            Value::Nil,
        ];
        let seen = decode(key, &running, 1000).unwrap().unwrap();
        assert!(seen.in_progress && seen.live && seen.bytes == Some(72));
        assert!(!decode(key, &running, 2000).unwrap().unwrap().live);
        // An uncertain claim holds its key once lapsed; a tombstone until it ends.
        let uncertain = [fields(b"p", b"2000", Some(b"1"), None)];
        let seen = decode(key, &uncertain, 3000).unwrap().unwrap();
        assert!(seen.live && seen.uncertain && seen.past_expiry);
        assert!(!decode(key, &uncertain, 1000).unwrap().unwrap().uncertain);
        let tombstone = [
            fields(b"c", b"2000", None, Some(b"2")),
            Value::Int(80),
            Value::Int(60),
        ];
        let seen = decode(key, &tombstone, 3000).unwrap().unwrap();
        assert!(seen.live && seen.past_expiry && !seen.uncertain && seen.bytes == Some(140));
        assert!(!decode(key, &tombstone, 4000).unwrap().unwrap().live);
        let odd = [fields(b"z", b"1", None, None)];
        assert!(decode(key, &odd, 0).is_err());
    }
}
