package redisfast

import "github.com/redis/go-redis/v9"

// The scripts, each one round trip and atomic (run with EVALSHA, and
// EVAL once after a restart of Redis forgot them).

// storeFn is a Lua function, the module's Store: the key's folder
// entries, from its own folder upward, stopping after the first that was
// there already (its score still updated), then the value. The key is
// KEYS[k], its folders KEYS[k+1] to KEYS[k+n-1], and their names ARGV[a]
// on.
const storeFn = `
local function store(k, n, a, score, value)
  for i = 1, n - 1 do
    if redis.call('ZADD', KEYS[k + i], score, ARGV[a + i - 1]) == 0 then break end
  end
  redis.call('SET', KEYS[k], value)
end
`

// plainValueFn is a Lua function: the value a stored envelope holds, ""
// for null, or nil where the fast path cannot compare it (not the
// module's envelope, or compressed or encrypted).
const plainValueFn = `
local function plainValue(v)
  local ok, sd = pcall(cjson.decode, v)
  if not ok or type(sd) ~= 'table' or sd.compression ~= 0 or sd.encryption ~= 0 then return nil end
  if sd.value == cjson.null then return '' end
  return sd.value
end
`

// storeScript is the module's Store (storeFn).
// KEYS = {key, folder, parent folder, ...}; ARGV = {value, score, name in
// folder, name in parent, ...}.
var storeScript = redis.NewScript(storeFn + `
store(1, #KEYS, 3, ARGV[2], ARGV[1])
return 1`)

// deleteScript is the module's Delete of each key in turn, all at once:
// the key's folder entry, and each folder's own entry upward while the
// folder is left empty, then the value.
// KEYS = for each key: the key, its folder, the folder's parent, ...;
// ARGV = {number of keys, then for each: how many KEYS it has, its name
// in its folder, the folder's name in its parent, ...}.
var deleteScript = redis.NewScript(`local k, a = 1, 2` + deleteLoop)

// deleteLoop is deleteScript's body, from KEYS[k] and ARGV[a] on, the
// number of keys at ARGV[a - 1].
const deleteLoop = `
for c = 1, tonumber(ARGV[a - 1]) do
  local n = tonumber(ARGV[a])
  a = a + 1
  redis.call('ZREM', KEYS[k + 1], ARGV[a])
  for i = 1, n - 2 do
    if redis.call('EXISTS', KEYS[k + i]) == 1 then break end
    redis.call('ZREM', KEYS[k + i + 1], ARGV[a + i])
  end
  redis.call('DEL', KEYS[k])
  k, a = k + n, a + n - 1
end
return 0`

// deleteIfScript is durable.AtomicRemover's DeleteAllIf: deleteScript,
// only while a saga's lease is the caller's (docs/durability.md, "A
// saga never writes after it lost its lease"): the lease key holds the
// expected value ("equals"), or is not there ("absent"), or is not
// checked (""), and its folder lists no lease key (the journal's
// "lease", epoch 0, or "lease.<8 digits>.<owner>") of a higher epoch, nor
// another of the same epoch. It answers 0 once deleted, 1 for a lease
// key not there, 2 for another value (or one compressed or encrypted,
// which this process never stores), 3 for a lease key that outranks it.
// KEYS = {lease key, its folder, then deleteScript's}; ARGV = {"equals",
// "absent" or "", the expected value in base64, epoch, the lease key's
// name in its folder, then deleteScript's}.
var deleteIfScript = redis.NewScript(outrankedFn + plainValueFn + `
local v = redis.call('GET', KEYS[1])
if ARGV[1] == 'absent' and v then return 2 end
if ARGV[1] == 'equals' then
  if not v then return 1 end
  if plainValue(v) ~= ARGV[2] then return 2 end
end
if outranked(KEYS[2], tonumber(ARGV[3]), ARGV[4]) then return 3 end
local k, a = 3, 6` + deleteLoop)

// outrankedFn is a Lua function: whether folder lists a lease key of
// the journal ("lease", epoch 0, or "lease.<8 digits>.<owner>") of a
// higher epoch than epoch, or another of epoch than mine.
const outrankedFn = `
local function outranked(folder, epoch, mine)
  for _, m in ipairs(redis.call('ZRANGE', folder, 0, -1)) do
    local e = nil
    if m == 'lease' then e = 0
    else
      e = tonumber(string.match(m, '^lease%.(%d%d%d%d%d%d%d%d)%.') or '')
      if e == 0 then e = nil end
    end
    if e and (e > epoch or (e == epoch and m ~= mine)) then return true end
  end
  return false
end
`

