//! The Lua scripts of the Redis store, one per state change, each atomic on the server.
//!
//! A record is a hash under one key (`KEYS[1]`):
//!
//! | field | holds |
//! |---|---|
//! | `s` | `p` while a claim runs, `c` once completed |
//! | `t` | the claim's fencing token (16 bytes) |
//! | `e` | the end of the lease (`p`) or of the retention (`c`), in milliseconds since the epoch, on the server's clock |
//! | `f` | the fingerprint (32 bytes), when one was given |
//! | `r` | the stored response, when there is one |
//! | `x` | `1` when the response is a stored error |
//!
//! An operation's steps (docs/steps.md) are a second hash, `KEYS[2]`, under the record's key
//! with `:steps` appended (the same hash tag, so the same cluster slot): `a` counts the attempts
//! and `t` names the claim counted last; a field `s:<name>` per step holds its state (`b` begun,
//! `f` finished), its position and `:`, then its result. The hash expires with the retention
//! from its last write.
//!
//! Time is the server's: `TIME`, read inside the script (Redis 7 replicates a script's effects,
//! not the script, so replicas store the same values). A completed record's key expires
//! (`PEXPIREAT`) when its retention ends. A running claim's key expires
//! [`LAPSED_CLAIMS_KEPT`](idem_core::LAPSED_CLAIMS_KEPT) after its lease ends (`lapsed_kept`, in
//! every script's prelude): the record stops counting at `e`, but a late `complete` by its
//! owner, with nobody having claimed the key since, still lands within that time, as on every
//! store.

use idem_core::store::support::LAPSED_CLAIMS_KEPT_MS;

/// `ms()`: the server's clock in milliseconds; `num(x)`: an integer as a string for
/// `HSET`/`PEXPIREAT` (Lua numbers are doubles, and `tostring` would write large ones as
/// `1.7e+12`); `running(token)`: whether the record `KEYS[1]` is in progress under `token`
/// (the fence of every change after the claim).
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
";

/// `start`: KEYS[1]; ARGV = token, lease ms, fingerprint (empty for none).
///
/// Returns `{'started'}`, `{'locked', ms left}`, `{'reused'}` or
/// `{'done', expires ms, has response (0/1), response, is error (0/1)}`.
const CLAIM: &str = r"
local now = ms()
local r = redis.call('HMGET', KEYS[1], 's', 't', 'e', 'f', 'r', 'x')
if r[1] and tonumber(r[3]) > now then
  if r[2] == ARGV[1] and r[1] == 'p' then
    -- This very claim, sent again after a lost reply: it is ours.
    return {'started'}
  end
  if r[4] and ARGV[3] ~= '' and r[4] ~= ARGV[3] then
    return {'reused'}
  end
  if r[1] == 'c' then
    if r[5] then
      return {'done', tonumber(r[3]), 1, r[5], tonumber(r[6] or '0')}
    end
    return {'done', tonumber(r[3]), 0, '', tonumber(r[6] or '0')}
  end
  return {'locked', tonumber(r[3]) - now}
end
local lease = tonumber(ARGV[2])
local lease_end = now + lease
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 's', 'p', 't', ARGV[1], 'e', num(lease_end), 'f', ARGV[3])
else
  redis.call('HSET', KEYS[1], 's', 'p', 't', ARGV[1], 'e', num(lease_end))
end
redis.call('PEXPIREAT', KEYS[1], num(lease_end + lapsed_kept))
return {'started'}
";

/// `complete`: KEYS[1]; ARGV = token, retention ms, has response (0/1), response, is error (0/1).
/// Returns 1 when the record is (or already was) completed by this claim, 0 when it is lost.
const COMPLETE: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 't')
if r[2] ~= ARGV[1] then
  return 0
end
if r[1] == 'c' then
  return 1
end
local until_ = ms() + tonumber(ARGV[2])
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

/// `renew`: KEYS[1]; ARGV = token, lease ms. Moves the running claim's lease end: 1, or 0 when
/// lost.
const RENEW: &str = r"
if not running(ARGV[1]) then
  return 0
end
local lease = tonumber(ARGV[2])
local lease_end = ms() + lease
redis.call('HSET', KEYS[1], 'e', num(lease_end))
redis.call('PEXPIREAT', KEYS[1], num(lease_end + lapsed_kept))
return 1
";

/// `get`: KEYS[1]. The live record as `{s, t, e, f, r, x}` (absent fields false), or an empty
/// array when there is none or it ended.
const GET: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 't', 'e', 'f', 'r', 'x')
if not r[1] or tonumber(r[3]) <= ms() then
  return {}
end
return {r[1], r[2], tonumber(r[3]), r[4], r[5], r[6]}
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
/// result. A finished step keeps its first result. 1, or 0 when the claim is lost.
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
return 1
";

/// `evict`: KEYS[1], KEYS[2]. Deletes the record and its steps; 1 when the record existed.
const EVICT: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
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
            begin_steps: Lua::new(&format!("{STEPS_FENCE}{BEGIN_STEPS}")),
            write_step: Lua::new(&format!("{STEPS_FENCE}{WRITE_STEP}")),
            evict: Lua::new(EVICT),
        }
    }
}
