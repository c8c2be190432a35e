-- The digests of some nodes of a repair's Merkle tree of one region in one bucket
-- (regionbus gateway repair), from the leaves repair_digest.lua left in Redis. A node of
-- span s covers the leaves [node * 2^s, (node + 1) * 2^s); its digest is the XOR of theirs.
--
-- KEYS: 1 the run's leaf hash
-- ARGV: 1 span bits s, 2... node numbers
-- Returns: one "<high>:<low>" per node, in ARGV's order ("0:0" for a node with no entries)
local leaves = redis.call('HGETALL', KEYS[1])
local span = 2 ^ tonumber(ARGV[1])
local wanted = {}
for i = 2, #ARGV do wanted[tonumber(ARGV[i])] = {0, 0} end
for i = 1, #leaves, 2 do
  local node = math.floor(tonumber(leaves[i]) / span)
  local acc = wanted[node]
  if acc then
    local a, b = string.match(leaves[i + 1], '^(-?%d+):(-?%d+):')
    acc[1], acc[2] = bit.bxor(acc[1], tonumber(a)), bit.bxor(acc[2], tonumber(b))
  end
end
local out = {}
for i = 2, #ARGV do
  local acc = wanted[tonumber(ARGV[i])]
  out[#out + 1] = acc[1] .. ':' .. acc[2]
end
return out
