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
--   through string.format's "%d".
--
-- Every value carries its stamp: the revision, span and burst of the quota
-- that wrote it (notes/14). A string value is the state's integers then
-- "revision span burst"; a sliding log's list holds the stamp first, then
-- its runs. A caller of a later revision carries the state over to its
-- quota by its strategy ("a" as is, "p" proportionally, "u" unchanged)
-- before it decides, and writes that at once (a peek only reads it): so a
-- key is carried once, at its first check after the change. A caller of
-- the same revision reads the state as it is, and one of an earlier
-- revision too, leaving the later stamp in place. Window algorithms refuse
-- a key stamped with a window of another length.
--
-- KEYS[i]            the Redis key of limit i
-- ARGV[1]            "1" to decide without writing (peek), "2" to reserve
--                    and "5" to check with a receipt (below), else "0"
-- ARGV[2 + 8(i-1)..] limit i: now in microseconds (or "" for the server's
--                    TIME), algorithm, cost, constant a, constant b, expiry
--                    grace in milliseconds, revision, carry strategy
--   algorithm "g" GCRA and "t" token bucket: a = emission interval, b = burst
--   algorithm "f" fixed window, "c" sliding window counter, "l" sliding
--   log: a = window, b = burst
--
-- All limits are decided first; only if every one admits are they written
-- (all or nothing; a carry is written whatever is decided). Returns four
-- integers per limit: allowed (1 or 0), remaining, retry_after_us,
-- reset_after_us.
--
-- Reserving ("2"; one GCRA limit, notes/11): ARGV[10] is the longest wait
-- in microseconds the caller accepts, and the limit's tolerance is widened
-- by it, so that a request up to that far from conforming is admitted now
-- for its future slot (the new TAT minus the tolerance); a fifth integer
-- is the TAT written (0 when denied).
--
-- Giving a reservation back ("3"): KEYS[1]; ARGV[2] the TAT it wrote,
-- ARGV[3] the TAT to restore, ARGV[4] now (or "" for TIME), ARGV[5] the
-- tolerance, ARGV[6] the stamp it wrote ("revision interval burst").
-- Restores only if the key still holds the TAT and stamp it wrote (no one
-- reserved, was admitted or carried it since) and its slot has not come;
-- returns { 1 } if it did, else { 0 }.
--
-- A lease call ("4"; one GCRA key, notes/12; its Rust twin is
-- tollgate::remote::lease): KEYS[1]; ARGV[2] now (or ""), ARGV[3] the
-- interval, ARGV[4] the burst, ARGV[5] the cost, ARGV[6] the units wanted
-- beyond it, ARGV[7] the TAT a lease being given back wrote (or ""),
-- ARGV[8] its units, ARGV[9] the expiry grace (ms), ARGV[10] the revision,
-- ARGV[11] the carry strategy. Gives those units back if the key still
-- holds that TAT under the caller's own stamp; decides the cost; admitted,
-- also grants up to the units wanted, at most half of those left free
-- beside the cost. Returns allowed, remaining, retry_after_us,
-- reset_after_us, granted, the TAT after (the lease's last slot), now,
-- units given back.

-- One GCRA limit checked or peeked (modes "0" and "1", one key, algorithm
-- "g"), the commonest call, is decided here, before the rest of the chunk
-- makes its closures and tables: the same arithmetic as the loop's "g"
-- branch below, written out for one key, which it writes at once (nothing
-- else has to admit first). A key to carry over to a new quota goes on to
-- the loop. The differential test compares each copy with the in-process
-- GCRA: this one through checks and peeks, the loop's through checks of
-- several limits together and through quota changes.
if #KEYS == 1 and ARGV[3] == "g" and (ARGV[1] == "0" or ARGV[1] == "1") then
  local key, now = KEYS[1], ARGV[2]
  local cost, interval, burst = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local revision = tonumber(ARGV[8])
  if not cost or not burst or cost < 1 or cost > burst then
    return redis.error_reply("tollgate: the cost must be 1 to the burst")
  end
  if not revision or revision < 0 or revision % 1 ~= 0 then
    return redis.error_reply("tollgate: a revision must be a whole number")
  end
  -- The value is "TAT revision interval burst": the theoretical arrival
  -- time and its stamp. This call's stamp is its arguments as its limiter
  -- sends them (whole numbers in decimal): a key it wrote last is told by
  -- one comparison.
  local stamp = ARGV[8] .. " " .. ARGV[5] .. " " .. ARGV[6]
  local value = redis.call("GET", key)
  local tat = 0
  if value then
    local stored, stored_stamp = string.match(value, "^(%d+) (.*)$")
    if not stored then
      return redis.error_reply("tollgate: not a GCRA value: " .. key)
    end
    tat = tonumber(stored)
    if stored_stamp ~= stamp then
      local stored_revision, quota = string.match(stored_stamp, "^(%d+) (%d+ %d+)$")
      if not stored_revision then
        return redis.error_reply("tollgate: not a GCRA value: " .. key)
      end
      stored_revision = tonumber(stored_revision)
      if stored_revision > revision then
        stamp = stored_stamp
      elseif stored_revision < revision and quota ~= ARGV[5] .. " " .. ARGV[6] then
        tat = nil
      end
    end
  end
  if tat then
    if now == "" then
      local time = redis.call("TIME")
      now = tonumber(time[1]) * 1000000 + tonumber(time[2])
    else
      now = tonumber(now)
    end
    -- The key owes `debt` microseconds of refill, and a cost fits while
    -- debt + cost * interval <= burst * interval.
    local debt = 0
    if tat > now then
      debt = tat - now
    end
    local tolerance = burst * interval
    local max_debt = tolerance - cost * interval
    local allowed, retry = 0, debt - max_debt
    if debt <= max_debt then
      allowed, retry = 1, 0
      debt = debt + cost * interval
      if ARGV[1] == "0" then
        -- Expires when fresh, the new TAT: PX rounded up, plus one and the
        -- grace (as ttl_ms below).
        redis.call("SET", key, string.format("%d ", now + debt) .. stamp, "PX",
          math.floor((debt + 999) / 1000) + 1 + (tonumber(ARGV[7]) or 0))
      end
    end
    local remaining = 0
    if tolerance - debt >= interval then
      remaining = math.floor((tolerance - debt) / interval)
    end
    return { allowed, remaining, retry, debt }
  end
end

-- The arguments of modes "2" and "3" are checked as the costs are: the
-- script is published, and a restored TAT that is not a number, or later
-- than the one written, would break the key until it expires.
local function whole(value)
  return type(value) == "string" and string.match(value, "^%d+$") ~= nil
end

if ARGV[1] == "3" then
  local key, written = KEYS[1], ARGV[2]
  if #KEYS ~= 1 or not whole(written) or not whole(ARGV[3]) or not whole(ARGV[5])
      or type(ARGV[6]) ~= "string" or not string.match(ARGV[6], "^%d+ %d+ %d+$")
      or tonumber(ARGV[3]) >= tonumber(written) then
    return redis.error_reply("tollgate: a refund needs one key, whole TATs, restored < written, and a stamp")
  end
  local now = tonumber(ARGV[4])
  if not now then
    local time = redis.call("TIME")
    now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  if redis.call("GET", key) ~= written .. " " .. ARGV[6]
      or tonumber(written) - tonumber(ARGV[5]) <= now then
    return { 0 }
  end
  redis.call("SET", key, ARGV[3] .. " " .. ARGV[6], "KEEPTTL")
  return { 1 }
end
-- Giving an admission back ("6", after a check with a receipt, "5"):
-- KEYS[1]; ARGV[2] "l" for a sliding log's list, else "s"; ARGV[3] what
-- the admission wrote (the value; for a log its stamp and its newest run,
-- on two lines); ARGV[4] what it replaced ("" for nothing: the key, or the
-- run, was new). Undone only if the key still holds what the admission
-- wrote (a log, its stamp as well: a carry, which rewrites the runs,
-- always writes a new stamp), so that nothing decided since is moved;
-- returns { 1 } if it did, else { 0 }.
if ARGV[1] == "6" then
  local key, written, previous = KEYS[1], ARGV[3], ARGV[4]
  if #KEYS ~= 1 or not (ARGV[2] == "l" or ARGV[2] == "s") or type(written) ~= "string"
      or written == "" or type(previous) ~= "string" then
    return redis.error_reply("tollgate: a give-back needs one key, a kind and what was written")
  end
  if ARGV[2] == "l" then
    local stamp, run = string.match(written, "^([^\n]*)\n(.*)$")
    if not stamp or redis.call("LINDEX", key, 0) ~= stamp
        or redis.call("LINDEX", key, -1) ~= run then
      return { 0 }
    end
    if previous == "" then
      redis.call("RPOP", key)
    else
      redis.call("LSET", key, -1, previous)
    end
  else
    if redis.call("GET", key) ~= written then
      return { 0 }
    end
    if previous == "" then
      redis.call("DEL", key)
    else
      redis.call("SET", key, previous, "KEEPTTL")
    end
  end
  return { 1 }
end
local reserving = ARGV[1] == "2"
-- A check with a receipt ("5"; one limit): a check ("0") whose reply adds,
-- admitted, what it wrote and what that replaced, as "6" takes them back.
local receipt = ARGV[1] == "5"
if receipt and #KEYS ~= 1 then
  return redis.error_reply("tollgate: a check with a receipt is of one limit")
end
if reserving and (#KEYS ~= 1 or ARGV[3] ~= "g" or not whole(ARGV[10])
    or tonumber(ARGV[10]) > 2251799813685248) then
  return redis.error_reply("tollgate: one GCRA limit, and a whole wait of at most 2^51 us")
end
--
-- The whole chunk runs on every call, so it creates few closures (each is
-- an allocation): the algorithms are branches of one loop, and a limit's
-- writes are recorded as commands, run at the end if all admit. A few
-- helpers are closures (the carry's only in a call that carries); the
-- log's branch makes its search's.

local peek = ARGV[1] == "1"
-- Quotients are floor(a / b), quotients rounded up floor((a + b - 1) / b),
-- and stored integers format("%d ...", ...), written out where they are used:
-- helper functions would be closures made on every call (the chunk runs
-- whole each time), which cost more than the arithmetic (notes/10).
local floor, format = math.floor, string.format

-- The integers of a stored value, in order.
local function numbers(value)
  local parsed = {}
  for word in string.gmatch(value or "", "%d+") do
    parsed[#parsed + 1] = tonumber(word)
  end
  return parsed
end

-- A key expires when it would decide as a fresh key: at the instant
-- `fresh`, which a state dated after now (the clock stepped back) puts
-- later than the state's own rest time. PX counts whole milliseconds from
-- a millisecond clock that can lag the microsecond now by up to 1 ms: round
-- up and add one.
-- The limit being decided: its time, and the grace its limiter adds to
-- every expiry (for a client clock that may lag the server's).
local now, grace

local function ttl_ms(now, fresh)
  return floor((math.max(fresh - now, 0) + 999) / 1000) + 1 + grace
end

-- Reads a value holding `fields` integers of state, then its stamp, for a
-- caller of `revision` and quota (a, b). Returns the state's integers, the
-- stamp to write ("revision span burst"), and the span and burst to carry
-- the state over from (none: read it as it is). Refuses a value in another
-- layout, and for a window algorithm (`windowed`), a key stamped with a
-- window of another length: its counts mean nothing in these windows.
local function stamped(key, value, fields, revision, a, b, windowed)
  local parsed = numbers(value)
  local stamp = format("%d %d %d", revision, a, b)
  if not value then
    return parsed, stamp
  end
  if #parsed ~= fields + 3 then
    error({ err = "tollgate: not a value of this algorithm: " .. key })
  end
  local stored_revision, span, burst = parsed[fields + 1], parsed[fields + 2], parsed[fields + 3]
  if span < 1 or burst < 1 then
    error({ err = "tollgate: not a value of this algorithm: " .. key })
  end
  if windowed and span ~= a then
    error({ err = "tollgate: the key counts windows of another length: " .. key })
  end
  if stored_revision > revision then
    return parsed, format("%d %d %d", stored_revision, span, burst)
  elseif stored_revision < revision and (span ~= a or burst ~= b) then
    return parsed, stamp, span, burst
  end
  return parsed, stamp
end

-- Carrying a state over to a new quota: the same arithmetic as the
-- algorithms' `carry` in tollgate (notes/14), made only by a call that
-- carries a key.
local muldiv, carry_count, carry_debt
local function carrying()
  if muldiv then
    return
  end
  -- floor(x * y / c), at most `cap`, and the remainder (meaningless when
  -- capped), exactly: by the bits of y, keeping the quotient and the
  -- remainder of x * (the bits so far), each step below 2^53. Needs x, y,
  -- c, cap below 2^52 and x + c below 2^53.
  muldiv = function(x, y, c, cap)
    local whole_part = floor(x / c)
    local rest = x - whole_part * c
    if whole_part > 0 and whole_part * y > cap then
      return cap, 0
    end
    local quotient, remainder, bit, bits = 0, 0, 1, y
    while bit * 2 <= bits do
      bit = bit * 2
    end
    while bit >= 1 do
      quotient, remainder = 2 * quotient, 2 * remainder
      if remainder >= c then
        quotient, remainder = quotient + 1, remainder - c
      end
      if bits >= bit then
        bits = bits - bit
        remainder = remainder + rest
        if remainder >= c then
          quotient, remainder = quotient + 1, remainder - c
        end
      end
      bit = bit / 2
    end
    return math.min(whole_part * y + quotient, cap), remainder
  end
  -- A count of `used` units of a burst `from` carried to a burst `to`.
  carry_count = function(from, to, how, used)
    if used == 0 then
      return 0
    end
    local cap, carried = math.max(used, to), used
    if how == "a" then
      carried = to - math.min(math.max(from - used, 0), to)
    elseif how == "p" then
      local quotient, remainder = muldiv(used, to, from, cap)
      carried = quotient
      if remainder > 0 and quotient < cap then
        carried = quotient + 1
      end
    end
    return math.min(carried, cap)
  end
  -- `debt` microseconds owed under (interval, burst) carried to
  -- (to_interval, to_burst); the part beyond the tolerance (a
  -- reservation's booked time) is kept as time.
  carry_debt = function(debt, interval, burst, to_interval, to_burst, how)
    if debt == 0 or how == "u" then
      return debt
    end
    local tolerance, to_tolerance = burst * interval, to_burst * to_interval
    local booked, owed = math.max(debt - tolerance, 0), math.min(debt, tolerance)
    local carried
    if how == "a" then
      -- The units free stay free, at most the new burst.
      carried = to_tolerance - muldiv(tolerance - owed, to_interval, interval, to_tolerance)
    else
      -- The fraction of the tolerance owed, rounded up.
      local quotient, remainder = muldiv(owed, to_tolerance, tolerance, to_tolerance)
      carried = quotient
      if remainder > 0 then
        carried = quotient + 1
      end
    end
    return carried + booked
  end
end

if ARGV[1] == "4" then
  local key, now = KEYS[1], ARGV[2]
  local interval, burst = tonumber(ARGV[3]), tonumber(ARGV[4])
  local cost, want, units = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[8])
  local revision, how = tonumber(ARGV[10]), ARGV[11]
  if #KEYS ~= 1 or not whole(ARGV[3]) or not whole(ARGV[4]) or not whole(ARGV[5])
      or not whole(ARGV[6]) or not whole(ARGV[8]) or not (ARGV[9] == "" or whole(ARGV[9]))
      or not (ARGV[7] == "" or whole(ARGV[7])) or not (now == "" or whole(now))
      or not whole(ARGV[10]) or not (how == "a" or how == "p" or how == "u")
      or interval < 1 or burst < 1 or interval * burst > 2251799813685248
      or cost < 1 or cost > burst or want > burst or units > burst then
    return redis.error_reply("tollgate: a lease call needs whole numbers, a cost of 1 to the burst")
  end
  if now == "" then
    local time = redis.call("TIME")
    now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  else
    now = tonumber(now)
    if now > 4503599627370496 then
      return redis.error_reply("tollgate: a time past 2^52 us")
    end
  end
  grace = tonumber(ARGV[9]) or 0
  local stored = redis.call("GET", key)
  local state, stamp, from_interval, from_burst =
    stamped(key, stored, 1, revision, interval, burst, false)
  local tat = state[1] or 0
  local returned, dirty = 0, false
  if ARGV[7] ~= "" and units > 0 and stored == ARGV[7] .. " " .. format("%d %d %d",
      revision, interval, burst) then
    tat = math.max(tat - units * interval, 0)
    returned, dirty = units, true
  elseif from_interval and tat > now then
    carrying()
    tat = now + carry_debt(tat - now, from_interval, from_burst, interval, burst, how)
    dirty = true
  end
  local tolerance = burst * interval
  local debt = math.max(tat - now, 0)
  local max_debt = tolerance - cost * interval
  if debt > max_debt then
    if dirty then
      redis.call("SET", key, format("%d ", tat) .. stamp, "PX", ttl_ms(now, tat))
    end
    return { 0, math.floor((tolerance - math.min(debt, tolerance)) / interval),
      debt - max_debt, debt, 0, tat, now, returned }
  end
  local granted = math.min(want, math.floor(math.floor((max_debt - debt) / interval) / 2))
  local end_at = math.max(tat, now) + (cost + granted) * interval
  redis.call("SET", key, format("%d ", end_at) .. stamp, "PX", ttl_ms(now, end_at))
  return { 1, math.floor((tolerance - (end_at - now)) / interval), 0, end_at - now,
    granted, end_at, now, returned }
end

-- What a limit's key held before its admission (after a carry), for a
-- receipt: a value, a log's newest run, or false for none.
local before

-- A carried state is written at once (a peek only reads it), whatever the
-- call decides: the key is carried at this instant, once.
local function carried(key, value, fresh)
  if not peek then
    redis.call("SET", key, value, "PX", ttl_ms(now, fresh))
  end
end

local server_now
local replies, writes, all_allowed = {}, {}, true
for i = 1, #KEYS do
  local key, at = KEYS[i], 2 + 8 * (i - 1)
  now, grace = ARGV[at], tonumber(ARGV[at + 5]) or 0
  if now ~= "" then
    now = tonumber(now)
  else
    if not server_now then
      local time = redis.call("TIME")
      server_now = tonumber(time[1]) * 1000000 + tonumber(time[2])
    end
    now = server_now
  end
  local code = ARGV[at + 1]
  local cost, a, b = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local revision, how = tonumber(ARGV[at + 6]), ARGV[at + 7]
  -- The callers check the cost (1 to the burst, b for every algorithm);
  -- the script is published, so it checks too.
  if not cost or not b or cost < 1 or cost > b then
    return redis.error_reply("tollgate: the cost must be 1 to the burst")
  end
  if not whole(ARGV[at + 6]) or not (how == "a" or how == "p" or how == "u") then
    return redis.error_reply("tollgate: a revision must be a whole number, a carry a, p or u")
  end
  local allowed, remaining, retry, reset
  -- A log's stamp, for its receipt.
  local log_stamp

  if code == "g" or code == "t" then
    -- GCRA and the token bucket: a key owes `debt` microseconds of refill
    -- (a = interval, b = burst); a cost fits while
    -- debt + cost * interval <= burst * interval.
    local interval, burst = a, b
    local debt, last_at, key_stamp = 0, now, nil
    before = redis.call("GET", key)
    if code == "g" then
      -- The value is the theoretical arrival time (TAT) and its stamp.
      local state, stamp, from_interval, from_burst =
        stamped(key, before, 1, revision, a, b, false)
      local tat = state[1] or 0
      if from_interval and tat > now then
        carrying()
        tat = now + carry_debt(tat - now, from_interval, from_burst, interval, burst, how)
        before = format("%d ", tat) .. stamp
        carried(key, before, tat)
      end
      if tat > now then
        debt = tat - now
      end
      key_stamp = stamp
    else
      -- The value is "deficit last" and its stamp; a reading before `last`
      -- is `last`.
      local state, stamp, from_interval, from_burst =
        stamped(key, before, 2, revision, a, b, false)
      local deficit, last = state[1] or 0, state[2] or 0
      if last_at < last then
        last_at = last
      end
      debt = math.max(deficit - (last_at - last), 0)
      if from_interval and debt > 0 then
        carrying()
        debt = carry_debt(debt, from_interval, from_burst, interval, burst, how)
        before = format("%d %d ", debt, last_at) .. stamp
        carried(key, before, last_at + debt)
      end
      key_stamp = stamp
    end
    local tolerance = burst * interval
    local max_debt = tolerance - cost * interval
    if reserving then
      max_debt = max_debt + (tonumber(ARGV[10]) or 0)
    end
    if debt <= max_debt then
      allowed, retry = 1, 0
      debt = debt + cost * interval
      if code == "g" then
        writes[#writes + 1] = { "SET", key, format("%d ", now + debt) .. key_stamp, "PX",
          ttl_ms(now, now + debt) }
      else
        writes[#writes + 1] = { "SET", key, format("%d %d ", debt, last_at) .. key_stamp, "PX",
          ttl_ms(now, last_at + debt) }
      end
    else
      allowed, retry = 0, debt - max_debt
    end
    remaining, reset = 0, debt
    if tolerance - debt >= interval then
      remaining = floor((tolerance - debt) / interval)
    end

  elseif code == "f" then
    -- Fixed window: the value is "window_index count" and its stamp (a =
    -- window, b = burst). A reading from before the stored window is that
    -- window's first instant.
    local window, burst = a, b
    before = redis.call("GET", key)
    local state, stamp, _, from_burst = stamped(key, before, 2, revision, a, b, true)
    local stored_index, count = state[1] or 0, state[2] or 0
    local index = floor(now / window)
    local elapsed = now - index * window
    if from_burst and stored_index >= index and count > 0 then
      carrying()
      count = carry_count(from_burst, burst, how, count)
      before = format("%d %d ", stored_index, count) .. stamp
      carried(key, before, (stored_index + 1) * window)
    end
    if index < stored_index then
      index, elapsed = stored_index, 0
    elseif index > stored_index then
      count = 0
    end
    local free = math.max(burst - count, 0)
    reset = window - elapsed
    if cost <= free then
      allowed, remaining, retry = 1, free - cost, 0
      writes[#writes + 1] = { "SET", key, format("%d %d ", index, count + cost) .. stamp, "PX",
        ttl_ms(now, (index + 1) * window) }
    else
      allowed, remaining, retry = 0, free, reset
    end

  elseif code == "c" then
    -- Sliding window counter: the value is "window_index previous
    -- current" and its stamp; the previous window's count weighs by the
    -- part of it still inside the sliding window, in exact integers scaled
    -- by the window.
    local window, burst = a, b
    before = redis.call("GET", key)
    local state, stamp, _, from_burst = stamped(key, before, 3, revision, a, b, true)
    local stored_index, previous, current = state[1] or 0, state[2] or 0, state[3] or 0
    local index = floor(now / window)
    local elapsed = now - index * window
    if index < stored_index then
      index, elapsed = stored_index, 0
    elseif index == stored_index + 1 then
      previous, current = current, 0
    elseif index > stored_index then
      previous, current = 0, 0
    end
    if from_burst and (previous > 0 or current > 0) then
      -- As is, a raise adds its units to the current count and a cut takes
      -- them from it first; in proportion, both counts scale; unchanged,
      -- they stay (under the new stamp).
      carrying()
      if how == "p" then
        previous = carry_count(from_burst, burst, how, previous)
        current = carry_count(from_burst, burst, how, current)
      elseif how == "a" and burst >= from_burst then
        current = math.min(current + burst - from_burst, math.max(current, burst))
      elseif how == "a" then
        local cut = from_burst - burst
        local from_current = math.min(cut, current)
        previous = previous - math.min(cut - from_current, previous)
        current = current - from_current
      end
      before = format("%d %d %d ", index, previous, current) .. stamp
      -- Fresh once both counts have slid out: the previous one at this
      -- window's end, the current one a window later.
      local fresh = index + 1
      if current > 0 then
        fresh = index + 2
      end
      carried(key, before, fresh * window)
    end
    local carried_count = previous * (window - elapsed)
    local free = math.max(floor(math.max(burst * window - carried_count, 0) / window) - current, 0)
    if cost <= free then
      allowed, remaining, retry = 1, free - cost, 0
      -- Fresh once the current count has slid out: two windows on.
      reset = 2 * window - elapsed
      writes[#writes + 1] = { "SET", key,
        format("%d %d %d ", index, previous, current + cost) .. stamp, "PX",
        ttl_ms(now, (index + 2) * window) }
    else
      allowed, remaining = 0, free
      -- How far into the window `count` has slid out enough to leave
      -- `room` units: window * (count - room) / count, rounded up.
      local function earliest_offset(count, room)
        if count == 0 or room >= count then
          return 0
        end
        return floor((window * (count - room) + count - 1) / count)
      end
      local room_now = math.max(burst - current, 0)
      if cost <= room_now then
        retry = earliest_offset(previous, room_now - cost) - elapsed
      else
        retry = (window - elapsed) + earliest_offset(current, burst - cost)
      end
      if current > 0 then
        reset = 2 * window - elapsed
      elseif previous > 0 then
        reset = window - elapsed
      else
        reset = 0
      end
    end

  elseif code == "l" then
    -- Sliding log: a list of the stamp, then runs "stamp count
    -- cumulative", oldest first: the units admitted at one microsecond, and
    -- the units of the list up to and including the run (counted since the
    -- list was last empty). A unit leaves the window `window` (a) after its
    -- stamp, and a reading older than the newest stamp is that stamp's
    -- instant. The cumulative counts let a check find the first live run,
    -- and a denial the run whose leaving makes room, by binary search over
    -- LINDEX: O(log runs) reads, whatever the list holds. An admission
    -- trims the runs that have left (in C, each run once).
    local window, burst = a, b
    local length = redis.call("LLEN", key)
    local header = length > 0 and redis.call("LINDEX", key, 0) or nil
    local _, stamp, _, from_burst = stamped(key, header, 0, revision, a, b, true)
    log_stamp = stamp
    local runs = math.max(length - 1, 0)
    local fetched = {}
    -- Runs before it read as departed: those a peek's carry drops.
    local dead_before = 0
    local departed = { 0, 0, 0 }
    local function run(j)
      if j < dead_before then
        return departed
      end
      if not fetched[j] then
        local parsed = numbers(redis.call("LINDEX", key, j + 1))
        if #parsed ~= 3 then
          -- Any run in another layout (an earlier version's, or something
          -- else's): refused, never read as something it is not.
          error({ err = "tollgate: not a sliding log: " .. key })
        end
        fetched[j] = parsed
      end
      return fetched[j]
    end
    -- The smallest j in [low, runs - 1] whose run satisfies `holds`
    -- (monotone: false, then true), given that run runs - 1 does.
    local function first(low, holds)
      local high = runs - 1
      while low < high do
        local middle = floor((low + high) / 2)
        if holds(run(middle)) then
          high = middle
        else
          low = middle + 1
        end
      end
      return low
    end
    if from_burst and runs > 0 and how == "u" then
      -- Unchanged: the runs as they are, under the new stamp.
      if not peek then
        redis.call("LSET", key, 0, stamp)
      end
      header = stamp
    elseif from_burst and runs > 0 then
      -- Carried in place, in O(log runs): the live units as a count;
      -- fewer drop the oldest (the runs before the one where they end are
      -- cut, that one keeps its cumulative count and loses units), more
      -- are added at the reading. A peek decides on the carried runs
      -- without writing them.
      carrying()
      local newest = run(runs - 1)
      local stamp_at = math.max(now, newest[1])
      local top, keep_from, base = newest[3], runs, newest[3]
      if newest[1] + window > stamp_at then
        keep_from = first(0, function(r)
          return r[1] + window > stamp_at
        end)
        base = run(keep_from)[3] - run(keep_from)[2]
      end
      local live = top - base
      local kept = carry_count(from_burst, burst, how, live)
      local grown = false
      if kept < live then
        local drop = live - kept
        local j = first(keep_from, function(r)
          return r[3] - base >= drop
        end)
        local cut = run(j)
        local left = cut[3] - base - drop
        keep_from = j + 1
        if left > 0 then
          keep_from = j
          fetched[j] = { cut[1], left, cut[3] }
          if not peek then
            redis.call("LSET", key, j + 1, format("%d %d %d", cut[1], left, cut[3]))
          end
        end
      elseif kept > live then
        local extra = kept - live
        grown = true
        if newest[1] == stamp_at then
          fetched[runs - 1] = { stamp_at, newest[2] + extra, top + extra }
          if not peek then
            redis.call("LSET", key, -1, format("%d %d %d", stamp_at, newest[2] + extra,
              top + extra))
          end
        else
          fetched[runs] = { stamp_at, extra, top + extra }
          runs = runs + 1
          if not peek then
            redis.call("RPUSH", key, format("%d %d %d", stamp_at, extra, top + extra))
          end
        end
      end
      if peek then
        dead_before = keep_from
      elseif keep_from >= runs then
        -- Nothing left: as an absent key.
        redis.call("DEL", key)
      else
        -- The stamp over the last run cut (or the old stamp), and the runs
        -- before it cut.
        redis.call("LSET", key, keep_from, stamp)
        if keep_from > 0 then
          redis.call("LTRIM", key, keep_from, -1)
        end
        if grown then
          redis.call("PEXPIRE", key, ttl_ms(now, stamp_at + window))
        end
      end
      if not peek then
        fetched, length = {}, redis.call("LLEN", key)
        runs = math.max(length - 1, 0)
      end
      header = stamp
    end
    local newest = runs > 0 and run(runs - 1)
    local stamp_at, first_live, base, top = now, runs, 0, 0
    if newest then
      top = newest[3]
      if stamp_at < newest[1] then
        stamp_at = newest[1]
      end
      if newest[1] + window > stamp_at then
        first_live = first(0, function(r)
          return r[1] + window > stamp_at
        end)
        local oldest_live = run(first_live)
        base = oldest_live[3] - oldest_live[2]
      else
        base = top
      end
    end
    local live = top - base
    local free = math.max(burst - live, 0)
    if cost <= free then
      allowed, remaining, retry, reset = 1, free - cost, 0, window
      if first_live == runs then
        -- Nothing live: start the list again, counting from zero.
        if length > 0 then
          writes[#writes + 1] = { "DEL", key }
        end
        before = false
        writes[#writes + 1] = { "RPUSH", key, stamp, format("%d %d %d", stamp_at, cost, cost) }
      else
        if first_live > 0 then
          -- The stamp over the last run to go, and the runs before it cut.
          writes[#writes + 1] = { "LSET", key, first_live, stamp }
          writes[#writes + 1] = { "LTRIM", key, first_live, -1 }
        elseif header ~= stamp then
          writes[#writes + 1] = { "LSET", key, 0, stamp }
        end
        if newest[1] == stamp_at then
          before = format("%d %d %d", newest[1], newest[2], newest[3])
          writes[#writes + 1] = { "LSET", key, -1,
            format("%d %d %d", stamp_at, newest[2] + cost, top + cost) }
        else
          before = false
          writes[#writes + 1] = { "RPUSH", key,
            format("%d %d %d", stamp_at, cost, top + cost) }
        end
      end
      writes[#writes + 1] = { "PEXPIRE", key, ttl_ms(now, stamp_at + window) }
    else
      -- The stamp of the last unit that must leave for `cost` to fit: the
      -- first live run whose cumulative count reaches it.
      local must_leave = live + cost - burst
      local leaving = run(first(first_live, function(r)
        return r[3] - base >= must_leave
      end))
      allowed, remaining, retry = 0, free, leaving[1] + window - stamp_at
      reset = math.max(newest[1] + window - stamp_at, 0)
    end

  else
    return redis.error_reply("tollgate: unknown algorithm " .. tostring(code))
  end

  all_allowed = all_allowed and allowed == 1
  replies[#replies + 1] = allowed
  replies[#replies + 1] = remaining
  replies[#replies + 1] = retry
  replies[#replies + 1] = reset
  if reserving then
    replies[#replies + 1] = allowed == 1 and now + reset or 0
  end
  if receipt then
    -- What the admission wrote (the log's newest run, or the value) and
    -- what it replaced; nothing for a denial.
    local written = ""
    if allowed == 1 then
      local last = writes[#writes]
      if code == "l" then
        last = writes[#writes - 1]
        written = log_stamp .. "\n" .. last[#last]
      else
        written = last[3]
      end
    end
    replies[#replies + 1] = written
    replies[#replies + 1] = allowed == 1 and (before or "") or ""
  end
end

if all_allowed and not peek then
  for _, command in ipairs(writes) do
    redis.call(unpack(command))
  end
end
return replies
