-- Record a server get of an entry as an access (Geode LocalRegion.updateStatsForGet): its
-- idle deadline moves to now + idle timeout, and its expiry to the earlier of that and its
-- time-to-live deadline (Geode ExpiryTask.getExpirationTime). An invalid entry whose
-- expiration only invalidates stays unscheduled: there is nothing left to invalidate.
--
-- KEYS: 1 meta hash, 2 values hash, 3 expiry sorted set, 4 entry times hash
-- ARGV: 1 key, 2 entry time-to-live ms, 3 entry idle timeout ms, 4 now ms,
--       5 "1" when the region's expiration action destroys
-- Returns: the entry's new expiry ms, or 0 when it is not scheduled
local key = ARGV[1]
local ttl, idle, now = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if idle <= 0 or not redis.call('HGET', KEYS[1], key) then
  return 0
end
if ARGV[5] ~= '1' and redis.call('HEXISTS', KEYS[2], key) == 0 then
  return 0
end
local modified = now
local times = redis.call('HGET', KEYS[4], key)
if times then
  modified = tonumber(string.match(times, '^(%d+)|')) or now
end
local at = now + idle
if ttl > 0 and modified + ttl < at then
  at = modified + ttl
end
redis.call('HSET', KEYS[4], key, modified .. '|' .. now)
redis.call('ZADD', KEYS[3], at, key)
return at
