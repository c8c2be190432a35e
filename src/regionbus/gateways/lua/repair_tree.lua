-- The inner nodes of a repair's Merkle tree of one region in one bucket (regionbus gateway
-- repair), built once from the leaves repair_digest.lua left, so that reading an upper node
-- later is one HMGET field. A node of span s covers the leaves [n * 2^s, (n + 1) * 2^s);
-- its digest is the XOR of theirs. The tree is binary (the descent relies on it). Nodes
-- without entries are not written (their digest is 0), nor are the nodes of spans below
-- the lowest stored one: they are most of the tree, and repair_nodes.lua computes the few
-- the descent asks for from their leaves.
--
-- KEYS: 1 the run's leaf hash (leaf -> digest), 2 the run's node hash
--       ("<span>:<node>" -> digest)
-- ARGV: 1 leaf_bits, 2 the lowest stored span, 3 the node hash's time to live s
-- Returns: the number of nodes written
local leaves = redis.call('HGETALL', KEYS[1])
local leaf_bits, lowest = tonumber(ARGV[1]), tonumber(ARGV[2])
local level = {}
for i = 1, #leaves, 2 do level[tonumber(leaves[i])] = tonumber(leaves[i + 1]) end
local written = 0
local span = 0
while span < leaf_bits do
  span = span + 1
  local up = {}
  for node, digest in pairs(level) do
    local parent = math.floor(node / 2)
    local acc = up[parent]
    if acc then up[parent] = bit.bxor(acc, digest) else up[parent] = digest end
  end
  if span >= lowest then
    local out = {}
    for node, digest in pairs(up) do
      out[#out + 1] = span .. ':' .. node
      out[#out + 1] = digest
      written = written + 1
      if #out >= 4000 then  -- one HSET per 2,000 nodes, within unpack's stack
        redis.call('HSET', KEYS[2], unpack(out))
        out = {}
      end
    end
    if #out > 0 then redis.call('HSET', KEYS[2], unpack(out)) end
  end
  level = up
end
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return written
