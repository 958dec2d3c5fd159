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
-- ARGV[1]            "1" to decide without writing (peek), else "0"
-- ARGV[2 + 5(i-1)..] limit i: now in microseconds (or "" for the server's
--                    TIME), algorithm, cost, constant a, constant b
--   algorithm "g" GCRA and "t" token bucket: a = emission interval, b = burst
--   algorithm "f" fixed window, "c" sliding window counter, "l" sliding
--   log: a = window, b = burst
--
-- All limits are decided first; only if every one admits are they written
-- (all or nothing). Returns four integers per limit: allowed (1 or 0),
-- remaining, retry_after_us, reset_after_us.

local peek = ARGV[1] == "1"

local server_now
local function now_of(arg)
  if arg ~= "" then
    return tonumber(arg)
  end
  if not server_now then
    local time = redis.call("TIME")
    server_now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return server_now
end

local function idiv(a, b)
  return math.floor(a / b)
end

local function ceil_div(a, b)
  return idiv(a + b - 1, b)
end

local function int(n)
  return string.format("%d", n)
end

-- A key expires when it would decide as a fresh key: at the instant
-- `fresh`, which a state dated after now (the clock stepped back) puts
-- later than the state's own rest time. PX counts whole milliseconds from
-- a millisecond clock that can lag the microsecond now by up to 1 ms: round
-- up and add one.
local function ttl_ms(now, fresh)
  return ceil_div(math.max(fresh - now, 0), 1000) + 1
end

local function store(key, value, now, fresh)
  redis.call("SET", key, value, "PX", ttl_ms(now, fresh))
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
decide.g = function(key, now, cost, interval, burst)
  local tat = tonumber(redis.call("GET", key) or "0")
  local debt = 0
  if tat > now then
    debt = tat - now
  end
  return debt_decision(debt, cost, interval, burst, function(new_debt)
    store(key, int(now + new_debt), now, now + new_debt)
  end)
end

-- Token bucket: the value is "deficit last".
decide.t = function(key, now, cost, interval, burst)
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
    store(key, int(new_deficit) .. " " .. int(at), now, at + new_deficit)
  end)
end

-- Fixed window: the value is "window_index count". A reading from before
-- the stored window is that window's first instant.
decide.f = function(key, now, cost, window, burst)
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
      store(key, int(index) .. " " .. int(count + cost), now, (index + 1) * window)
    end
  end
  return { 0, free, ends_in, ends_in }
end

-- Sliding window counter: the value is "window_index previous current";
-- the previous window's count weighs by the part of it still inside the
-- sliding window, in exact integers scaled by the window.
decide.c = function(key, now, cost, window, burst)
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
      -- Fresh once the current count has slid out: two windows on.
      store(key, int(index) .. " " .. int(previous) .. " " .. int(current + cost),
        now, (index + 2) * window)
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

-- Sliding log: a list of runs "stamp count", oldest first, whose newest
-- run also holds the units of the whole list ("stamp count total"); a unit
-- leaves the window `window` after its stamp, and a reading older than the
-- newest stamp is that stamp's instant. With the total, a check reads only
-- the runs that have left the window (an admission trims them, so each is
-- read about once) and, to deny, the runs that must leave for the cost to
-- fit: O(expired + cost) runs, never the whole list of up to `burst`.
decide.l = function(key, now, cost, window, burst)
  local newest = numbers(redis.call("LINDEX", key, -1))
  local newest_stamp, newest_count, total = newest[1], newest[2], newest[3] or 0
  local at = now
  if newest_stamp and at < newest_stamp then
    at = newest_stamp
  end
  -- Run i (from 0, oldest first), fetched in doubling chunks: LRANGE walks
  -- from the head, so reading n runs costs O(n).
  local fetched, next_index, chunk = {}, 0, 8
  local function run(i)
    while i >= next_index do
      local more = redis.call("LRANGE", key, next_index, next_index + chunk - 1)
      if #more == 0 then
        return nil
      end
      for j, value in ipairs(more) do
        fetched[next_index + j - 1] = numbers(value)
      end
      next_index, chunk = next_index + #more, chunk * 2
    end
    return fetched[i]
  end
  local first_live, expired = 0, 0
  while true do
    local oldest = run(first_live)
    if not oldest or oldest[1] + window > at then
      break
    end
    first_live, expired = first_live + 1, expired + oldest[2]
  end
  local live = total - expired
  local free = math.max(burst - live, 0)
  if cost <= free then
    return { 1, free - cost, 0, window }, function()
      if first_live > 0 then
        redis.call("LTRIM", key, first_live, -1)
      end
      local units = int(live + cost)
      if newest_stamp and newest_stamp + window > at then
        if newest_stamp == at then
          redis.call("LSET", key, -1, int(at) .. " " .. int(newest_count + cost) .. " " .. units)
          units = nil
        else
          redis.call("LSET", key, -1, int(newest_stamp) .. " " .. int(newest_count))
        end
      end
      if units then
        redis.call("RPUSH", key, int(at) .. " " .. int(cost) .. " " .. units)
      end
      redis.call("PEXPIRE", key, ttl_ms(now, at + window))
    end
  end
  -- The stamp of the last unit that must leave for `cost` to fit.
  local must_leave, deciding, i = live + cost - burst, at, first_live
  while must_leave > 0 do
    local oldest = run(i)
    if not oldest then
      break
    end
    must_leave, i = must_leave - oldest[2], i + 1
    if must_leave <= 0 then
      deciding = oldest[1]
    end
  end
  local reset = 0
  if newest_stamp then
    reset = math.max(newest_stamp + window - at, 0)
  end
  return { 0, free, deciding + window - at, reset }
end

local replies, commits, all_allowed = {}, {}, true
for i = 1, #KEYS do
  local at = 2 + 5 * (i - 1)
  local reply, commit = decide[ARGV[at + 1]](KEYS[i], now_of(ARGV[at]),
    tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]))
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
