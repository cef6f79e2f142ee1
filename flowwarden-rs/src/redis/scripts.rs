//! The Lua scripts of the stores. Each store operation is one script, so every check and the
//! write it guards happen in one atomic step on the server (Redis runs a script to the end
//! before any other command). Times are the server's (`TIME`), in milliseconds since the epoch.
//!
//! Every script answers an array whose first element is a status word, followed by what the
//! caller needs to build its answer or its error (see each script). A key of the wrong type
//! fails the script with `WRONGTYPE`, which the stores report as `Corrupt`.

use std::sync::LazyLock;

use ::redis::{Script, Value};

use crate::port::{StoreError, StoreErrorKind};

/// Shared by every script: the server's clock and a strict read of a lease hash.
const PRELUDE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The lease hash at `key`: nil when there is none, or false and the malformed field.
local function read_lease(key)
  local l = redis.call('HMGET', key, 'owner', 'epoch', 'expiresAt')
  if not l[1] and not l[2] and not l[3] then return nil end
  if not l[1] then return false, 'owner' end
  local epoch = tonumber(l[2])
  if epoch == nil then return false, 'epoch' end
  local exp = tonumber(l[3])
  if exp == nil then return false, 'expiresAt' end
  return { owner = l[1], epoch = epoch, exp = exp }
end

-- The fence of a write of the checkpoint at `cp_key` carrying `epoch` (and `owner` when
-- `has_owner` is '1'): nil when accepted, else the reply that refuses it. The lease of the
-- stream must have exactly this epoch (and owner), and the stored checkpoint no newer one.
local function fence(cp_key, lease_key, epoch, owner, has_owner)
  local l, bad = read_lease(lease_key)
  if l == false then return { 'corrupt_lease', bad } end
  if l == nil then return { 'no_lease' } end
  if l.epoch ~= epoch or (has_owner == '1' and l.owner ~= owner) then
    return { 'lease', l.owner, l.epoch }
  end
  local stored = redis.call('HGET', cp_key, 'epoch')
  if stored then
    local s = tonumber(stored)
    if s == nil then return { 'corrupt', 'epoch' } end
    if s > epoch then return { 'newer', s } end
  end
  return nil
end
"#;

/// `KEYS[1]` lease; `ARGV[1]` owner, `ARGV[2]` ttl in ms. Takes the lease when it is free
/// (never taken, expired or released by the server's clock) or already the owner's, with the
/// epoch plus one. `{'ok', owner, epoch, expiresAt}`, `{'held', owner, epoch, expiresAt}`, or
/// `{'corrupt_lease', field}`.
const ACQUIRE: &str = r#"
local l, bad = read_lease(KEYS[1])
if l == false then return { 'corrupt_lease', bad } end
local now = now_ms()
local epoch = 1
if l then
  if l.exp > now and l.owner ~= ARGV[1] then return { 'held', l.owner, l.epoch, l.exp } end
  epoch = l.epoch + 1
end
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', epoch, 'expiresAt', exp)
return { 'ok', ARGV[1], epoch, exp }
"#;

/// `KEYS[1]` lease; `ARGV[1]` owner, `ARGV[2]` epoch, `ARGV[3]` ttl in ms. Extends the lease
/// while it has this owner and epoch. `{'ok', owner, epoch, expiresAt}`, `{'lost'}`, or
/// `{'corrupt_lease', field}`.
const RENEW: &str = r#"
local l, bad = read_lease(KEYS[1])
if l == false then return { 'corrupt_lease', bad } end
if l == nil or l.owner ~= ARGV[1] or l.epoch ~= tonumber(ARGV[2]) then return { 'lost' } end
local exp = now_ms() + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'expiresAt', exp)
return { 'ok', l.owner, l.epoch, exp }
"#;

/// `KEYS[1]` lease; `ARGV[1]` owner, `ARGV[2]` epoch. Frees the lease now (the hash, and so
/// the epoch, stays) while it has this owner and epoch. `{'ok'}`, `{'not_held'}`, or
/// `{'corrupt_lease', field}`.
const RELEASE: &str = r#"
local l, bad = read_lease(KEYS[1])
if l == false then return { 'corrupt_lease', bad } end
if l == nil or l.owner ~= ARGV[1] or l.epoch ~= tonumber(ARGV[2]) then return { 'not_held' } end
local now = now_ms()
if l.exp > now then redis.call('HSET', KEYS[1], 'expiresAt', now) end
return { 'ok' }
"#;

