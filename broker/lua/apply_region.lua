-- Apply a region operation (CLEAR, DESTROY_REGION, INVALIDATE_REGION) atomically over every
-- bucket. INVALIDATE_REGION keeps every key and drops its value, at one new region version
-- (as an entry invalidate does per key).
--
-- KEYS: 1 regions set, 2 region version counter, 3 tracking hash, 4 results hash,
--       5 results index, 6 the fencing epoch counter of the region's bucket, then for each
--       bucket its values, meta and gateway versions hashes, expiry set and entry times hash
-- ARGV: 1 kind, 2 region, 3 tracking field, 4 sequence id, 5 EventID string, 6 ops offset,
--       7 the caller's epoch ("" = unfenced)
-- Returns: {status, result}; status as in apply_entry.lua, result "<EVENT_KIND>|<version>"
if ARGV[7] ~= '' and redis.call('GET', KEYS[6]) ~= ARGV[7] then
  return {'FENCED', false}
end
if redis.call('SISMEMBER', KEYS[1], ARGV[2]) == 0 then
  return {'ERR', 'RegionNotFoundError'}
end
local seq = tonumber(ARGV[4])
local last = redis.call('HGET', KEYS[3], ARGV[3])
if last and tonumber(last) >= seq then
  return {'DUP', redis.call('HGET', KEYS[4], ARGV[5])}
end
local version = redis.call('INCR', KEYS[2])
local result
if ARGV[1] == 'INVALIDATE_REGION' then
  for i = 7, #KEYS, 5 do
    local meta = redis.call('HGETALL', KEYS[i + 1])
    for j = 1, #meta, 2 do
      local serializer = string.match(meta[j + 1], '|(.*)$') or ''
      redis.call('HSET', KEYS[i + 1], meta[j], version .. '|' .. serializer)
    end
    redis.call('DEL', KEYS[i])
  end
  result = 'REGION_INVALIDATE|' .. version
else
  for i = 7, #KEYS do
    redis.call('DEL', KEYS[i])
  end
end
if ARGV[1] == 'DESTROY_REGION' then
  redis.call('SREM', KEYS[1], ARGV[2])
  result = 'REGION_DESTROY|' .. version
elseif ARGV[1] == 'CLEAR' then
  result = 'REGION_CLEAR|' .. version
end
redis.call('HSET', KEYS[3], ARGV[3], seq)
redis.call('HSET', KEYS[4], ARGV[5], result)
redis.call('ZADD', KEYS[5], tonumber(ARGV[6]), ARGV[5])
return {'OK', result}