// claimScript is durable.LeaseClaimer's ClaimLease, a takeover's claim
// (docs/durability.md, "A saga never writes after it lost its lease"):
// if the old owner's lease record is as the takeover watched it (its
// key holds the value seen, or, where there was none, the folder lists
// no "lease") and the folder lists no lease key of the new epoch or a
// higher one, the module's Store of the new lease key. It answers 0
// once stored, 1 for the old key gone, 2 for another value or a "lease"
// written since, 3 for a lease key that outranks the claim, 4 for an
// old value compressed, encrypted or not the module's envelope. With
// "unset", the old key was listed with no value (a Store cut short
// between its folder entry and its value) and must still have none.
// KEYS = {new lease key, its folder, the folder's parent, ..., old key
// (or the new one again)}; ARGV = {"equals", "unset" or "nolease", the value seen
// in base64, epoch, the new key's name in its folder, its envelope,
// score, its name in its folder, the folder's name in its parent, ...}.
var claimScript = redis.NewScript(outrankedFn + plainValueFn + storeFn + `
local last = #KEYS
if ARGV[1] == 'equals' then
  local v = redis.call('GET', KEYS[last])
  if not v then return 1 end
  local val = plainValue(v)
  if val == nil then return 4 end
  if val ~= ARGV[2] then return 2 end
elseif ARGV[1] == 'unset' then
  if redis.call('EXISTS', KEYS[last]) == 1 then return 2 end
elseif redis.call('ZSCORE', KEYS[2], 'lease') then
  return 2
end
if outranked(KEYS[2], tonumber(ARGV[3]), ARGV[4]) then return 3 end
store(1, last - 1, 7, ARGV[6], ARGV[5])
return 0`)

// lockScript takes each free lock as the module's Lock does (SET NX PX),
// and answers, for each, 1 if taken.
// KEYS = lock keys; ARGV = {token, ttl in ms}.
var lockScript = redis.NewScript(`
local got = {}
for i = 1, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then got[i] = 1 else got[i] = 0 end
end
return got`)

// unlockScript deletes each lock that is still this process's: one
// MGET and one DEL, not a GET and a DEL for each (a command in a script
// costs Redis several times what it costs alone).
// KEYS = lock keys; ARGV = {token}.
var unlockScript = redis.NewScript(`
local mine = {}
for i, v in ipairs(redis.call('MGET', unpack(KEYS))) do
  if v == ARGV[1] then mine[#mine + 1] = KEYS[i] end
end
if #mine > 0 then redis.call('DEL', unpack(mine)) end
return 1`)

// refreshScript extends each lock still this process's, and answers the
// positions of those that are not (lost).
// KEYS = lock keys; ARGV = {token, ttl in ms}.
var refreshScript = redis.NewScript(`
local lost = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('PEXPIRE', KEYS[i], ARGV[2])
  else lost[#lost + 1] = i end
end
return lost`)

// renewScript is a lease's conditional renewal: if the lease key holds
// the value this process last stored (or, for its first renewal, if
// segment 0 is there), or already the new one (this very renewal, run
// again by the client after its reply was lost: go-redis resends a
// command whose connection broke), the module's Store of the new value; then the
// names in the lease's folder, for the caller to look for a higher
// epoch. It answers {0, names} once stored, 1 for a key not there, 2
// for another value, 3 for a value compressed or encrypted.
// KEYS = {lease key, its folder, the folder's parent, ..., guard key};
// ARGV = {"prev" or "guard", the previous value in base64, the new
// envelope, score, name in folder, name in parent, ...}.
var renewScript = redis.NewScript(storeFn + `
local last = #KEYS
if ARGV[1] == 'prev' then
  local v = redis.call('GET', KEYS[1])
  if not v then return 1 end
  local sd = cjson.decode(v)
  if sd.compression ~= 0 or sd.encryption ~= 0 then return 3 end
  if sd.value ~= ARGV[2] and sd.value ~= cjson.decode(ARGV[3]).value then return 2 end
elseif redis.call('EXISTS', KEYS[last]) == 0 then
  return 1
end
store(1, last - 1, 5, ARGV[4], ARGV[3])
return {0, redis.call('ZRANGE', KEYS[2], 0, -1)}`)

// storeIfScript is durable.GuardedStorer's StoreIf: if the lock is free
// (when one is named) and the guarded key holds the expected value (or,
// with none expected, is absent), or already what this call writes to
// it (this very call, run again by the client after its reply was
// lost), the module's Store of each write in turn. It answers {0, what the key held}, {1} for a lock held, {2} for
// a key not there, {3, what it held} for another value, {4} for a value
// compressed, encrypted or not the module's envelope. An empty value
// (null in the envelope) compares as "".
// KEYS = {lock key (or the guarded key again), guarded key, then for
// each write: its key, its folder, the folder's parent, ...};
// ARGV = {"lock" or "", "absent" or "equals", the expected value in
// base64, score, number of writes, then for each write: how many KEYS
// it has, its envelope, its name in its folder, the folder's name in
// its parent, ...}.
var storeIfScript = redis.NewScript(plainValueFn + storeFn + `
if ARGV[1] == 'lock' and redis.call('EXISTS', KEYS[1]) == 1 then return {1} end
local v = redis.call('GET', KEYS[2])
if v then
  local val = plainValue(v)
  if val == nil then return {4} end
  if ARGV[2] == 'absent' or val ~= ARGV[3] then
    local k, a, again = 3, 6, false
    for w = 1, tonumber(ARGV[5]) do
      local n = tonumber(ARGV[a])
      if KEYS[k] == KEYS[2] then again = val == cjson.decode(ARGV[a + 1]).value end
      k, a = k + n, a + n + 1
    end
    if not again then return {3, v} end
    v = nil
  end
elseif ARGV[2] == 'equals' then
  return {2}
end
local k, a = 3, 6
for w = 1, tonumber(ARGV[5]) do
  local n = tonumber(ARGV[a])
  store(k, n, a + 2, ARGV[4], ARGV[a + 1])
  k, a = k + n, a + n + 1
end
if v then return {0, v} end
return {0}`)
