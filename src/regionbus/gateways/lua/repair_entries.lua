-- One step of reading the entries of some leaves of a repair's Merkle tree of one region
-- in one bucket (regionbus gateway repair): the leaves whose digests differ between the
-- two sites, and only them, leave the site.
--
-- KEYS: 1 meta hash, 2 gateway versions hash
-- ARGV: 1 HSCAN cursor, 2 COUNT, 3 leaf_bits, 4... the leaves wanted
-- Returns: {next cursor, key, gateway version, ...} for the entries of the wanted leaves
--          among those scanned; a version in 7 bytes (big-endian: the timestamp ms in 6,
--          the site id in 1) rather than its 15 characters, or "" when the entry has none
local scan = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local shift = 2 ^ (24 - tonumber(ARGV[3]))
local wanted = {}
for i = 4, #ARGV do wanted[tonumber(ARGV[i])] = true end
local out = {scan[1]}
local fields = scan[2]
for i = 1, #fields, 2 do
  local key = fields[i]
  local leaf = math.floor(tonumber(string.sub(redis.sha1hex(key), 1, 6), 16) / shift)
  if wanted[leaf] then
    out[#out + 1] = key
    local version = redis.call('HGET', KEYS[2], key)
    local packed = ''
    if version then
      local ms, site = string.match(version, '^(%d+)|(%d+)$')
      ms = tonumber(ms)
      packed = struct.pack('>I2I4B', math.floor(ms / 4294967296), ms % 4294967296, tonumber(site))
    end
    out[#out + 1] = packed
  end
end
return out