/// `KEYS[1]` lease. `{'lease', owner, epoch, expiresAt}`, `{'none'}`, or
/// `{'corrupt_lease', field}`.
const CURRENT: &str = r#"
local l, bad = read_lease(KEYS[1])
if l == false then return { 'corrupt_lease', bad } end
if l == nil then return { 'none' } end
return { 'lease', l.owner, l.epoch, l.exp }
"#;

/// `KEYS[1]` checkpoint, `KEYS[2]` lease; `ARGV[1]` the BSON checkpoint document, `ARGV[2]`
/// epoch (empty: unfenced), `ARGV[3]` owner, `ARGV[4]` '1' when there is an owner. A fenced
/// write is checked by `fence`; then the hash is replaced whole (a claim's fields go, as
/// MongoDB's replace does). `{'ok'}` or a refusal of `fence`.
const SAVE: &str = r#"
if ARGV[2] ~= '' then
  local refused = fence(KEYS[1], KEYS[2], tonumber(ARGV[2]), ARGV[3], ARGV[4])
  if refused then return refused end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'doc', ARGV[1])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'epoch', ARGV[2]) end
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'owner', ARGV[3]) end
return { 'ok' }
"#;

/// `KEYS[1]` checkpoint, `KEYS[2]` lease; `ARGV[1]` owner, `ARGV[2]` epoch. Checked by
/// `fence` (owner included); then sets only `owner`, `epoch` and `claimedAt` (server time), so
/// a stored document keeps its positions and a missing one stays missing. `{'ok'}` or a
/// refusal of `fence`.
const CLAIM: &str = r#"
local refused = fence(KEYS[1], KEYS[2], tonumber(ARGV[2]), ARGV[1], '1')
if refused then return refused end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', ARGV[2], 'claimedAt', now_ms())
return { 'ok' }
"#;

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

pub(crate) static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(ACQUIRE));
pub(crate) static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RENEW));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RELEASE));
pub(crate) static CURRENT_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CURRENT));
pub(crate) static SAVE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(SAVE));
pub(crate) static CLAIM_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CLAIM));

/// A script's reply: the status word and the values after it.
pub(crate) struct Reply {
    what: String,
    pub(crate) status: String,
    values: Vec<Value>,
}

impl Reply {
    /// Splits `values` (the script's array) into the status word and the rest.
    pub(crate) fn parse(what: &str, mut values: Vec<Value>) -> Result<Self, StoreError> {
        if values.is_empty() {
            return Err(unexpected(what, "an empty reply"));
        }
        let first = values.remove(0);
        let status = text(what, &first)?;
        Ok(Self {
            what: what.to_owned(),
            status,
            values,
        })
    }

    /// The `i`-th value after the status, as text.
    pub(crate) fn text(&self, i: usize) -> Result<String, StoreError> {
        match self.values.get(i) {
            Some(v) => text(&self.what, v),
            None => Err(unexpected(&self.what, &format!("no value at {i}"))),
        }
    }

    /// The `i`-th value after the status, as an integer.
    pub(crate) fn int(&self, i: usize) -> Result<i64, StoreError> {
        match self.values.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            Some(v) => text(&self.what, v)?
                .parse()
                .map_err(|_| unexpected(&self.what, &format!("{v:?} at {i} is not an integer"))),
            None => Err(unexpected(&self.what, &format!("no value at {i}"))),
        }
    }

    /// The reply as an error, for a status the caller does not expect.
    pub(crate) fn unexpected(&self) -> StoreError {
        unexpected(&self.what, &format!("status '{}'", self.status))
    }
}

fn text(what: &str, v: &Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone())
            .map_err(|_| unexpected(what, "a reply value that is not UTF-8")),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(n) => Ok(n.to_string()),
        other => Err(unexpected(what, &format!("{other:?}"))),
    }
}

fn unexpected(what: &str, detail: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Other,
        format!("{what}: unexpected reply from the script ({detail})"),
    )
}
