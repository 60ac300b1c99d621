-- webfarm frontier, part 1 of 3: keys, entries, queues, leases, pops.
-- The three files (common.lua, bloom.lua, ops.lua) are ONE script, loaded once (EVALSHA):
-- each call is one round trip and atomic.
--
-- KEYS[1] = <P>stats (routing only: every key shares the {spider} hash tag, one slot)
-- ARGV[1] = key prefix <P> = 'webfarm:{spider}:', ARGV[2] = operation, ARGV[3..] = its arguments
--
-- Keys (all under <P>):
--   q:<host>  ZSET  a host's queue; score -priority, member 'SEQ:ATTEMPTS:FIRST:PAYLOAD'
--                   (SEQ = 12 hex digits, so equal scores pop in push order: FIFO)
--   ready     ZSET  host -> next-allowed ms, only hosts with queued entries
--   cool      ZSET  host -> next-allowed ms of hosts whose queue went empty (kept until due)
--   delay     HASH  host -> delay in seconds (Crawl-delay, AutoThrottle), shared by workers
--   delayed   ZSET  record -> due ms (retries); record = 'HOST PRIO MEMBER'
--   leases    ZSET  lease id -> deadline ms;  lease HASH id -> 'WORKER HOST PRIO MEMBER'
--   dead      LIST  dead letters, JSON
--   stats     HASH  counters: queued, seen, retried, expired; dupefilter (the mode in use)
--   retries   HASH  retry reason -> count
--   seq       STR   counter for entry sequence numbers and lease ids
--   workers   HASH  worker -> its exchanges so far (a worker that is told a count it saw
--                   before knows Redis lost its last writes: restarted, or failed over)
--   seen      SET   fingerprints (dupefilter 'set')
--   urls      HASH  host -> URLs admitted through the dupefilter (the host budget counts these)
--   bloom     HASH  the Bloom filter's layers; bloom:<i> STRING layer i's bitmap
--   arrived   HASH  host -> 'MS LEASE', the last request known to reach it: a render's
--                   arrival, or a hand-out, once the host has had a render (see OPS.arrive)
--   defaults  HASH  worker -> 'MS EXPIRES_MS', the default host delay it runs with (see
--                   fleet_default)
--   limited   HASH  host -> 'MS AT_MS', the delay the host's 429s asked for (see limited_ms)
--
-- Times come from the server's clock (TIME), never from workers.

local P = ARGV[1]
local OP = ARGV[2]
local K_STATS, K_READY, K_COOL, K_DELAY = P .. 'stats', P .. 'ready', P .. 'cool', P .. 'delay'
local K_DELAYED, K_LEASES, K_LEASE = P .. 'delayed', P .. 'leases', P .. 'lease'
local K_SEQ, K_DEAD, K_SEEN, K_BLOOM = P .. 'seq', P .. 'dead', P .. 'seen', P .. 'bloom'
local K_RETRIES, K_URLS, K_WORKERS = P .. 'retries', P .. 'urls', P .. 'workers'
local K_ARRIVED, K_DEFAULTS, K_LIMITED = P .. 'arrived', P .. 'defaults', P .. 'limited'
local DEFAULTS_TTL = 120000 -- ms a worker's default delay counts after its last exchange

local T = redis.call('TIME')
local NOW = tonumber(T[1]) * 1000 + math.floor(tonumber(T[2]) / 1000) -- ms, an exact integer

local d_queued, d_seen, d_expired = 0, 0, 0
local expired_from = {} -- workers whose leases expired in this call (at most 3 named)
local ready_known = {} -- hosts known to be in 'ready' during this call

local function fmt_int(x) return string.format('%d', x) end
local function qkey(host) return P .. 'q:' .. host end

local function parse_member(m) -- seq, attempts, first (s), payload; nil when malformed
  return string.match(m, '^(%x+):(%d+):(%d+):(.*)$')
end

local function parse_record(r) -- host, priority, member; nil when malformed
  local host, prio, member = string.match(r, '^(%S+) (%-?%d+) (.*)$')
  if host and parse_member(member) then return host, tonumber(prio), member end
  return nil
end

local function new_member(seq, attempts, first, payload)
  return string.format('%012x:%d:%d:', seq, attempts, first) .. payload
end

local function dead_letter(t)
  t.last = NOW / 1000
  redis.call('RPUSH', K_DEAD, cjson.encode(t))
end

