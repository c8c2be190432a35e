-- The inner nodes of a repair's Merkle tree of one region in one bucket (regionbus gateway
-- repair), built once from the leaves repair_digest.lua left, so that reading any node
-- later is one HMGET. A node of span s covers the leaves [n * 2^s, (n + 1) * 2^s); its
-- digest is the XOR of theirs. Nodes without entries are not written (their digest is 0).
--
-- KEYS: 1 the run's leaf hash (leaf -> "<high>:<low>:<count>"),
--       2 the run's node hash ("<span>:<node>" -> "<high>:<low>")
-- ARGV: 1 leaf_bits, 2 fanout bits (the span grows by it from level to level),
--       3 the node hash's time to live s
-- Returns: the number of nodes written
local leaves = redis.call('HGETALL', KEYS[1])
local leaf_bits, fanout = tonumber(ARGV[1]), tonumber(ARGV[2])
local level = {}
for i = 1, #leaves, 2 do
  local a, b = string.match(leaves[i + 1], '^(-?%d+):(-?%d+):')
  level[tonumber(leaves[i])] = {tonumber(a), tonumber(b)}
end
local written = 0
local span = 0
while span < leaf_bits do
  span = span + fanout
  local up = {}
  local divide = 2 ^ fanout
  for node, digest in pairs(level) do
    local parent = math.floor(node / divide)
    local acc = up[parent]
    if acc then
      acc[1], acc[2] = bit.bxor(acc[1], digest[1]), bit.bxor(acc[2], digest[2])
    else
      up[parent] = {digest[1], digest[2]}
    end
  end
  for node, digest in pairs(up) do
    redis.call('HSET', KEYS[2], span .. ':' .. node, digest[1] .. ':' .. digest[2])
    written = written + 1
  end
  level = up
end
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return written
