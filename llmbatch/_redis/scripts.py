"""The Lua scripts that keep shared budgets atomic on the Redis server.

Both read time from Redis (``TIME``), so every process agrees on it whatever its own
clock says, and both return numbers as strings (Redis would truncate Lua floats).
Their keys share a hash tag (``{key}``), so they live in one Redis Cluster slot.
"""

from __future__ import annotations

__all__ = ["HOSTED_SHARE", "RATE_LEASE", "SEAT_LEASE", "hosted_keys", "rate_keys", "seat_keys"]


def rate_keys(key: str) -> list[str]:
    """The request budget, the token budget and the set of processes sharing them."""
    return [
        f"llmbatch:{{{key}}}:requests",
        f"llmbatch:{{{key}}}:tokens",
        f"llmbatch:{{{key}}}:rate-sharers",
    ]


def hosted_keys(key: str) -> list[str]:
    """The limits a provider's answers stated, and the end of a 429's wait."""
    return [f"llmbatch:{{{key}}}:learnt", f"llmbatch:{{{key}}}:cooldown"]


def seat_keys(key: str) -> list[str]:
    """What each process holds, what each wants, and when each one's lease ends."""
    return [
        f"llmbatch:{{{key}}}:seats-held",
        f"llmbatch:{{{key}}}:seats-wanted",
        f"llmbatch:{{{key}}}:seats-expiry",
    ]


# A generic cell rate algorithm (GCRA) per budget. State: ``tat``, the time at which
# the bucket would be full again (at or before now: full). A bucket of ``cap`` units
# refilled at ``rate`` holds ``cap - (tat - now) * rate``. A lease of ``want`` units
# is usable once the level reaches ``min(want + floor, cap)`` and moves ``tat`` on by
# ``want / rate``, so over any period the leases add up to the rate (plus one
# bucket). A negative ``want`` gives units back.
#
# Both kinds may be granted up to a horizon before they are usable (the process then
# waits locally, without asking again). A bulk lease that would be usable later than
# that is refused with the time to come back: a slot in a queue (``slot`` is the next
# free one), so processes that wait come back one after another instead of all at
# once, and each one's return (``ticket``) is served ahead of bulk leases that did
# not wait.
#
# Realtime first: bulk leases leave ``reserve`` seconds of budget in the bucket
# (``floor``), which only realtime may lease, and realtime goes ahead of the bulk
# leases granted but not yet usable (``bulk``: when the last one becomes usable, at
# most the bulk horizon away): it borrows their time, and ``tat`` moving on delays
# the bulk leases granted after it. So a realtime lease up to the reserve is usable
# at once however many bulk leases are queued, and over any period the leases add
# up to the rate plus one bucket plus, while bulk leases are queued, at most the
# bulk horizon's worth lent to realtime. Realtime ignores the slot queue.
#
# KEYS: requests state, tokens state, sharers (a sorted set: process id -> last seen).
# ARGV: process id, realtime ("1"/"0"), request rate, cap, want, token rate, cap,
# want, reserve (seconds of rate), bulk horizon (s), realtime horizon (s), sharer
# window (s), ticket ("1": this process was told to come back now).
# Returns: sharers, then per budget: granted, seconds (usable in, if granted; come
# back in, if not), then "1" if a budget had been set up with another rate.
RATE_LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) * 1e-6
local realtime = ARGV[2] == '1'
local reserve = tonumber(ARGV[9])
local bulk_horizon = tonumber(ARGV[10])
local horizon = realtime and tonumber(ARGV[11]) or bulk_horizon
local window = tonumber(ARGV[12])
local ticket = ARGV[13] == '1'
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
redis.call('PEXPIRE', KEYS[3], math.ceil(window * 1000))
local out = {tostring(redis.call('ZCARD', KEYS[3]))}
local mismatch = '0'
for i = 0, 1 do
  local rate = tonumber(ARGV[3 + 3 * i])
  local cap = tonumber(ARGV[4 + 3 * i])
  local want = tonumber(ARGV[5 + 3 * i])
  local granted, seconds = 0, 0
  if rate > 0 and want ~= 0 then
    local key = KEYS[1 + i]
    local stored = redis.call('HMGET', key, 'tat', 'rate', 'slot', 'bulk')
    local tat = tonumber(stored[1]) or now
    local slot = tonumber(stored[3]) or 0
    local bulk = tonumber(stored[4]) or 0
    if stored[2] and math.abs(tonumber(stored[2]) - rate) > 1e-9 * rate then
      mismatch = '1'
    end
    if want < 0 then
      tat = math.max(now, tat + want / rate)
      granted = want
    else
      local floor = realtime and 0 or reserve * rate
      local start = math.max(tat, now)
      local ahead = start
      if realtime then
        ahead = math.max(now, tat - math.min(bulk_horizon, math.max(0, bulk - now)))
      end
      local usable = ahead - (cap - math.min(want + floor, cap)) / rate
      if not realtime and not ticket and slot > now then
        seconds = slot - now
        slot = slot + want / rate
      elseif usable - now > horizon then
        local back = usable - horizon
        if not realtime then
          back = math.max(back, slot)
          slot = back + want / rate
        end
        seconds = back - now
      else
        tat = start + want / rate
        granted = want
        seconds = math.max(0, usable - now)
        if not realtime then bulk = math.max(bulk, usable) end
      end
    end
    redis.call('HSET', key, 'tat', string.format('%.6f', tat), 'rate', tostring(rate),
      'slot', string.format('%.6f', slot), 'bulk', string.format('%.6f', bulk))
    local ahead = math.max(0, tat - now, slot - now)
    redis.call('PEXPIRE', key, math.ceil((ahead + cap / rate + 60) * 1000))
  end
  table.insert(out, tostring(granted))
  table.insert(out, string.format('%.6f', seconds))
