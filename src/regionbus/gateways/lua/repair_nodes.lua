-- Some nodes of a repair's Merkle tree of one region in one bucket (regionbus gateway
-- repair): leaves (span 0) from the leaf hash, inner nodes from the node hash that
-- repair_tree.lua built. Either reads their digests, or compares them with the other
-- site's, so that only one site's digests cross between the sites.
--
-- KEYS: 1 the run's leaf hash, 2 the run's node hash
-- ARGV: 1 span bits s, 2 "" to read, or the other site's digests of the same nodes
--       (8 bytes each, as this script returns them) to compare, 3... node numbers
-- Returns: reading: 8 bytes per node, in ARGV's order (two big-endian 32-bit halves;
--          zeros for a node without entries); comparing: 4 bytes (big-endian) per node
--          whose digest differs, its position among the nodes asked for
local fields = {}
for i = 3, #ARGV do
  if ARGV[1] == '0' then fields[#fields + 1] = ARGV[i]
  else fields[#fields + 1] = ARGV[1] .. ':' .. ARGV[i] end
end
local values
if ARGV[1] == '0' then
  values = redis.call('HMGET', KEYS[1], unpack(fields))
else
  values = redis.call('HMGET', KEYS[2], unpack(fields))
end
local other = ARGV[2]
local out = {}
for i = 1, #values do
  local a, b = 0, 0
  if values[i] then
    local x, y = string.match(values[i], '^(-?%d+):(-?%d+)')
    a, b = tonumber(x), tonumber(y)
  end
  local mine = struct.pack('>i4i4', a, b)
  if other == '' then
    out[#out + 1] = mine
  elseif string.sub(other, (i - 1) * 8 + 1, i * 8) ~= mine then
    out[#out + 1] = struct.pack('>I4', i - 1)
  end
end
return table.concat(out)
