-- Forget stored apply results of operations below a committed {ns}.ops offset: they can
-- no longer be re-processed after a failover.
-- KEYS: 1 results hash, 2 results index; ARGV: 1 offset (exclusive upper bound)
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1])
for i = 1, #ids, 500 do
  redis.call('HDEL', KEYS[1], unpack(ids, i, math.min(i + 499, #ids)))
end
-- and the old values (and their serializers) kept with them (apply_entry.lua)
for _, suffix in ipairs({'|old', '|olds'}) do
  local kept = {}
  for i = 1, #ids do kept[i] = ids[i] .. suffix end
  for i = 1, #kept, 500 do
    redis.call('HDEL', KEYS[1], unpack(kept, i, math.min(i + 499, #kept)))
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1])
return #ids