end
table.insert(out, mismatch)
return out
"""

# Leases of an in-flight budget (sequences, and optionally tokens). Each process
# holds seats under its id until its lease ends; one that stops renewing (it died)
# loses them then. The budget is split max-min fair among what the live processes
# want; a process is allowed its fair share, but only as seats the others have
# left free, so the seats held never add up to more than the budget. It holds at
# least what it has in flight (that cannot be taken back), and gives back the rest
# as its requests finish.
#
# KEYS: held (hash id -> "seqs tokens"), wanted (hash), expiry (sorted set id -> end).
# ARGV: process id, want seqs, want tokens, in flight seqs, in flight tokens, max
# seqs, max tokens (0: none), lease (s). A process that wants nothing and has
# nothing in flight leaves.
# Returns: held seqs, allowed seqs, held tokens, allowed tokens, "1" if some process
# holds less than its fair share (every one should renew soon), live processes.
SEAT_LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) * 1e-6
local me = ARGV[1]
local lease = tonumber(ARGV[8])
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('HDEL', KEYS[1], dead)
  redis.call('HDEL', KEYS[2], dead)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local function parse(flat)
  local out = {}
  for i = 1, #flat, 2 do
    local s, k = string.match(flat[i + 1], '^(%S+) (%S+)$')
    out[flat[i]] = {tonumber(s), tonumber(k)}
  end
  return out
end
local held = parse(redis.call('HGETALL', KEYS[1]))
local wanted = parse(redis.call('HGETALL', KEYS[2]))
local want = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local use = {tonumber(ARGV[4]), tonumber(ARGV[5])}
local cap = {tonumber(ARGV[6]), tonumber(ARGV[7])}
wanted[me] = want
held[me] = held[me] or {0, 0}
local ids = {}
for id in pairs(wanted) do table.insert(ids, id) end
local result = {}
local contended = '0'
for d = 1, 2 do
  local hold, allow = use[d], 0
  if cap[d] > 0 then
    -- Max-min fair split: the smallest wants are met whole; the rest share what is
    -- left equally, the remainder going one each in id order.
    table.sort(ids, function(a, b)
      if wanted[a][d] ~= wanted[b][d] then return wanted[a][d] < wanted[b][d] end
      return a < b
    end)
    local alloc, left = {}, cap[d]
    for i, id in ipairs(ids) do
      local rest = #ids - i + 1
      if wanted[id][d] * rest <= left then
        alloc[id] = wanted[id][d]
        left = left - wanted[id][d]
      else
        local others = {}
        for j = i, #ids do table.insert(others, ids[j]) end
        table.sort(others)
        local base = math.floor(left / rest)
        local extra = left - base * rest
        for j, id2 in ipairs(others) do
          alloc[id2] = base + ((j <= extra) and 1 or 0)
        end
        break
      end
    end
    local others_hold = 0
    for id, h in pairs(held) do
      if id ~= me then others_hold = others_hold + h[d] end
    end
    local free = cap[d] - others_hold
    hold = math.max(math.min(alloc[me], free), use[d])
    allow = math.min(alloc[me], hold)
    held[me][d] = hold
    for id, h in pairs(held) do
      if alloc[id] and h[d] < alloc[id] then contended = '1' end
    end
  end
  table.insert(result, tostring(hold))
  table.insert(result, tostring(allow))
end
local gone = want[1] == 0 and want[2] == 0 and use[1] == 0 and use[2] == 0
if gone then
  redis.call('HDEL', KEYS[1], me)
  redis.call('HDEL', KEYS[2], me)
  redis.call('ZREM', KEYS[3], me)
else
  redis.call('HSET', KEYS[1], me, result[1] .. ' ' .. result[3])
  redis.call('HSET', KEYS[2], me, want[1] .. ' ' .. want[2])
  redis.call('ZADD', KEYS[3], now + lease, me)
end
local ttl = math.ceil(lease * 3000)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
table.insert(result, contended)
table.insert(result, tostring(redis.call('ZCARD', KEYS[3])))
return result
"""


