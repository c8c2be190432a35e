-- One step of a repair's digest of one region in one bucket (regionbus gateway repair):
-- the Merkle tree's leaves, kept in Redis beside the data so that only the tree's nodes
-- ever leave the site.
--
-- Each entry (a key of the meta hash: valid or invalid, not destroyed) falls in the leaf
-- given by the first 16 bits of SHA-1(key), shifted to leaf_bits; a leaf's digest is the
-- XOR of SHA-1(key NUL gateway version) over its entries (64 bits, in two 32-bit halves),
-- with their count. XOR makes it independent of the order HSCAN returns the entries in,
-- and lets the steps add up.
--
-- KEYS: 1 meta hash, 2 gateway versions hash, 3 the run's leaf hash
--       (leaf -> "<high>:<low>:<count>")
-- ARGV: 1 HSCAN cursor, 2 COUNT, 3 leaf_bits (1-16), 4 the leaf hash's time to live s
-- Returns: the next cursor ("0" when the region's bucket is done)
local scan = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local shift = 2 ^ (16 - tonumber(ARGV[3]))
local fields = scan[2]
for i = 1, #fields, 2 do
  local key = fields[i]
  local version = redis.call('HGET', KEYS[2], key) or ''
  local leaf = math.floor(tonumber(string.sub(redis.sha1hex(key), 1, 4), 16) / shift)
  local h = redis.sha1hex(key .. '\0' .. version)
  local high, low = tonumber(string.sub(h, 1, 8), 16), tonumber(string.sub(h, 9, 16), 16)
  local current = redis.call('HGET', KEYS[3], leaf)
  local count = 1
  if current then
    local a, b, n = string.match(current, '^(-?%d+):(-?%d+):(%d+)$')
    high, low, count = bit.bxor(high, tonumber(a)), bit.bxor(low, tonumber(b)), tonumber(n) + 1
  else
    high, low = bit.tobit(high), bit.tobit(low)
  end
  redis.call('HSET', KEYS[3], leaf, high .. ':' .. low .. ':' .. count)
end
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[4]))
return scan[1]
