//! The Lua scripts of the Redis store, one per state change, each atomic on the server.
//!
//! A record is a hash under one key (`KEYS[1]`):
//!
//! | field | holds |
//! |---|---|
//! | `s` | `p` while a claim runs, `c` once completed |
//! | `t` | the claim's fencing token (16 bytes) |
//! | `e` | the end of the lease (`p`) or of the retention (`c`), in milliseconds since the epoch, on the server's clock |
//! | `f` | the fingerprint (32 bytes: a 28-byte digest and a 4-byte policy version), when one was given |
//! | `u` | `1` while the claim (`p`) becomes uncertain if its lease ends ([`OnLapse::Uncertain`](idem_core::OnLapse::Uncertain)) |
//! | `k` | the tombstone's length in whole seconds after `e` (`c`, with a `key_retention`) |
//! | `r` | the stored response, when there is one and no tombstone (`k`) |
//! | `x` | `1` when the response is a stored error |
//!
//! A completion with a tombstone keeps its response apart, in a string under the record's key
//! with `:r` appended (the same hash tag, so the same cluster slot), which expires when the
//! retention ends: the record (which then expires `k` seconds later) keeps no result bytes
//! after that. The scripts that read or write a response take that key as `KEYS[2]`.
//!
//! An operation's steps (docs/steps.md) are a second hash under the record's key with `:steps`
//! appended (`KEYS[2]` of the step scripts): `a` counts the attempts and `t` names the claim
//! counted last; a field `s:<name>` per step holds its state (`b` begun, `f` finished), its
//! position and `:`, then its result. The hash expires with the retention from its last write.
//!
//! Time is the server's: `TIME`, read inside the script (Redis 7 replicates a script's effects,
//! not the script, so replicas store the same values). A completed record's key expires
//! (`PEXPIREAT`) when its retention ends, or its tombstone's end. A running claim's key expires
//! [`LAPSED_CLAIMS_KEPT`](idem_core::LAPSED_CLAIMS_KEPT) after its lease ends (`lapsed_kept`, in
//! every script's prelude): the record stops counting at `e`, but a late `complete` by its
//! owner, with nobody having claimed the key since, still lands within that time, as on every
//! store. An uncertain claim (`u`) has no expiry at all (`PERSIST`) until it completes or is
//! aborted, evicted or set back to release by a step write.

use idem_core::store::support::LAPSED_CLAIMS_KEPT_MS;

/// `ms()`: the server's clock in milliseconds; `num(x)`: an integer as a string for
/// `HSET`/`PEXPIREAT` (Lua numbers are doubles, and `tostring` would write large ones as
/// `1.7e+12`); `running(token)`: whether the record `KEYS[1]` is in progress under `token`
/// (the fence of every change after the claim); `response(kept)`: the stored response of a
/// completed record, from the hash or, with a tombstone (`kept`, its `k`), from `KEYS[2]`
/// (`false` when none).
const PRELUDE: &str = r"
local function ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function num(x)
  return string.format('%.0f', x)
end
local function running(token)
  local r = redis.call('HMGET', KEYS[1], 's', 't')
  return r[1] == 'p' and r[2] == token
end
local function response(kept)
  if kept then
    return redis.call('GET', KEYS[2])
  end
  return redis.call('HGET', KEYS[1], 'r')
end
";

/// `claim`: KEYS[1], KEYS[2] (the response); ARGV = token, lease ms, fingerprint (empty for
/// none), uncertain on lapse (0/1).
///
/// A record holds its key while its lease runs, for ever once lapsed if uncertain, and until
/// its tombstone ends once completed. Fingerprints are compared by their digests (the first 28
/// bytes), whatever their policy versions. Returns `{'started'}`, `{'locked', ms left}`,
/// `{'reused', stored fingerprint}`, `{'uncertain', lease end}`, `{'expired', retention end}` or
/// `{'done', retention end, has response (0/1), response, is error (0/1)}`.
const CLAIM: &str = r"
local now = ms()
local r = redis.call('HMGET', KEYS[1], 's', 't', 'e', 'f', 'x', 'u', 'k')
if r[1] then
  local e = tonumber(r[3])
  local held
  if r[1] == 'c' then
    held = e + 1000 * tonumber(r[7] or '0') > now
  else
    held = e > now or r[6] == '1'
  end
  if held then
    if r[1] == 'p' and e > now and r[2] == ARGV[1] then
      -- This very claim, sent again after a lost reply: it is ours.
      return {'started'}
    end
    if r[4] and ARGV[3] ~= '' and string.sub(r[4], 1, 28) ~= string.sub(ARGV[3], 1, 28) then
      return {'reused', r[4]}
    end
    if r[1] ~= 'c' then
      if e > now then
        return {'locked', e - now}
      end
      return {'uncertain', e}
    end
    if e <= now then
      return {'expired', e}
    end
    local stored = response(r[7])
    if stored then
      return {'done', e, 1, stored, tonumber(r[5] or '0')}
    end
    return {'done', e, 0, '', tonumber(r[5] or '0')}
  end
