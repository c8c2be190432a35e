-- Begin a region operation (CLEAR, DESTROY_REGION, INVALIDATE_REGION), in the slot of the
-- region's own bucket (schemas/naming.py region_bucket), the one whose partition of {ns}.ops
-- orders it. Its effect is applied bucket by bucket (region_bucket_op.lua, one call per
-- bucket: a Redis Cluster refuses a script over many slots), then recorded
-- (region_finish.lua). It takes the next generation of the region: every bucket it reaches
-- starts its versions over above it (version.lua), so the operation's version is above every
-- change a bucket had before it and below every change after, in every bucket. A generation
-- begun and not finished (a primary that died on the way) is kept under the EventID, so the
-- operation read again gets the same generation and the buckets it reached are not cleared
-- twice.
--
-- KEYS: 1 the bucket's regions set, 2 tracking hash, 3 results hash,
--       4 the bucket's fencing epoch counter, 5 the bucket's region version hash
-- ARGV: 1 region, 2 tracking field (member:thread), 3 sequence id, 4 EventID string,
--       5 the caller's epoch of the bucket ("" = unfenced)
-- Returns: {'GO', generation}, or as apply_entry.lua: {'FENCED', false},
--          {'ERR', 'RegionNotFoundError'}, {'DUP', stored result or false}
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[5] then
  return {'FENCED', false}
end
local seq = tonumber(ARGV[3])
local last = redis.call('HGET', KEYS[2], ARGV[2])
if last and tonumber(last) >= seq then
  -- Written again, unchanged, so a WAIT after this call also covers the first apply.
  redis.call('HSET', KEYS[2], ARGV[2], last)
  return {'DUP', redis.call('HGET', KEYS[3], ARGV[4])}
end
local field = 'op:' .. ARGV[4]
local gen = redis.call('HGET', KEYS[5], field)
if not gen then
  if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
    return {'ERR', 'RegionNotFoundError'}
  end
  gen = redis.call('HINCRBY', KEYS[5], 'ops', 1)
  redis.call('HSET', KEYS[5], field, gen)
end
return {'GO', tostring(gen)}
