-- tollgate's five algorithms in integer microseconds (notes/10).
--
-- Lua numbers in Redis are doubles. Every number here is an integer below
-- 2^53, where doubles are exact: times are clamped by the caller to 2^52 us
-- (142 years after the clock's origin), every span is at most 2^51 us, and
-- the sliding window counter's products (a count times its window) are held
-- below 2^53 by the caller. Two consequences:
--
-- * `math.floor(a / b)` is the exact integer quotient for 0 <= a, 1 <= b,
--   a + b < 2^53: the double nearest a / b can round up to the next integer
--   k only if k * b >= 2^53 (see notes/10).
-- * No number is ever formatted with tostring (14 significant digits:
--   tostring(1764831234567891) is "1.7648312345679e+15"); stored integers go
--   through string.format("%d").
--
-- KEYS[i]            the Redis key of limit i
-- ARGV[1]            now in microseconds, or "" for the server's TIME
-- ARGV[2]            "1" to decide without writing (peek), else "0"
-- ARGV[3 + 4(i-1)..] limit i: algorithm, cost, constant a, constant b
--   algorithm "g" GCRA and "t" token bucket: a = emission interval, b = burst
--   algorithm "f" fixed window, "c" sliding window counter, "l" sliding
--   log: a = window, b = burst
--
-- All limits are decided first; only if every one admits are they written
-- (all or nothing). Returns four integers per limit: allowed (1 or 0),
-- remaining, retry_after_us, reset_after_us.

local now
if ARGV[1] == "" then
  local time = redis.call("TIME")
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[1])
end
local peek = ARGV[2] == "1"

local function idiv(a, b)
  return math.floor(a / b)
end

local function ceil_div(a, b)
  return idiv(a + b - 1, b)
end

local function int(n)
  return string.format("%d", n)
end

-- A key expires when it would decide as a fresh key, `us` from now; PX
-- counts milliseconds, so round up.
local function store(key, value, us)
  redis.call("SET", key, value, "PX", ceil_div(us, 1000))
end