end
local lease_end = now + tonumber(ARGV[2])
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], 's', 'p', 't', ARGV[1], 'e', num(lease_end))
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'f', ARGV[3])
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'u', '1')
else
  redis.call('PEXPIREAT', KEYS[1], num(lease_end + lapsed_kept))
end
return {'started'}
";

/// `complete`: KEYS[1], KEYS[2] (the response); ARGV = token, retention ms, has response
/// (0/1), response, is error (0/1), tombstone seconds (0 for none). Returns 1 when the record
/// is (or already was) completed by this claim, 0 when it is lost.
const COMPLETE: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 't')
if r[2] ~= ARGV[1] then
  return 0
end
if r[1] == 'c' then
  return 1
end
local until_ = ms() + tonumber(ARGV[2])
local kept = tonumber(ARGV[6])
redis.call('HDEL', KEYS[1], 'u')
if kept > 0 then
  redis.call('HSET', KEYS[1], 's', 'c', 'e', num(until_), 'x', ARGV[5], 'k', ARGV[6])
  if ARGV[3] == '1' then
    -- Redis drops a key once its clock passes PXAT; the record reads as a tombstone from
    -- `until_` itself, so the response ends one millisecond earlier and no read sees both.
    redis.call('SET', KEYS[2], ARGV[4], 'PXAT', num(until_ - 1))
  end
  redis.call('PEXPIREAT', KEYS[1], num(until_ + 1000 * kept))
  return 1
end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 's', 'c', 'e', num(until_), 'x', ARGV[5], 'r', ARGV[4])
else
  redis.call('HSET', KEYS[1], 's', 'c', 'e', num(until_), 'x', ARGV[5])
end
redis.call('PEXPIREAT', KEYS[1], num(until_))
return 1
";

/// `abort`: KEYS[1]; ARGV = token. Deletes the running record of this claim: 1, or 0 when lost.
const ABORT: &str = r"
if not running(ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
";

/// `renew`: KEYS[1]; ARGV = token, lease ms. Moves the running claim's lease end (and, unless
/// it is uncertain, its key's expiry): 1, or 0 when lost.
const RENEW: &str = r"
if not running(ARGV[1]) then
  return 0
end
local lease_end = ms() + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'e', num(lease_end))
if redis.call('HGET', KEYS[1], 'u') ~= '1' then
  redis.call('PEXPIREAT', KEYS[1], num(lease_end + lapsed_kept))
end
return 1
";

/// `get`: KEYS[1], KEYS[2] (the response). The live record as `{state, t, e, f, r, x}` (absent
/// fields false), its state `p` (a running lease), `u` (uncertain: an uncertain claim's lease
/// ended), `c` (completed) or `x` (a tombstone: `r` false), or an empty array when there is
/// none or it ended.
const GET: &str = r"
local now = ms()
local r = redis.call('HMGET', KEYS[1], 's', 't', 'e', 'f', 'x', 'u', 'k')
if not r[1] then
  return {}
end
local e = tonumber(r[3])
if r[1] == 'c' then
  if e > now then
    return {'c', r[2], e, r[4], response(r[7]), r[5]}
  end
  if r[7] and e + 1000 * tonumber(r[7]) > now then
    return {'x', r[2], e, r[4], false, r[5]}
  end
  return {}
end
if e > now then
  return {'p', r[2], e, r[4], false, r[5]}
end
if r[6] == '1' then
  return {'u', r[2], e, r[4], false, r[5]}
end
return {}
";

