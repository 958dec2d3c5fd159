-- The baseline of the lab's Redis measurements: the GCRA of go-redis's
-- redis_rate (its `allowN` script), restated here so that its algorithm runs
-- through the same client as tollgate's script. It does what that script
-- does per call: TIME, GET, and on admission SET with EX; floats in seconds
-- since 2017-01-01, the TAT stored as a float.
--
-- KEYS[1] the key; ARGV burst, rate, period in seconds, cost.
-- Returns allowed (the cost or 0), remaining, retry_after and reset_after
-- (seconds, as strings).

redis.replicate_commands()

local key = KEYS[1]
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])

local interval = period / rate
local increment = interval * cost
local burst_offset = interval * burst

local time = redis.call("TIME")
local now = (tonumber(time[1]) - 1483228800) + tonumber(time[2]) / 1000000

local tat = tonumber(redis.call("GET", key) or now)
if tat < now then
  tat = now
end

local new_tat = tat + increment
local diff = now - (new_tat - burst_offset)
local remaining = diff / interval
if remaining < 0 then
  return { 0, 0, tostring(-diff), tostring(tat - now) }
end

local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", key, new_tat, "EX", math.ceil(reset_after))
end
return { cost, math.floor(remaining), tostring(-1), tostring(reset_after) }
