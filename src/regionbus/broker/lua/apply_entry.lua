-- Apply one entry operation (PUT, DESTROY, INVALIDATE, the conditional PUT_IF_ABSENT,
-- REPLACE and REMOVE, a loader's LOAD_CREATE, a function's LOCAL_DESTROY and
-- LOCAL_INVALIDATE) atomically, with server-side
-- duplicate detection by EventID, fencing by the bucket primary's epoch and, on multi-site
-- deployments, the gateway conflict check.
--
-- KEYS: 1 the bucket's regions set, 2 values hash, 3 meta hash, 4 the bucket's region version
--       hash (version.lua),
--       5 tracking hash, 6 results hash, 7 results index (zset by ops offset),
--       8 the bucket's fencing epoch counter,
--       9 gateway versions hash (key -> "<timestamp_ms>|<site id>", multi-site only),
--       10 expiry sorted set (key -> expiry ms), 11 entry times hash (key -> "<modified>|<accessed>")
-- ARGV: 1 kind, 2 region, 3 key, 4 value, 5 serializer, 6 tracking field (member:thread),
--       7 sequence id, 8 EventID string, 9 ops offset, 10 want_old ("1"/"0"),
--       11 the caller's epoch of the bucket ("" = unfenced, for tools),
--       12 timestamp_ms ("" = this site keeps no gateway versions), 13 origin site id,
--       14 "1" when the operation came through a gateway receiver (conflict-checked),
--       15 entry time-to-live ms, 16 entry idle timeout ms (0 = never; both 0: no expiration),
--       17 now ms, 18 "1" when the region's expiration action destroys (else it invalidates),
--       19 "1" when ARGV 20 is an expected value (REPLACE, REMOVE), 20 the expected value
-- Returns: {status, result, old_value, old_serializer}
--   status "OK":     result = "<EVENT_KIND>|<version>"
--   status "NOOP":   a conditional operation whose condition did not hold: nothing changed;
--                    old_value = the entry's current value (false when absent or invalid),
--                    old_serializer its serializer's name; its EventID is recorded with
--                    the result "NOOP", so it is a DUP when processed again
--   status "DUP":    result = stored result of that EventID or false (pruned); old_value =
--                    the stored old value of that change, when it was asked for, and
--                    old_serializer its serializer's name
--   status "ERR":    result = error class name
--   status "STALE":  a gateway event lost the conflict check; nothing changed
--   status "FENCED": the caller's epoch is stale (another server is primary): nothing done
if ARGV[11] ~= '' and redis.call('GET', KEYS[8]) ~= ARGV[11] then
  return {'FENCED', false, false}
end
if redis.call('SISMEMBER', KEYS[1], ARGV[2]) == 0 then
  return {'ERR', 'RegionNotFoundError', false}
end
local seq = tonumber(ARGV[7])
local last = redis.call('HGET', KEYS[5], ARGV[6])
if last and tonumber(last) >= seq then
  -- Written again, unchanged, so a WAIT after this call also covers the first apply, which
  -- may have been made on another connection whose WAIT failed.
  redis.call('HSET', KEYS[5], ARGV[6], last)
  return {'DUP', redis.call('HGET', KEYS[6], ARGV[8]), redis.call('HGET', KEYS[6], ARGV[8] .. '|old'),
    redis.call('HGET', KEYS[6], ARGV[8] .. '|olds')}
end
local kind = ARGV[1]
local key = ARGV[3]
-- Records the EventID's sequence id and its result (with a value kept beside it: the old
-- value asked for, or what a conditional operation found), so the operation processed
-- again is a DUP answered the same, and indexes the result by the operation's offset for
-- pruning.
local function record(result, kept, kept_serializer)
  redis.call('HSET', KEYS[5], ARGV[6], seq)
  redis.call('HSET', KEYS[6], ARGV[8], result)
  if kept then
    redis.call('HSET', KEYS[6], ARGV[8] .. '|old', kept)
    redis.call('HSET', KEYS[6], ARGV[8] .. '|olds', kept_serializer)
  end
  redis.call('ZADD', KEYS[7], tonumber(ARGV[9]), ARGV[8])
end
-- Gateway conflict check (docs/behaviour.md §6), here so it is atomic with the change: an event from
-- another site is refused when the entry was last changed by a different site at a later
-- timestamp, or at the same timestamp by a higher site id. The sequence id is recorded so
-- a resend of the refused event is a DUP.
if ARGV[12] ~= '' and ARGV[14] == '1' then
  local stored = redis.call('HGET', KEYS[9], key)
  if stored then
    local ts, site = string.match(stored, '^(%d+)|(%d+)$')
    ts, site = tonumber(ts), tonumber(site)
    local in_ts, in_site = tonumber(ARGV[12]), tonumber(ARGV[13])
    if site ~= in_site and (in_ts < ts or (in_ts == ts and in_site < site)) then
      redis.call('HSET', KEYS[5], ARGV[6], seq)
      return {'STALE', false, false}
    end
  end
