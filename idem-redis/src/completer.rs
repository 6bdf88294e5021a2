//! [`Store::find_abandoned`](idem_core::Store::find_abandoned) for Redis: a `SCAN` of the steps
//! hashes (`<prefix>:{<key>}:steps`) on every master, each batch judged by one pipelined script
//! per hash, the smallest keys after `after` kept.

use redis::Value;

use idem_core::store::support::{key_from_hex, FAILED_STEP_PREFIX};
use idem_core::{Abandoned, AbandonedQuery, Error, Key, StepState, INPUT_STEP};

use crate::admin::Node;
use crate::store::{bytes, corrupt, step_record, store_error, Inner};

/// How many keys each `SCAN` step asks for (a hint).
const SCAN_COUNT: usize = 1_000;

/// KEYS[1] the record, KEYS[2] its steps. The input step's value when the operation is
/// abandoned: its steps keep a finished input, no claim holds it (the record is gone, or in
/// progress past its lease on the server's clock, and not uncertain: an uncertain operation is
/// for its resolution, not to run again), and its latest attempt (`a`) is not marked failed;
/// else false.
fn script() -> String {
    format!(
        r"
local input = redis.call('HGET', KEYS[2], 's:{INPUT_STEP}')
if not input or string.sub(input, 1, 1) ~= 'f' then
  return false
end
local r = redis.call('HMGET', KEYS[1], 's', 'e', 'u')
if r[1] == 'c' or r[3] == '1' then
  return false
end
if r[1] == 'p' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if tonumber(r[2]) > now then
    return false
  end
end
local attempt = redis.call('HGET', KEYS[2], 'a') or '0'
if redis.call('HEXISTS', KEYS[2], 's:{FAILED_STEP_PREFIX}' .. attempt) == 1 then
  return false
end
return input
"
    )
}

impl Inner {
    /// See [`Store::find_abandoned`](idem_core::Store::find_abandoned): every steps hash of the
    /// prefix is looked at, whatever `limit` (one `SCAN` step and one pipeline of scripts per
    /// 1,000 hashes, on each master).
    pub(super) async fn find_abandoned(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<Abandoned>, Error> {
        let limit = usize::try_from(query.limit).unwrap_or(usize::MAX);
        let script = script();
        // The prefix holds no glob characters (the builder allows `A-Z a-z 0-9 _ - . :`).
        let pattern = format!("{}:{{*}}:steps", self.prefix);
        let mut found: Vec<(Key, Vec<u8>)> = Vec::new();
        for (node, _) in self.conn.masters().await? {
            let mut cursor = 0u64;
            loop {
                let (next, keys) = self.scan(&node, cursor, &pattern).await?;
                let keys: Vec<Key> = keys
                    .into_iter()
                    .filter(|k| query.after.is_none_or(|a| k > a))
                    .collect();
                if !keys.is_empty() {
                    let mut pipe = redis::pipe();
                    pipe.ignore_errors();
                    for key in &keys {
                        let record = self.key(key);
                        let steps = format!("{record}:steps");
                        pipe.cmd("EVAL").arg(&script).arg(2).arg(record).arg(steps);
                    }
                    let replies = self
                        .conn
                        .pipe_on(&node, &pipe)
                        .await
                        .map_err(|e| store_error("find_abandoned EVAL", e))?;
                    for (key, reply) in keys.iter().zip(&replies) {
                        match reply {
                            Value::Nil => {}
                            Value::ServerError(e) => {
                                return Err(store_error("find_abandoned EVAL", e.clone().into()))
                            }
                            other => {
                                let value = bytes(other).ok_or_else(|| {
                                    corrupt(format!("find_abandoned answered {other:?}"))
                                })?;
                                found.push((*key, value.to_vec()));
                            }
                        }
                    }
                    // Only the smallest `limit` keys can be returned.
                    found.sort_unstable_by_key(|(k, _)| *k);
                    found.truncate(limit);
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        found
            .into_iter()
            .map(
                |(key, value)| match step_record(INPUT_STEP.as_bytes(), &value)?.state {
                    StepState::Finished(input) => Abandoned::decode(key, &input),
                    StepState::Begun => Err(corrupt("an operation's input step is begun".into())),
                },
            )
            .collect()
    }

    /// One `SCAN` step on `node`: the next cursor and the operation keys of the steps hashes.
    async fn scan(
        &self,
        node: &Node,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<Key>), Error> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let answer = self
            .conn
            .query_on(node, &scan)
            .await
            .map_err(|e| store_error("find_abandoned SCAN", e))?;
        let Value::Array(parts) = &answer else {
            return Err(corrupt(format!("SCAN answered {answer:?}")));
        };
        let [cursor, Value::Array(names)] = parts.as_slice() else {
            return Err(corrupt(format!("SCAN answered {answer:?}")));
        };
        let cursor = bytes(cursor)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse::<u64>().ok())
            .ok_or_else(|| corrupt(format!("SCAN answered {answer:?}")))?;
        let keys = names
            .iter()
            .filter_map(|name| {
                let hex = std::str::from_utf8(bytes(name)?)
                    .ok()?
                    .strip_prefix(self.prefix.as_str())?
                    .strip_prefix(":{")?
                    .strip_suffix("}:steps")?;
                key_from_hex(hex)
            })
            .collect();
        Ok((cursor, keys))
    }
}
