-- One step of reading the entries of some leaves of a repair's Merkle tree of one region
-- in one bucket (regionbus gateway repair): the leaves whose digests differ between the
-- two sites, and only them, leave the site.
--
-- KEYS: 1 meta hash, 2 gateway versions hash
-- ARGV: 1 HSCAN cursor, 2 COUNT, 3 leaf_bits, 4... the leaves wanted
-- Returns: {next cursor, key, gateway version ("" when none), ...} for the entries of the
--          wanted leaves among those scanned
local scan = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local shift = 2 ^ (16 - tonumber(ARGV[3]))
local wanted = {}
for i = 4, #ARGV do wanted[tonumber(ARGV[i])] = true end
local out = {scan[1]}
local fields = scan[2]
for i = 1, #fields, 2 do
  local key = fields[i]
  local leaf = math.floor(tonumber(string.sub(redis.sha1hex(key), 1, 4), 16) / shift)
  if wanted[leaf] then
    out[#out + 1] = key
    out[#out + 1] = redis.call('HGET', KEYS[2], key) or ''
  end
end
return out