# What processes sharing a rate limit's key tell each other of a hosted provider.
# KEYS: the learnt limits (a hash: rpm, tpm), the cooldown (a key that expires when
# the wait does).
# ARGV: requests and tokens a minute learnt (0, 0: nothing new to say), the wait a
# 429 asked for in ms (0: none; a longer one already set stays), seconds the learnt
# limits are kept.
# Returns: the learnt requests and tokens a minute ("0": none), the ms left of the
# cooldown (negative: none).
HOSTED_SHARE = """
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local wait_ms, keep = tonumber(ARGV[3]), tonumber(ARGV[4])
local cut = tonumber(ARGV[5])
local share, slowest, step = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local spacing, after = tonumber(ARGV[9]), tonumber(ARGV[10])
if rpm > 0 or tpm > 0 then
  redis.call('HSET', KEYS[1], 'rpm', rpm, 'tpm', tpm)
end
if wait_ms > 0 and redis.call('PTTL', KEYS[2]) < wait_ms then
  redis.call('SET', KEYS[2], '1', 'PX', wait_ms)
end
-- The speed every sharer spends the learnt budget at: cut to share of itself for
-- a burst of 429s (once per spacing, whoever met them), never below slowest;
-- raised by step a second from after past the last cut.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'speed', 'cut_until', 'raise_at')
local speed = tonumber(state[1] or '1')
local cut_until, raise_at = tonumber(state[2] or '0'), tonumber(state[3] or '0')
if cut > 0 and now >= cut_until then
  speed = math.max(slowest, speed * share)
  cut_until, raise_at = now + spacing, now + after
elseif speed < 1 and now >= raise_at then
  speed = math.min(1, speed + step)
  raise_at = now + 1000
end
redis.call('HSET', KEYS[1], 'speed', speed, 'cut_until', cut_until, 'raise_at', raise_at)
redis.call('EXPIRE', KEYS[1], keep)
local got = redis.call('HMGET', KEYS[1], 'rpm', 'tpm')
return {got[1] or '0', got[2] or '0', tostring(redis.call('PTTL', KEYS[2])), tostring(speed)}
"""