-- A host with queued entries joins 'ready' at its remembered next-allowed time or now.
local function mark_ready(host)
  if ready_known[host] then return end
  if not redis.call('ZSCORE', K_READY, host) then
    local at = NOW
    local c = redis.call('ZSCORE', K_COOL, host)
    if c then
      redis.call('ZREM', K_COOL, host)
      c = tonumber(c)
      if c > at then at = c end
    end
    redis.call('ZADD', K_READY, at, host)
  end
  ready_known[host] = true
end

-- Add members to a host's queue: flat list score, member, score, member...
-- Returns false (and dead-letters them) when the queue key holds something foreign.
local function enqueue_many(host, flat)
  local r
  for i = 1, #flat, 2000 do
    r = redis.pcall('ZADD', qkey(host), unpack(flat, i, math.min(#flat, i + 1999)))
    if type(r) == 'table' and r.err then break end
  end
  if type(r) == 'table' and r.err then
    for i = 2, #flat, 2 do
      local _, att, first, payload = parse_member(flat[i])
      dead_letter({reason = 'queue key is not a sorted set: ' .. r.err, host = host,
                   priority = 0 - tonumber(flat[i - 1]), attempts = tonumber(att),
                   first = tonumber(first), payload = payload})
    end
    return false
  end
  d_queued = d_queued + #flat / 2
  mark_ready(host)
  return true
end

local function enqueue(host, prio, member)
  return enqueue_many(host, {fmt_int(-prio), member})
end

local function requeue_record(rec, where)
  local host, prio, member = parse_record(rec)
  if host then return enqueue(host, prio, member) end
  dead_letter({reason = 'malformed ' .. where .. ' record', payload = rec})
  return false
end

local function lease(host, prio, member, worker, lease_ms)
  local id = string.format('%x', redis.call('INCR', K_SEQ))
  redis.call('ZADD', K_LEASES, NOW + lease_ms, id)
  redis.call('HSET', K_LEASE, id, worker .. ' ' .. host .. ' ' .. fmt_int(prio) .. ' ' .. member)
  return id
end

-- Forget a held lease. With want_record, returns its record 'HOST PRIO MEMBER' and worker;
-- otherwise true. nil when the lease is not held (acked, or expired and handed out again).
local function unlease(id, want_record)
  if redis.call('ZREM', K_LEASES, id) == 0 then return nil end
  local value = want_record and redis.call('HGET', K_LEASE, id)
  redis.call('HDEL', K_LEASE, id)
  if not want_record then return true end
  if not value then return nil end
  local worker, rec = string.match(value, '^(%S+) (.*)$')
  return rec or value, worker
end

-- An expired lease's entry back in its queue, one attempt spent: its worker was killed or
-- stalled (a live worker renews what it still works on, OPS.renew), so a page that kills
-- its worker is not handed out for ever; the worker that pops it with no attempt left
-- dead-letters it.
local function requeue_expired(rec)
  local host, prio, member = parse_record(rec)
  local seq, att, first, payload = parse_member(member or '')
  if not seq then return requeue_record(rec, 'lease') end
  return enqueue(host, prio, seq .. ':' .. fmt_int(tonumber(att) + 1) .. ':' .. first .. ':' ..
                 payload)
end

-- Bounded housekeeping before a pop: due retries and expired leases go back to their
-- queues, stale 'cool' hosts are forgotten.
local function maintain(batch)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', NOW, 'LIMIT', 0, batch)
  if #due > 0 then
    redis.call('ZREM', K_DELAYED, unpack(due))
    for _, rec in ipairs(due) do requeue_record(rec, 'delayed') end
  end
  local expired = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', NOW, 'LIMIT', 0, batch)
  for _, id in ipairs(expired) do
    local rec, who = unlease(id, true)
    if rec then
      d_expired = d_expired + 1
      if who and #expired_from < 3 and not expired_from[who] then
        expired_from[who] = true
        expired_from[#expired_from + 1] = who
      end
      requeue_expired(rec)
    end
  end
  local cool = redis.call('ZRANGEBYSCORE', K_COOL, '-inf', NOW, 'LIMIT', 0, batch)
  if #cool > 0 then redis.call('ZREM', K_COOL, unpack(cool)) end
end

-- The default host delay of the fleet: the longest any worker that exchanged in the last
-- DEFAULTS_TTL runs with (``worker`` '' reads without declaring). One worker given a
-- shorter WEBFARM_HOST_DELAY (a rolling deploy, one job's setting) spaced every host by
-- it, for every worker: 2 s gaps became 0.2 s ones when it joined.
local function fleet_default(worker, own_ms)
  if worker ~= '' then
    redis.call('HSET', K_DEFAULTS, worker, fmt_int(own_ms) .. ' ' .. fmt_int(NOW + DEFAULTS_TTL))
  end
  local best, who
  local flat = redis.call('HGETALL', K_DEFAULTS)
  for i = 1, #flat, 2 do
    local ms, expires = string.match(flat[i + 1], '^(%d+) (%d+)$')
    if not ms or tonumber(expires) < NOW then
      redis.call('HDEL', K_DEFAULTS, flat[i])
    elseif not best or tonumber(ms) > best then
      best, who = tonumber(ms), flat[i]
    end
  end
  -- A caller that is no worker (`scrapy frontier`, a seed) has its own default counted only
  -- when no worker runs: it read, and spaced, hosts by its own settings' default. Second
  -- answer: the worker whose default it is (wrap the call in parentheses when passing it
  -- as a last argument, or that answer becomes the next parameter).
  return best or own_ms, who or ''
end

-- The delay a host's 429s asked for (OPS.limit), shared by every worker: MS at AT_MS, then
-- 50 ms less each second (half of it in ten of its turns), back down to the host's other
-- delays. At 100 ms a second a limiter allowing a page in 0.7 s refused one every 6 s,
-- twice as often; halving instead took 95 s to come back from a short burst. Kept apart
-- from the host's delay, which the latency rule of any worker sets again after most
-- answers: each worker used to keep its own, and the last to write won, so a worker that
-- had seen no 429 undid the fleet's backoff. Only a pop or a worker's set_delay (``tidy``)
-- drops a spent one: reading it (`scrapy frontier`) changes nothing.
local function limited_ms(host, tidy)
  local v = redis.call('HGET', K_LIMITED, host)
  if not v then return 0 end
  local ms, at = string.match(v, '^(%d+) (%d+)$')
  local left = ms and tonumber(ms) - math.floor((NOW - tonumber(at)) / 20)
  if not left or left <= 0 then
    if tidy then redis.call('HDEL', K_LIMITED, host) end
    return 0
  end
  return left
end

-- A host's own delay (robots.txt, the latency rule, DOWNLOAD_SLOTS, 429s) raises the fleet's
-- default, never lowers it: a worker with a shorter default set each host it fetched to
-- about that default, and those hosts went as fast as that worker's setting for everyone.
local function host_delay_ms(host, default_ms, tidy)
  local d = tonumber(redis.call('HGET', K_DELAY, host) or '')
  local ms = default_ms
  if d then ms = math.max(math.floor(d * 1000 + 0.5), default_ms) end
  return math.max(ms, limited_ms(host, tidy))
end

local function drop_ready(host)
  redis.call('ZREM', K_READY, host)
  ready_known[host] = nil
end

-- A worker's scope from its space-separated host names, each bare (any port) or with a
-- port (host:port, [v6]:port: that port only): nil (every host) when none.
local function parse_scope(text)
  if text == '' then return nil end
  local scope = {names = {}, known = {}}
  for token in string.gmatch(text, '%S+') do
    local name, port = string.match(token, '^%[(.*)%]:(%d+)$')
    if not name then name, port = string.match(token, '^([^:]+):(%d+)$') end
    name = name or token
    scope.names[#scope.names + 1] = {name, '.' .. name, port}
  end
  return scope
end

-- Is a queue's host (host[:port], [v6]:port) one of scope's names or a subdomain of one,
-- as Scrapy's offsite filter judges allowed_domains, on the scope's port if it names one
-- (two crawls of one host on two ports took each other's pages)? Remembered for the call.
local function in_scope(host, scope)
  local hit = scope.known[host]
  if hit ~= nil then return hit end
  local name, port = string.match(host, '^%[(.*)%]:?(%d*)$')
  if not name then name, port = string.match(host, '^(.-):(%d+)$') end
  name = name or host
  if port == '' then port = nil end
  hit = false
  for _, d in ipairs(scope.names) do
    -- a host without a port is on its scheme's default one: 80 or 443
    if (name == d[1] or (#name > #d[2] and string.sub(name, -#d[2]) == d[2]))
        and (d[3] == nil or d[3] == port or (port == nil and (d[3] == '80' or d[3] == '443'))) then
      hit = true
      break
    end
  end
  scope.known[host] = hit
  return hit
end

-- The host to pop from: the one allowed the longest. A worker kept to some hosts (scope)
-- counts a host outside them as allowed `wait` ms later, so it serves its own first and
-- takes another crawl's host (to give it back, offsite) only when no worker of that host
-- took it meanwhile. Returns the host when it is due (else nil), and when it is or will be
-- (ms; nil when no host is ready). At most SCAN_HOSTS of 'ready' are looked at.
local SCAN_HOSTS = 512
local function pick_host(scope, wait)
  local best, best_at, from, done = nil, nil, 0, false
  if not scope then
    local r = redis.call('ZRANGE', K_READY, 0, 0, 'WITHSCORES')
    best, best_at = r[1], tonumber(r[2])
    done = true
  end
  local size = 1 -- the first host is most often this worker's own
  while not done and from < SCAN_HOSTS do
    local page = redis.call('ZRANGE', K_READY, from, from + size - 1, 'WITHSCORES')
    for i = 1, #page, 2 do
      local at = tonumber(page[i + 1])
      if best_at and at >= best_at then
        done = true
        break
      end
      if not in_scope(page[i], scope) then at = at + wait end
      if not best_at or at < best_at then best, best_at = page[i], at end
    end
    -- later hosts are allowed no sooner than the last one read
    done = done or #page < 2 * size or (best_at and best_at <= tonumber(page[#page]))
    from, size = from + size, 16
  end
  if best_at and best_at < NOW + 0.5 then return best, best_at end
  return nil, best_at
end

-- The host that has been allowed the longest gives its highest-priority entry. Without
-- one: nil, and when a host may be (pick_host's answer, for ready_in).
local function pop_one(worker, lease_ms, default_ms, scope, wait)
  for _ = 1, 100 do
    local host, at = pick_host(scope, wait)
    if not host then return nil, at end
    local q = qkey(host)
    local res = redis.pcall('ZPOPMIN', q)
    if res.err then
      drop_ready(host)
      dead_letter({reason = 'queue key is not a sorted set: ' .. res.err, host = host})
    elseif #res == 0 then
      drop_ready(host) -- repair: a ready host without queue
    else
      local member, prio = res[1], 0 - tonumber(res[2])
      local _, att, _, payload = parse_member(member)
      local empty = redis.call('ZCARD', q) == 0
      if not payload then -- not one of ours, so never counted in 'queued'
        dead_letter({reason = 'malformed queue entry', host = host, payload = member})
        if empty then drop_ready(host) end
      else
        d_queued = d_queued - 1
        local nxt = NOW + host_delay_ms(host, default_ms, true)
        if empty then
          drop_ready(host)
          if nxt > NOW then redis.call('ZADD', K_COOL, nxt, host) end
        else
          -- No delay: a microsecond behind the last host ready now. At equal turns
          -- ZRANGE orders by name, and with no delay the first host took every pop after
          -- a call's first round (9,918 fetches against about 1,100 for each of three
          -- others). pick_host takes turns before NOW + 0.5 as ready.
          if nxt <= NOW then
            local last = redis.call('ZREVRANGEBYSCORE', K_READY, string.format('(%.3f', NOW + 0.5),
                                    '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
            nxt = math.max(NOW, tonumber(last[2] or '') or NOW) + 0.001
          end
          redis.call('ZADD', K_READY, nxt, host)
        end
        local id = lease(host, prio, member, worker, lease_ms)
        if redis.call('HEXISTS', K_ARRIVED, host) == 1 then -- a host that has renders
          redis.call('HSET', K_ARRIVED, host, fmt_int(NOW) .. ' ' .. id)
        end
        return {id, host, payload, tonumber(att)}
      end
    end
  end
  return nil, select(2, pick_host(scope, wait))
end

-- ms until a host may be ready, a retry is due or a lease expires; -1 when nothing is pending.
-- host_at: when a host may be popped (pick_host's second answer; with a scope, by this
-- worker, not by any).
local function ready_in(host_at)
  local best = host_at
  for _, key in ipairs({K_DELAYED, K_LEASES}) do
    local r = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if r[2] then
      local s = tonumber(r[2])
      if not best or s < best then best = s end
    end
  end
  if not best then return -1 end
  return math.max(0, best - NOW)
end
