-- Apply one EXPIRE operation (broker/expiration.py), read from the bucket's partition of
-- {ns}.ops, atomically, fenced by the bucket primary's epoch. It takes effect only when it is
-- the expiration its primary claimed (claim_expiry.lua: same sequence id, expiry time and
-- member) and the entry's schedule is still that expiry time, so a create, update or get
-- since the claim wins, and an operation no primary claimed (a client's) changes nothing.
-- Its result is stored under its EventID like any change's (apply_entry.lua), so the
-- operation read again after a failover gives the same event again (status DUP).
--
-- KEYS: 1 the bucket's regions set, 2 values hash, 3 meta hash, 4 the bucket's region
--       version hash (version.lua),
--       5 the bucket's fencing epoch counter, 6 expiry sorted set, 7 entry times hash,
--       8 claims hash, 9 tracking hash, 10 results hash, 11 results index
-- ARGV: 1 region, 2 key, 3 expiry ms, 4 action ("DESTROY" or "INVALIDATE"),
--       5 the caller's epoch of the bucket ("" = unfenced), 6 want_old ("1"/"0"),
--       7 the operation's member (client id), 8 tracking field (member:thread),
--       9 sequence id, 10 EventID string, 11 ops offset
-- Returns: {status, result, old_value}
--   status "OK":        result = "<EVENT_KIND>|<version>"
--   status "DUP":       result = stored result of that EventID (applied before)
--   status "UNCLAIMED": no primary claimed this expiration (or another claims it now)
--   status "STALE":     a later expiration of the bucket was applied first (its event
--                       would look like a duplicate); the claim is dropped, to be made
--                       again with a new sequence id
--   status "GONE":      the entry's schedule changed or nothing is left to expire
--   status "FENCED":    the caller's epoch is stale (another server is primary)
--@include version.lua@--
if ARGV[5] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[5] then
  return {'FENCED', false, false}
end
local stored = redis.call('HGET', KEYS[10], ARGV[10])
if stored then
  -- Written again, unchanged, so a WAIT after this call also covers the first apply.
  redis.call('HSET', KEYS[10], ARGV[10], stored)
  return {'DUP', stored, redis.call('HGET', KEYS[10], ARGV[10] .. '|old'),
    redis.call('HGET', KEYS[10], ARGV[10] .. '|olds')}
end
local key, at, seq = ARGV[2], ARGV[3], tonumber(ARGV[9])
if redis.call('HGET', KEYS[8], key) ~= ARGV[9] .. '|' .. at .. '|' .. ARGV[7] then
  return {'UNCLAIMED', false, false}
end
redis.call('HDEL', KEYS[8], key)
local last = redis.call('HGET', KEYS[9], ARGV[8])
if last and tonumber(last) >= seq then
  return {'STALE', false, false}
end
local due = redis.call('ZSCORE', KEYS[6], key)
if not due or tonumber(due) ~= tonumber(at) then
  return {'GONE', false, false}
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
  local version = next_version(KEYS[4])
  redis.call('HDEL', KEYS[2], key)
  redis.call('HDEL', KEYS[3], key)
  redis.call('HDEL', KEYS[7], key)
  result = 'DESTROY|' .. version
else
  if redis.call('HEXISTS', KEYS[2], key) == 0 then
    redis.call('ZREM', KEYS[6], key)
    return {'GONE', false, false}
  end
  local version = next_version(KEYS[4])
  local serializer = string.match(meta, '|(.*)$') or ''
  redis.call('HDEL', KEYS[2], key)
  redis.call('HSET', KEYS[3], key, version .. '|' .. serializer)
  result = 'INVALIDATE|' .. version
end
redis.call('ZREM', KEYS[6], key)
redis.call('HSET', KEYS[9], ARGV[8], seq)
redis.call('HSET', KEYS[10], ARGV[10], result)
local old_serializer = false
if old then
  old_serializer = string.match(meta, '|(.*)$') or ''
  redis.call('HSET', KEYS[10], ARGV[10] .. '|old', old)
  redis.call('HSET', KEYS[10], ARGV[10] .. '|olds', old_serializer)
end
redis.call('ZADD', KEYS[11], tonumber(ARGV[11]), ARGV[10])
return {'OK', result, old, old_serializer}