end
local meta = redis.call('HGET', KEYS[3], key)
local old = false
if ARGV[10] == '1' then
  old = redis.call('HGET', KEYS[2], key)
end
-- Geode's conditional operations (Region.putIfAbsent, replace, remove; RegionMapPut's
-- create and expected-old-value preconditions): the condition is read here, atomic with the
-- change. A putIfAbsent finds an invalid entry present, as Geode's does. One whose condition
-- fails changes nothing and keeps the current value with its recorded result.
if kind == 'PUT_IF_ABSENT' or kind == 'REPLACE' or kind == 'REMOVE' or kind == 'LOAD_CREATE' then
  local current = false
  if meta then current = redis.call('HGET', KEYS[2], key) end
  local holds
  if kind == 'PUT_IF_ABSENT' then
    holds = not meta
  elseif kind == 'LOAD_CREATE' then
    -- A loader's value (broker/loading.py) fills a key with no value, an invalid one
    -- included (Geode loads on a get of an invalid entry too); a put that came first wins.
    holds = not current
  elseif kind == 'REPLACE' then
    holds = meta and (ARGV[19] ~= '1' or current == ARGV[20])
  elseif ARGV[19] == '1' then
    holds = meta and current == ARGV[20]
  else
    holds = meta and not current
  end
  if not holds then
    local current_serializer = false
    if current then current_serializer = string.match(meta, '|(.*)$') or '' end
    record('NOOP', current, current_serializer)
    return {'NOOP', false, current, current_serializer}
  end
  if kind == 'REMOVE' then kind = 'DESTROY' else kind = 'PUT' end
end
-- A function's local destroy or invalidate (broker/functions.py) changes the store as the
-- distributed one does; the server tells no client of it.
if kind == 'LOCAL_DESTROY' then
  kind = 'DESTROY'
elseif kind == 'LOCAL_INVALIDATE' then
  kind = 'INVALIDATE'
end
local result
if kind == 'PUT' then
  local version = next_version(KEYS[4])
  redis.call('HSET', KEYS[2], key, ARGV[4])
  redis.call('HSET', KEYS[3], key, version .. '|' .. ARGV[5])
  if meta then result = 'UPDATE|' .. version else result = 'CREATE|' .. version end
elseif kind == 'DESTROY' then
  if not meta then return {'ERR', 'EntryNotFoundError', false} end
  local version = next_version(KEYS[4])
  redis.call('HDEL', KEYS[2], key)
  redis.call('HDEL', KEYS[3], key)
  result = 'DESTROY|' .. version
elseif kind == 'INVALIDATE' then
  if not meta then return {'ERR', 'EntryNotFoundError', false} end
  local version = next_version(KEYS[4])
  local serializer = string.match(meta, '|(.*)$') or ''
  redis.call('HDEL', KEYS[2], key)
  redis.call('HSET', KEYS[3], key, version .. '|' .. serializer)
  result = 'INVALIDATE|' .. version
else
  return {'ERR', 'ServerOperationError', false}
end
-- Entry expiration (broker/expiration.py): a create or update sets both times and schedules
-- the entry at the earlier deadline (Geode LocalRegion.updateStatsForPut); a destroy
-- unschedules it; an invalidate unschedules it when the action only invalidates, as there is
-- nothing left to invalidate (Geode EntryExpiryTask.isPending).
local ttl, idle = tonumber(ARGV[15]) or 0, tonumber(ARGV[16]) or 0
if kind == 'DESTROY' then
  redis.call('ZREM', KEYS[10], key)
  redis.call('HDEL', KEYS[11], key)
elseif ttl > 0 or idle > 0 then
  if kind == 'PUT' then
    local now = tonumber(ARGV[17])
    local at = now + ttl
    if ttl == 0 or (idle > 0 and idle < ttl) then at = now + idle end
    redis.call('HSET', KEYS[11], key, now .. '|' .. now)
    redis.call('ZADD', KEYS[10], at, key)
  elseif ARGV[18] ~= '1' then
    redis.call('ZREM', KEYS[10], key)
  end
end
-- Gateway version of the entry (kept after a destroy as a tombstone for the check above).
if ARGV[12] ~= '' then
  redis.call('HSET', KEYS[9], key, ARGV[12] .. '|' .. ARGV[13])
end
-- The old value asked for is kept with the result, so the change read again after a
-- failover is evaluated against the same old value (continuous queries, docs/behaviour.md §9).
local old_serializer = false
if old then old_serializer = string.match(meta, '|(.*)$') or '' end
record(result, old, old_serializer)
return {'OK', result, old, old_serializer}
