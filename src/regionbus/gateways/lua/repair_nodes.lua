-- Some nodes of a repair's Merkle tree of one region in one bucket (regionbus gateway
-- repair): leaves (span 0) from the leaf hash, nodes of a stored span from the node hash
-- that repair_tree.lua built, nodes of a lower span from their leaves (at most
-- 2^(lowest stored span - 1) leaves a node). Either reads their digests, or compares them
-- with the other site's, so that only one site's digests cross between the sites.
--
-- KEYS: 1 the run's leaf hash, 2 the run's node hash
-- ARGV: 1 span bits s, 2 "" to read, or the other site's digests of the same nodes
--       (4 bytes each, as this script returns them) to compare, 3 the lowest stored span,
--       4... node numbers
-- Returns: reading: 4 bytes per node, in ARGV's order (the signed 32-bit digest, big-
--          endian; zeros for a node without entries); comparing: a bitmap, one bit per
--          node asked for (first node: the high bit of the first byte), set where the
--          digests differ, or "" when none differs
local function hmget(key, fields)
  local out = {}
  for start = 1, #fields, 4000 do  -- within unpack's stack
    local part = redis.call('HMGET', key, unpack(fields, start, math.min(start + 3999, #fields)))
    for i = 1, #part do out[#out + 1] = part[i] end
  end
  return out
end

local span, lowest = tonumber(ARGV[1]), tonumber(ARGV[3])
local digests = {}
if span == 0 or span >= lowest then
  local fields = {}
  for i = 4, #ARGV do
    if span == 0 then fields[#fields + 1] = ARGV[i]
    else fields[#fields + 1] = span .. ':' .. ARGV[i] end
  end
  local values = hmget(span == 0 and KEYS[1] or KEYS[2], fields)
  for i = 1, #values do digests[i] = tonumber(values[i]) or 0 end
else
  local width = 2 ^ span
  local fields = {}
  for i = 4, #ARGV do
    local first = tonumber(ARGV[i]) * width
    for j = 0, width - 1 do fields[#fields + 1] = first + j end
  end
  local values = hmget(KEYS[1], fields)
  for i = 4, #ARGV do
    local acc, base = 0, (i - 4) * width
    for j = 1, width do
      if values[base + j] then acc = bit.bxor(acc, tonumber(values[base + j])) end
    end
    digests[#digests + 1] = acc
  end
end
local other = ARGV[2]
local out = {}
local bits, any = {}, false
for i = 1, #digests do
  local mine = struct.pack('>i4', digests[i])
  if other == '' then
    out[#out + 1] = mine
  else
    local byte = math.floor((i - 1) / 8) + 1
    bits[byte] = bits[byte] or 0
    if string.sub(other, (i - 1) * 4 + 1, i * 4) ~= mine then
      bits[byte] = bits[byte] + 2 ^ (7 - (i - 1) % 8)
      any = true
    end
  end
end
if other ~= '' then
  if not any then return '' end
  for i = 1, #bits do out[i] = string.char(bits[i]) end
end
return table.concat(out)
