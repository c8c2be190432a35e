-- Apply the entry operations of one poll batch, in order, in one script call: one Redis
-- command per batch instead of one per operation. Each operation runs apply_entry.lua's
-- body unchanged (fencing epoch, EventID duplicate detection, gateway conflict check,
-- expiration bookkeeping), so it behaves exactly as if it were called alone.
--
-- KEYS: the 11 keys of apply_entry.lua of every operation, one operation after the other
-- ARGV: the 20 arguments of apply_entry.lua of every operation, in the same order
-- Returns: one {status, result, old_value, old_serializer} per operation, as apply_entry.lua's
--
-- In a Redis Cluster every key of one call is in one slot: the caller makes one call per
-- bucket (broker/store/entries.py).
local ENTRY_KEYS, ENTRY_ARGS = 11, 20
--@include version.lua@--
local apply_entry = function(KEYS, ARGV)
--@include apply_entry.lua@--
end
local results = {}
for i = 0, #ARGV / ENTRY_ARGS - 1 do
  local keys, args = {}, {}
  for j = 1, ENTRY_KEYS do keys[j] = KEYS[i * ENTRY_KEYS + j] end
  for j = 1, ENTRY_ARGS do args[j] = ARGV[i * ENTRY_ARGS + j] end
  results[i + 1] = apply_entry(keys, args)
end
return results
