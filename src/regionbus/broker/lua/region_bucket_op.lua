-- Apply a begun region operation (region_begin.lua) to one bucket, once: a bucket already at
-- its generation or a later one is left alone (the operation read again after a failover, or
-- a paused old primary waking up, changes nothing twice). CLEAR and DESTROY_REGION drop the
-- bucket's entries (DESTROY_REGION also its copy of the region's name); INVALIDATE_REGION
-- keeps every key, drops its value and gives it the operation's version, as an entry
-- invalidate does per key.
--
-- KEYS: 1 the bucket's regions set, 2 the bucket's region version hash, 3 values hash,
--       4 meta hash, 5 gateway versions hash, 6 expiry set, 7 entry times hash
-- ARGV: 1 kind, 2 region, 3 generation
-- Returns: 1 applied now, 0 applied before
--@include version.lua@--
local gen = ARGV[3]
local current = redis.call('HGET', KEYS[2], 'gen')
if current and tonumber(current) >= tonumber(gen) then
  return 0
end
redis.call('HSET', KEYS[2], 'gen', gen, 'n', 0)
if ARGV[1] == 'INVALIDATE_REGION' then
  local version = version_of(gen, 0)
  local meta = redis.call('HGETALL', KEYS[4])
  for j = 1, #meta, 2 do
    local serializer = string.match(meta[j + 1], '|(.*)$') or ''
    redis.call('HSET', KEYS[4], meta[j], version .. '|' .. serializer)
  end
  redis.call('DEL', KEYS[3])
else
  redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
  if ARGV[1] == 'DESTROY_REGION' then
    redis.call('SREM', KEYS[1], ARGV[2])
  end
end
return 1
