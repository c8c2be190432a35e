-- One step of a repair's digest of one region in one bucket (regionbus gateway repair):
-- the Merkle tree's leaves, kept in Redis beside the data so that only the tree's nodes
-- ever leave the site.
--
-- Each entry (a key of the meta hash: valid or invalid, not destroyed) falls in the leaf
-- given by the first 24 bits of SHA-1(key), shifted to leaf_bits; a leaf's digest is the
-- XOR over its entries of the first 32 bits of SHA-1(run salt, key NUL gateway version).
-- XOR makes it independent of the order HSCAN returns the entries in, and lets the steps
-- add up. The salt, new each run, makes each run's digests new: two trees whose digests
-- collide in one run do not in the next. A step reads its entries' versions, and its
-- leaves, in one call each, and writes its leaves in one: three calls a step rather than
-- three an entry.
--
-- KEYS: 1 meta hash, 2 gateway versions hash, 3 the run's leaf hash (leaf -> digest, a
--       signed 32-bit integer)
-- ARGV: 1 HSCAN cursor, 2 COUNT, 3 leaf_bits (1-24), 4 the leaf hash's time to live s,
--       5 the run's salt
-- Returns: the next cursor ("0" when the region's bucket is done)
local scan = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local shift = 2 ^ (24 - tonumber(ARGV[3]))
local fields = scan[2]
local keys = {}
for i = 1, #fields, 2 do keys[#keys + 1] = fields[i] end
if #keys > 0 then
  local versions = redis.call('HMGET', KEYS[2], unpack(keys))
  local acc, order = {}, {}
  for i = 1, #keys do
    local key = keys[i]
    local leaf = math.floor(tonumber(string.sub(redis.sha1hex(key), 1, 6), 16) / shift)
    local h = redis.sha1hex(ARGV[5] .. key .. '\0' .. (versions[i] or ''))
    local digest = bit.tobit(tonumber(string.sub(h, 1, 8), 16))
    local a = acc[leaf]
    if a then
      acc[leaf] = bit.bxor(a, digest)
    else
      acc[leaf] = digest
      order[#order + 1] = leaf
    end
  end
  local current = redis.call('HMGET', KEYS[3], unpack(order))
  local out = {}
  for i = 1, #order do
    local a = acc[order[i]]
    if current[i] then a = bit.bxor(a, tonumber(current[i])) end
    out[#out + 1] = order[i]
    out[#out + 1] = a
  end
  redis.call('HSET', KEYS[3], unpack(out))
end
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[4]))
return scan[1]
