-- Claim the due entries of one bucket of a region for expiration (broker/expiration.py),
-- fenced by the bucket primary's epoch: each gets the sequence id of its EventID, kept in the
-- claims hash until its EXPIRE operation is applied (expire_entry.lua). An entry claimed
-- before for the same expiry time (by a primary that died before its operation was applied)
-- keeps its sequence id, so the operation produced again carries the same EventID; the
-- claim's member becomes the caller, the only producer expire_entry.lua accepts from now on.
--
-- KEYS: 1 the bucket's fencing epoch counter, 2 the bucket's expiry sequence counter,
--       3 claims hash, 4 expiry sorted set
-- ARGV: 1 the caller's epoch of the bucket, 2 the caller's member id,
--       then pairs: key, expiry ms (as read from the sorted set)
-- Returns: 'FENCED' (another server is primary: nothing claimed), else one sequence id per
--          pair, 0 when the entry's expiry changed since it was read (not claimed)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 'FENCED'
end
local out = {}
for i = 3, #ARGV, 2 do
  local key, at = ARGV[i], ARGV[i + 1]
  local due = redis.call('ZSCORE', KEYS[4], key)
  local seq = 0
  if due and tonumber(due) == tonumber(at) then
    local claim = redis.call('HGET', KEYS[3], key)
    if claim then
      local claimed_seq, claimed_at = string.match(claim, '^(%d+)|(%d+)|')
      if tonumber(claimed_at) == tonumber(at) then
        seq = tonumber(claimed_seq)
      end
    end
    if seq == 0 then
      seq = redis.call('INCR', KEYS[2])
    end
    redis.call('HSET', KEYS[3], key, seq .. '|' .. at .. '|' .. ARGV[2])
  end
  out[#out + 1] = seq
end
return out
