-- Entry versions (schemas/naming.py RedisKeys.region_version, entry_version): each bucket of
-- a region counts its own changes in a hash {gen, n}; a version is the bucket's generation
-- (the last region operation it applied, 0 before any) followed by its change counter on
-- VERSION_DIGITS digits. Built as text: Redis' Lua numbers are doubles, exact below 2^53.
local VERSION_DIGITS = 12
local function version_of(gen, n)
  if not gen or gen == '0' then
    return string.format('%d', n)
  end
  return gen .. string.format('%0' .. VERSION_DIGITS .. 'd', n)
end
-- The version of the next change of the bucket whose version hash is `key`.
local function next_version(key)
  local n = redis.call('HINCRBY', key, 'n', 1)
  return version_of(redis.call('HGET', key, 'gen'), n)
end