local function numbers(value)
  local parsed = {}
  for word in string.gmatch(value or "", "%d+") do
    parsed[#parsed + 1] = tonumber(word)
  end
  return parsed
end

-- GCRA and the token bucket: a key owes `debt` microseconds of refill; a
-- cost fits while debt + cost * interval <= burst * interval.
local function debt_decision(debt, cost, interval, burst, write)
  local tolerance = burst * interval
  local cost_us = cost * interval
  local max_debt = tolerance - cost_us
  local function units_free(d)
    if tolerance - d < interval then
      return 0
    end
    return idiv(tolerance - d, interval)
  end
  if debt <= max_debt then
    local new_debt = debt + cost_us
    return { 1, units_free(new_debt), 0, new_debt }, function()
      write(new_debt)
    end
  end
  return { 0, units_free(debt), debt - max_debt, debt }
end

local decide = {}

-- GCRA: the value is the theoretical arrival time (TAT).
decide.g = function(key, cost, interval, burst)
  local tat = tonumber(redis.call("GET", key) or "0")
  local debt = 0
  if tat > now then
    debt = tat - now
  end
  return debt_decision(debt, cost, interval, burst, function(new_debt)
    store(key, int(now + new_debt), new_debt)
  end)
end

-- Token bucket: the value is "deficit last".
decide.t = function(key, cost, interval, burst)
  local state = numbers(redis.call("GET", key))
  local deficit, last = state[1] or 0, state[2] or 0
  local at = now
  if at < last then
    at = last
  end
  deficit = deficit - (at - last)
  if deficit < 0 then
    deficit = 0
  end
  return debt_decision(deficit, cost, interval, burst, function(new_deficit)
    store(key, int(new_deficit) .. " " .. int(at), new_deficit)
  end)
end

-- Fixed window: the value is "window_index count". A reading from before
-- the stored window is that window's first instant.
decide.f = function(key, cost, window, burst)
  local state = numbers(redis.call("GET", key))
  local stored_index, count = state[1] or 0, state[2] or 0
  local index = idiv(now, window)
  local elapsed = now - index * window
  if index < stored_index then
    index, elapsed = stored_index, 0
  elseif index > stored_index then
    count = 0
  end
  local ends_in = window - elapsed
  local free = math.max(burst - count, 0)
  if cost <= free then
    return { 1, free - cost, 0, ends_in }, function()
      store(key, int(index) .. " " .. int(count + cost), ends_in)
    end
  end
  return { 0, free, ends_in, ends_in }
end

-- Sliding window counter: the value is "window_index previous current";
-- the previous window's count weighs by the part of it still inside the
-- sliding window, in exact integers scaled by the window.
decide.c = function(key, cost, window, burst)
  local state = numbers(redis.call("GET", key))
  local stored_index, previous, current = state[1] or 0, state[2] or 0, state[3] or 0
  local index = idiv(now, window)
  local elapsed = now - index * window
  if index < stored_index then
    index, elapsed = stored_index, 0
  elseif index == stored_index + 1 then
    previous, current = current, 0
  elseif index > stored_index then
    previous, current = 0, 0
  end
  local carried = previous * (window - elapsed)
  local free = math.max(idiv(math.max(burst * window - carried, 0), window) - current, 0)
  -- How far into the window the previous count has slid out enough to
  -- leave `room` units: window * (previous - room) / previous, rounded up.
  local function earliest_offset(count, room)
    if count == 0 or room >= count then
      return 0
    end
    return ceil_div(window * (count - room), count)
  end
  local function reset_after(prev, cur)
    if cur > 0 then
      return 2 * window - elapsed
    elseif prev > 0 then
      return window - elapsed
    end
    return 0
  end
  if cost <= free then
    local reset = reset_after(previous, current + cost)
    return { 1, free - cost, 0, reset }, function()
      store(key, int(index) .. " " .. int(previous) .. " " .. int(current + cost), reset)
    end
  end
  local room_now = math.max(burst - current, 0)
  local retry
  if cost <= room_now then
    retry = earliest_offset(previous, room_now - cost) - elapsed
  else
    retry = (window - elapsed) + earliest_offset(current, burst - cost)
  end
  return { 0, free, retry, reset_after(previous, current) }
end

-- Sliding log: a list of runs "stamp count", oldest first; a unit leaves
-- the window `window` after its stamp. A reading older than the newest
-- stamp is the newest stamp's instant.
decide.l = function(key, cost, window, burst)
  local runs = redis.call("LRANGE", key, 0, -1)
  local stamps, counts = {}, {}
  for i, run in ipairs(runs) do
    local parsed = numbers(run)
    stamps[i], counts[i] = parsed[1], parsed[2]
  end
  local newest = stamps[#stamps]
  local at = now
  if newest and at < newest then
    at = newest
  end
  local first_live, live = #stamps + 1, 0
  for i = #stamps, 1, -1 do
    if stamps[i] + window <= at then
      break
    end
    first_live, live = i, live + counts[i]
  end
  local free = math.max(burst - live, 0)
  if cost <= free then
    return { 1, free - cost, 0, window }, function()
      if first_live > 1 then
        redis.call("LTRIM", key, first_live - 1, -1)
      end
      if newest == at and first_live <= #stamps then
        redis.call("LSET", key, -1, int(at) .. " " .. int(counts[#stamps] + cost))
      else
        redis.call("RPUSH", key, int(at) .. " " .. int(cost))
      end
      redis.call("PEXPIRE", key, ceil_div(window, 1000))
    end
  end
  -- The stamp of the last unit that must leave for `cost` to fit.
  local must_leave, deciding = live + cost - burst, at
  for i = first_live, #stamps do
    must_leave = must_leave - counts[i]
    if must_leave <= 0 then
      deciding = stamps[i]
      break
    end
  end
  local reset = 0
  if newest then
    reset = math.max(newest + window - at, 0)
  end
  return { 0, free, deciding + window - at, reset }
end

local replies, commits, all_allowed = {}, {}, true
for i = 1, #KEYS do
  local at = 3 + 4 * (i - 1)
  local reply, commit = decide[ARGV[at]](KEYS[i], tonumber(ARGV[at + 1]),
    tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]))
  all_allowed = all_allowed and reply[1] == 1
  commits[i] = commit
  for j = 1, 4 do
    replies[#replies + 1] = reply[j]
  end
end
if all_allowed and not peek then
  for i = 1, #KEYS do
    commits[i]()
  end
end
return replies