/// `take_uncertain`: KEYS[1]; ARGV = the lapsed claim's token, the new token, lease ms. Only an
/// uncertain claim (`u`) carrying the token whose lease has ended gets the new token and a
/// lease from now (it stays uncertain, with no expiry): 1, else 0 and nothing changes.
const TAKE_UNCERTAIN: &str = r"
local now = ms()
local r = redis.call('HMGET', KEYS[1], 's', 't', 'e', 'u')
if r[1] ~= 'p' or r[2] ~= ARGV[1] or r[4] ~= '1' or tonumber(r[3]) > now then
  return 0
end
redis.call('HSET', KEYS[1], 't', ARGV[2], 'e', num(now + tonumber(ARGV[3])))
return 1
";

/// The fence of the step scripts: KEYS[1] is in progress under the claim's token (ARGV[1]).
const STEPS_FENCE: &str = r"
if not running(ARGV[1]) then
  return 0
end
local function counted()
  local a = redis.call('HMGET', KEYS[2], 'a', 't')
  local attempt = tonumber(a[1] or '0')
  if attempt == 0 or a[2] ~= ARGV[1] then
    attempt = attempt + 1
    redis.call('HSET', KEYS[2], 'a', num(attempt), 't', ARGV[1])
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return attempt
end
";

/// `begin_steps`: KEYS[1], KEYS[2]; ARGV = token, retention ms. Returns 0 when the claim is
/// lost, else `{attempt, {field, value, …}}` (the steps hash).
const BEGIN_STEPS: &str = r"
local attempt = counted()
return {attempt, redis.call('HGETALL', KEYS[2])}
";

/// `write_step`: KEYS[1], KEYS[2]; ARGV = token, retention ms, name, position, finished (0/1),
/// result, on lapse (`u` uncertain, `r` release, empty to leave it). A finished step keeps its
/// first result; an on-lapse sets the record's `u` and its expiry, behind the same fence. 1, or
/// 0 when the claim is lost.
const WRITE_STEP: &str = r"
counted()
local field = 's:' .. ARGV[3]
local old = redis.call('HGET', KEYS[2], field)
if not old or string.sub(old, 1, 1) ~= 'f' then
  local state = 'b'
  if ARGV[5] == '1' then
    state = 'f'
  end
  redis.call('HSET', KEYS[2], field, state .. ARGV[4] .. ':' .. ARGV[6])
end
if ARGV[7] == 'u' then
  redis.call('HSET', KEYS[1], 'u', '1')
  redis.call('PERSIST', KEYS[1])
elseif ARGV[7] == 'r' then
  redis.call('HDEL', KEYS[1], 'u')
  local e = tonumber(redis.call('HGET', KEYS[1], 'e'))
  redis.call('PEXPIREAT', KEYS[1], num(e + lapsed_kept))
end
return 1
";

/// `evict`: KEYS[1], KEYS[2] (the steps), KEYS[3] (the response). Deletes the record, its
/// steps and its response; 1 when the record existed.
const EVICT: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2], KEYS[3])
return n
";

/// One script: its source and its SHA-1, for `EVALSHA` with `EVAL` as the fallback.
pub(super) struct Lua {
    pub(super) body: String,
    pub(super) sha: String,
}

impl Lua {
    fn new(body: &str) -> Lua {
        let body = format!("{PRELUDE}local lapsed_kept = {LAPSED_CLAIMS_KEPT_MS}\n{body}");
        let sha = redis::Script::new(&body).get_hash().to_owned();
        Lua { body, sha }
    }
}

/// The store's scripts, with their SHA-1 digests computed once.
pub(super) struct Scripts {
    pub(super) claim: Lua,
    pub(super) complete: Lua,
    pub(super) abort: Lua,
    pub(super) renew: Lua,
    pub(super) get: Lua,
    pub(super) take_uncertain: Lua,
    pub(super) begin_steps: Lua,
    pub(super) write_step: Lua,
    pub(super) evict: Lua,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        Scripts {
            claim: Lua::new(CLAIM),
            complete: Lua::new(COMPLETE),
            abort: Lua::new(ABORT),
            renew: Lua::new(RENEW),
            get: Lua::new(GET),
            take_uncertain: Lua::new(TAKE_UNCERTAIN),
            begin_steps: Lua::new(&format!("{STEPS_FENCE}{BEGIN_STEPS}")),
            write_step: Lua::new(&format!("{STEPS_FENCE}{WRITE_STEP}")),
            evict: Lua::new(EVICT),
        }
    }
}
