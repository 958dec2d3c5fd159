-- GCRA in integer microseconds (notes/10). Every number here is an
-- integer below 2^53, so Lua's doubles hold it exactly; no timestamp is
-- ever formatted with tostring (which rounds to 14 digits).
--
-- KEYS[1]  the key's theoretical arrival time (TAT), in microseconds
-- ARGV[1]  emission interval, microseconds (rounded up by the caller)
-- ARGV[2]  burst
-- ARGV[3]  cost, at least 1 and at most burst (validated by the caller)
-- ARGV[4]  now in microseconds, or "" for the server's TIME
--
-- Returns {allowed, remaining, retry_after_us, reset_after_us}.
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now
if ARGV[4] == "" then
  local time = redis.call("TIME")
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[4])
end

local tolerance = burst * interval
local tat = tonumber(redis.call("GET", KEYS[1]) or "0")
local debt = 0
if tat > now then
  debt = tat - now
end
local cost_us = cost * interval
local max_debt = tolerance - cost_us

local function units_free(d)
  local free = tolerance - d
  if free < interval then
    return 0
  end
  return math.floor(free / interval)
end

if debt <= max_debt then
  local new_debt = debt + cost_us
  -- The key expires when it would decide as a fresh key: at its TAT.
  redis.call("SET", KEYS[1], string.format("%d", now + new_debt),
    "PX", math.ceil(new_debt / 1000))
  return {1, units_free(new_debt), 0, new_debt}
end
return {0, units_free(debt), debt - max_debt, debt}
