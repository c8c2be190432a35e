-- Expire one entry whose expiry time has come (broker/expiration.py), atomically, fenced by
-- the bucket primary's epoch. The entry's schedule is read again here, so a create, update or
-- get that pushed its expiry back since the primary looked wins.
--
-- KEYS: 1 regions set, 2 values hash, 3 meta hash, 4 region version counter,
--       5 the bucket's fencing epoch counter, 6 expiry sorted set, 7 entry times hash
-- ARGV: 1 region, 2 key, 3 now ms, 4 action ("DESTROY" or "INVALIDATE"),
--       5 the caller's epoch of the bucket ("" = unfenced), 6 want_old ("1"/"0")
-- Returns: {status, result, old_value}
--   status "OK":      result = "<EVENT_KIND>|<version>"
--   status "NOT_DUE": the entry's expiry is later now; nothing changed
--   status "GONE":    nothing left to expire (entry destroyed, region gone, or already
--                     invalid under an invalidate action); its schedule is dropped
--   status "FENCED":  the caller's epoch is stale (another server is primary): nothing done
if ARGV[5] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[5] then
  return {'FENCED', false, false}
end
local key = ARGV[2]
local due = redis.call('ZSCORE', KEYS[6], key)
if not due then
  return {'GONE', false, false}
end
if tonumber(due) > tonumber(ARGV[3]) then
  return {'NOT_DUE', false, false}
end
local meta = redis.call('HGET', KEYS[3], key)
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 or not meta then
  redis.call('ZREM', KEYS[6], key)
  redis.call('HDEL', KEYS[7], key)
  return {'GONE', false, false}
end
local old = false
if ARGV[6] == '1' then
  old = redis.call('HGET', KEYS[2], key)
end
local result
if ARGV[4] == 'DESTROY' then
  local version = redis.call('INCR', KEYS[4])
  redis.call('HDEL', KEYS[2], key)
  redis.call('HDEL', KEYS[3], key)
  redis.call('HDEL', KEYS[7], key)
  result = 'DESTROY|' .. version
else
  if redis.call('HEXISTS', KEYS[2], key) == 0 then
    redis.call('ZREM', KEYS[6], key)
    return {'GONE', false, false}
  end
  local version = redis.call('INCR', KEYS[4])
  local serializer = string.match(meta, '|(.*)$') or ''
  redis.call('HDEL', KEYS[2], key)
  redis.call('HSET', KEYS[3], key, version .. '|' .. serializer)
  result = 'INVALIDATE|' .. version
end
redis.call('ZREM', KEYS[6], key)
return {'OK', result, old}
