-- Record a region operation applied to every bucket (region_begin.lua): its EventID is
-- tracked and its result stored in the region's own bucket, as an entry operation's
-- (apply_entry.lua), and the generation kept for it is dropped.
--
-- KEYS: 1 tracking hash, 2 results hash, 3 results index, 4 the bucket's fencing epoch
--       counter, 5 the bucket's region version hash
-- ARGV: 1 tracking field, 2 sequence id, 3 EventID string, 4 ops offset,
--       5 the caller's epoch ("" = unfenced), 6 result "<EVENT_KIND>|<version>"
-- Returns: {'OK', result} or {'FENCED', false}
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[5] then
  return {'FENCED', false}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[6])
redis.call('ZADD', KEYS[3], tonumber(ARGV[4]), ARGV[3])
redis.call('HDEL', KEYS[5], 'op:' .. ARGV[3])
return {'OK', ARGV[6]}
