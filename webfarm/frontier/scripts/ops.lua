-- webfarm frontier, part 3 of 3: the operations (ARGV[2]) and the dispatch.

local function finish()
  -- Entries written around this script (foreign or by hand) were never counted: popping
  -- them must not drive the counter below zero, or a worker would never see an idle frontier.
  if d_queued ~= 0 and redis.call('HINCRBY', K_STATS, 'queued', d_queued) < 0 then
    redis.call('HSET', K_STATS, 'queued', 0)
  end
  if d_seen ~= 0 then redis.call('HINCRBY', K_STATS, 'seen', d_seen) end
  if d_expired ~= 0 then redis.call('HINCRBY', K_STATS, 'expired', d_expired) end
  bloom_save()
end

-- Seen-check and enqueue n entries of 6 ARGV each from ARGV[a]: host, priority, dont_filter,
-- key1, key2, payload (key1/key2: two 32-bit hashes for 'bloom', fingerprint/'' for 'set').
-- Entries of one host go into its queue with one ZADD. 'urls' counts the URLs of each host
-- admitted through the dupefilter; with a budget > 0, an entry of a host that has used it
-- is refused before the seen-check (not marked seen: a larger budget admits it when it is
-- found again). dont_filter entries (start URLs, refetches) are never counted or refused,
-- but are marked seen: a link to one is not queued again (after a frontier reset, a
-- recrawl's refetches and the links the crawl found to them were each fetched).
-- Returns '1' enqueued, '0' seen before, '2' over the host's budget, per entry.
local function push(a, n, mode, cap0, err0, budget)
  if mode == 'bloom' then bloom_load(cap0, err0) end
  local seq0 = redis.call('INCRBY', K_SEQ, n) - n
  local first = math.floor(NOW / 1000)
  local ok, groups, hosts, used, added = {}, {}, {}, {}, {}
  for e = 1, n do
    local o = a + (e - 1) * 6
    local host = ARGV[o]
    local new = true
    if ARGV[o + 2] ~= '1' then
      if budget > 0 then
        if not used[host] then used[host] = tonumber(redis.call('HGET', K_URLS, host)) or 0 end
        if used[host] >= budget then new = 'budget' end
      end
      if new ~= 'budget' then
        if mode == 'set' then
          new = redis.call('SADD', K_SEEN, ARGV[o + 3]) == 1
          if new then d_seen = d_seen + 1 end
        else
          new = bloom_add(tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]))
        end
        if new then
          added[host] = (added[host] or 0) + 1
          if budget > 0 then used[host] = used[host] + 1 end
        end
      end
    elseif mode == 'set' then
      if redis.call('SADD', K_SEEN, ARGV[o + 3]) == 1 then d_seen = d_seen + 1 end
    else
      bloom_add(tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]))
    end
    ok[e] = new
    if new == true then
      local g = groups[host]
      if not g then
        g = {flat = {}, idx = {}}
        groups[host] = g
        hosts[#hosts + 1] = host
      end
      local f = g.flat
      f[#f + 1] = fmt_int(-tonumber(ARGV[o + 1]))
      f[#f + 1] = new_member(seq0 + e, 0, first, ARGV[o + 5])
      g.idx[#g.idx + 1] = e
    end
  end
  for host, count in pairs(added) do redis.call('HINCRBY', K_URLS, host, count) end
  for _, host in ipairs(hosts) do
    local g = groups[host]
    if not enqueue_many(host, g.flat) then
      for _, e in ipairs(g.idx) do ok[e] = false end
    end
  end
  local flags = {}
  for e = 1, n do flags[e] = (ok[e] == 'budget' and '2') or (ok[e] and '1') or '0' end
  return table.concat(flags)
end

local OPS = {}

-- step: acks, then pushes, then housekeeping and up to `want` pops, in one call.
-- ARGV: 3 worker, 4 lease_ms, 5 default_delay_ms, 6 batch, 7 want, 8 mode, 9 cap0, 10 err0,
--       11 host budget (0: none), 12 n_ack, 13 n_push, 14 wait ms for hosts outside scope,
--       15 scope (the worker's host names, bare or host:port, space-separated; '' = every
--       host; see parse_scope), then n_ack lease ids, then n_push entries (see push).
-- Returns {acked, push flags '1'/'0'/'2', ready_in ms or -1, the worker's exchange count (0
-- without a worker), leases found expired and put back, up to 3 of their workers
-- (space-separated), the fleet's default delay ms and the worker whose it is, then lease,
-- host, payload, attempts of each pop}
OPS.step = function()
  local worker, lease_ms = ARGV[3], tonumber(ARGV[4])
  local default_ms, default_of = fleet_default(worker, tonumber(ARGV[5]))
  local batch, want = tonumber(ARGV[6]), tonumber(ARGV[7])
  local n_ack, n_push = tonumber(ARGV[12]), tonumber(ARGV[13])
  local mode, acked, flags = ARGV[8], 0, ''
  local wait, scope = tonumber(ARGV[14]), parse_scope(ARGV[15])
  if n_push > 0 then -- before any write: a mismatch must change nothing
    local cur = redis.call('HGET', K_STATS, 'dupefilter')
    if not cur then
      redis.call('HSET', K_STATS, 'dupefilter', mode)
    elseif cur ~= mode then
      return redis.error_reply('WEBFARM this frontier uses dupefilter=' .. cur .. ', not ' ..
                               mode .. ' (reset it to change)')
    end
  end
  for i = 16, 15 + n_ack do
    if unlease(ARGV[i], false) then acked = acked + 1 end
  end
  if n_push > 0 then
    flags = push(16 + n_ack, n_push, mode, ARGV[9], ARGV[10], tonumber(ARGV[11]))
  end
  local count = 0
  if worker ~= '' then count = redis.call('HINCRBY', K_WORKERS, worker, 1) end
  local out = {acked, flags, '-1', count, 0, '', default_ms, default_of}
  if want > 0 then
    maintain(batch)
    out[5], out[6] = d_expired, table.concat(expired_from, ' ')
    local got, host_at = 0, nil
    for _ = 1, want do
      local p, at = pop_one(worker, lease_ms, default_ms, scope, wait)
      if not p then
        host_at = at
        break
      end
      for j = 1, 4 do out[#out + 1] = p[j] end
      got = got + 1
    end
    if got < want then out[3] = fmt_int(ready_in(host_at)) end
  end
  return out
end

-- release: ARGV[3..] lease ids -> back to their queues now, same priority and place
OPS.release = function()
  local n = 0
  for i = 3, #ARGV do
    local rec = unlease(ARGV[i], true)
    if rec and requeue_record(rec, 'lease') then n = n + 1 end
  end
  return n
end

-- renew: ARGV 3 lease ms, then the lease ids a live worker still works on: each is due
-- lease ms from now again. A lease no longer held (acked, or expired: handed out again
-- under a new id) stays gone. Returns the ids no longer held.
OPS.renew = function()
  local deadline, gone = NOW + tonumber(ARGV[3]), {}
  for i = 4, #ARGV do
    if redis.call('ZSCORE', K_LEASES, ARGV[i]) then
      redis.call('ZADD', K_LEASES, deadline, ARGV[i])
    else
      gone[#gone + 1] = ARGV[i]
    end
  end
  return gone
end

-- release_worker: ARGV[3] worker. Walks the lease hash (in-flight requests only).
OPS.release_worker = function()
  local n, prefix = 0, ARGV[3] .. ' '
  redis.call('HDEL', K_WORKERS, ARGV[3])
  redis.call('HDEL', K_DEFAULTS, ARGV[3]) -- its default delay no longer counts
  local flat = redis.call('HGETALL', K_LEASE)
  for i = 1, #flat, 2 do
    if string.sub(flat[i + 1], 1, #prefix) == prefix then
      local rec = unlease(flat[i], true)
      if rec and requeue_record(rec, 'lease') then n = n + 1 end
    end
  end
  return n
end

-- retry: ARGV 3 lease id, 4 delay ms, 5 reason, 6 has payload, 7 payload, 8 '0' when the
-- request was never sent (it spends no attempt). 1 = done, 0 = no lease
OPS.retry = function()
  local rec = unlease(ARGV[3], true)
  if not rec then return 0 end
  local host, prio, member = parse_record(rec)
  if not host then
    dead_letter({reason = 'malformed lease record', payload = rec})
    return 1
  end
  local seq, att, first, payload = parse_member(member)
  if ARGV[6] == '1' then payload = ARGV[7] end
  local spent = ARGV[8] == '0' and 0 or 1
  member = seq .. ':' .. fmt_int(tonumber(att) + spent) .. ':' .. first .. ':' .. payload
  redis.call('ZADD', K_DELAYED, NOW + tonumber(ARGV[4]),
             host .. ' ' .. fmt_int(prio) .. ' ' .. member)
  redis.call('HINCRBY', K_STATS, 'retried', 1)
  if spent == 0 then redis.call('HINCRBY', K_STATS, 'waited', 1) end -- no attempt spent
  redis.call('HINCRBY', K_RETRIES, string.sub(ARGV[5], 1, 200), 1)
  return 1
end

-- dead: ARGV 3 lease id or '', 4 reason, 5 has payload, 6 payload, 7 status or '', 8 error or
-- '', 9 '0' when this hand-out was never tried (its attempts were spent before; optional)
OPS.dead = function()
  local t = {reason = ARGV[4], status = tonumber(ARGV[7]), first = math.floor(NOW / 1000),
             attempts = 0}
  if ARGV[8] ~= '' then t.error = ARGV[8] end
  if ARGV[3] ~= '' then
    local rec, worker = unlease(ARGV[3], true)
    if not rec then return 0 end
    t.lease_id, t.worker = ARGV[3], worker
    local host, prio, member = parse_record(rec)
    if host then
      local _, att, first, payload = parse_member(member)
      t.host, t.priority, t.payload = host, prio, payload
      t.attempts, t.first = tonumber(att) + (ARGV[9] == '0' and 0 or 1), tonumber(first)
    else
      t.payload = rec
    end
  end
  if ARGV[5] == '1' then t.payload = ARGV[6] end
  dead_letter(t)
  return 1
end

-- requeue_dead: ARGV[3] at most this many from the head; letters that cannot go back (no
-- host, priority or payload) rotate to the tail. Returns {requeued, examined}.
OPS.requeue_dead = function()
  local n = math.min(tonumber(ARGV[3]), redis.call('LLEN', K_DEAD))
  local moved = 0
  for _ = 1, n do
    local raw = redis.call('LPOP', K_DEAD)
    local ok, t = pcall(cjson.decode, raw)
    local good = ok and type(t) == 'table' and type(t.host) == 'string'
      and string.match(t.host, '^%S+$') and type(t.priority) == 'number'
      and type(t.payload) == 'string'
    if good then
      local first = tonumber(t.first) or math.floor(NOW / 1000)
      local member = new_member(redis.call('INCR', K_SEQ), 0, first, t.payload)
      if enqueue(t.host, t.priority, member) then moved = moved + 1 end
    else
      redis.call('RPUSH', K_DEAD, raw)
    end
  end
  return {moved, n}
end

OPS.purge_dead = function()
  local n = redis.call('LLEN', K_DEAD)
  redis.call('DEL', K_DEAD)
  return n
end

-- A host's next-allowed time becomes max(current, at), queued or not.
local function hold_until(host, at)
  local key = redis.call('ZSCORE', K_READY, host) and K_READY or K_COOL
  redis.call('ZADD', key, 'GT', at, host)
end

-- defer: ARGV 3 host, 4 ms -> next-allowed = max(current, now + ms)
OPS.defer = function()
  hold_until(ARGV[3], NOW + tonumber(ARGV[4]))
  return 1
end

-- arrive: ARGV 3 host, 4 lease id, 5 default ms, 6 '0' for a late HTTP request (the host
-- joins 'arrived' only through a render), 7 lease ms (optional) -> ms the request must
-- still wait.
-- A render reaches the host some time after its hand-out (a page to open, a browser to
-- start), so hand-outs spaced by the host's delay can arrive bunched. A render asks here
-- just before it navigates: it goes a delay after the last request known to reach the
-- host (another render's arrival, or any hand-out since this one's), and the host's next
-- hand-out waits a delay after it.
OPS.arrive = function()
  local host, id = ARGV[3], ARGV[4]
  local delay = host_delay_ms(host, (fleet_default('', tonumber(ARGV[5]))))
  local at = NOW
  local last = redis.call('HGET', K_ARRIVED, host)
  if last then
    local ms, who = string.match(last, '^(%d+) (.*)$')
    if ms and who ~= id then at = math.max(NOW, tonumber(ms) + delay) end
  else
    -- The host's first render (or an HTTP request leaving late): hand-outs are not
    -- recorded in 'arrived' before a render, so an HTTP request handed out since this
    -- one's came 0.2 s before the render at a 1 s delay. When the host's next turn is
    -- later than a delay after this one's hand-out (its lease's deadline, ARGV 7 lease
    -- ms), another request was handed out (or the host deferred) since: wait for it.
    local turn = tonumber(redis.call('ZSCORE', K_READY, host) or
                          redis.call('ZSCORE', K_COOL, host) or '')
    local deadline = tonumber(redis.call('ZSCORE', K_LEASES, id) or '')
    local lease_ms = tonumber(ARGV[7] or '')
    if turn and turn > NOW and not (deadline and lease_ms and
                                    turn <= deadline - lease_ms + delay) then
      at = turn
    end
  end
  if last or ARGV[6] ~= '0' then
    redis.call('HSET', K_ARRIVED, host, fmt_int(at) .. ' ' .. id)
  end
  hold_until(host, at + delay)
  return fmt_int(at - NOW)
end

-- The host's delay grew from old to new ms: its pending next-allowed time, computed with
-- the old one, moves out by the difference.
local function lengthen(host, old, new)
  for _, key in ipairs({K_READY, K_COOL}) do
    local cur = tonumber(redis.call('ZSCORE', key, host) or '')
    if cur and cur > NOW then redis.call('ZADD', key, 'GT', cur - old + new, host) end
  end
end

-- limit: ARGV 3 host, 4 floor ms, 5 max ms, 6 default ms -> the host's delay now, ms. A 429:
-- the host's delay doubles, for every worker (at least the floor, at most the max), and
-- comes down again by itself, 50 ms a second (limited_ms). Once per delay: a 429 to a
-- request that left before the last doubling does not double it again.
OPS.limit = function()
  local host = ARGV[3]
  local default_ms = fleet_default('', tonumber(ARGV[6]))
  local old = host_delay_ms(host, default_ms)
  local last = redis.call('HGET', K_LIMITED, host)
  local ms, at = string.match(last or '', '^(%d+) (%d+)$')
  if ms and NOW - tonumber(at) < tonumber(ms) / 2 then return fmt_int(old) end
  local new = math.min(math.max(2 * old, tonumber(ARGV[4])), tonumber(ARGV[5]))
  if new <= old then return fmt_int(old) end
  redis.call('HSET', K_LIMITED, host, fmt_int(new) .. ' ' .. fmt_int(NOW))
  lengthen(host, old, new)
  return fmt_int(new)
end

-- delay_of: ARGV 3 host, 4 default ms -> the host's delay as pops space it, ms.
OPS.delay_of = function()
  return fmt_int(host_delay_ms(ARGV[3], (fleet_default('', tonumber(ARGV[4])))))
end

-- set_delay: ARGV 3 host, 4 seconds, 5 default ms. A longer delay also pushes back the pending
-- next-allowed time (it was computed with the old, shorter delay).
OPS.set_delay = function()
  local host = ARGV[3]
  local default_ms = fleet_default('', tonumber(ARGV[5]))
  local old = host_delay_ms(host, default_ms)
  redis.call('HSET', K_DELAY, host, ARGV[4])
  local new = host_delay_ms(host, default_ms, true)
  if new > old then lengthen(host, old, new) end
  return 1
end

-- seen: ARGV 3 mode, then key1, key2 per fingerprint -> '1'/'0' per fingerprint
OPS.seen = function()
  local out = {}
  if ARGV[3] ~= 'set' then bloom_load() end
  for i = 4, #ARGV - 1, 2 do
    local hit
    if ARGV[3] == 'set' then
      hit = redis.call('SISMEMBER', K_SEEN, ARGV[i]) == 1
    else
      hit = B.n > 0 and bloom_has(tonumber(ARGV[i]), tonumber(ARGV[i + 1]))
    end
    out[#out + 1] = hit and '1' or '0'
  end
  return table.concat(out)
end

OPS.counts = function()
  local s = redis.call('HMGET', K_STATS, 'queued', 'seen', 'retried', 'expired', 'waited')
  local queued, hosts = tonumber(s[1]) or 0, redis.call('ZCARD', K_READY)
  if hosts == 0 and queued ~= 0 then
    -- 'ready' lists every host with queued entries: none means nothing is queued. The
    -- counter drifted (queue keys deleted or written by hand); heal it, or no worker
    -- would ever see an idle frontier.
    queued = 0
    redis.call('HSET', K_STATS, 'queued', 0)
  end
  return {queued, redis.call('ZCOUNT', K_READY, '-inf', string.format('(%.3f', NOW + 0.5)),
          hosts, redis.call('ZCARD', K_DELAYED),
          redis.call('ZCARD', K_LEASES), redis.call('LLEN', K_DEAD), tonumber(s[2]) or 0,
          tonumber(s[3]) or 0, tonumber(s[4]) or 0, tonumber(s[5]) or 0}
end

-- idle_in: ARGV[3] scope (host names, bare or host:port, space-separated). {1, entries of
-- other hosts queued or delayed} when no host of the scope has queued, delayed or leased entries;
-- {0, 0} when one has, or when there is more than IDLE_SCAN of one kind to look at (a
-- worker then waits for the whole frontier).
local IDLE_SCAN = 10000
OPS.idle_in = function()
  local scope = parse_scope(ARGV[3])
  if not scope then return redis.error_reply('WEBFARM idle_in needs host names') end
  for _, key in ipairs({K_READY, K_DELAYED, K_LEASES}) do
    if redis.call('ZCARD', key) > IDLE_SCAN then return {0, 0} end
  end
  for _, host in ipairs(redis.call('ZRANGE', K_READY, 0, -1)) do
    if in_scope(host, scope) then return {0, 0} end
  end
  for _, rec in ipairs(redis.call('ZRANGE', K_DELAYED, 0, -1)) do
    local host = string.match(rec, '^(%S+) ')
    if not host or in_scope(host, scope) then return {0, 0} end
  end
  for _, value in ipairs(redis.call('HVALS', K_LEASE)) do
    local host = string.match(value, '^%S+ (%S+) ')
    if not host or in_scope(host, scope) then return {0, 0} end
  end
  local queued = tonumber(redis.call('HGET', K_STATS, 'queued')) or 0
  return {1, queued + redis.call('ZCARD', K_DELAYED)}
end

OPS.next_ready = function() return fmt_int(ready_in(select(2, pick_host(nil, 0)))) end

-- hosts: ARGV 3 'ready'|'cool', ARGV 4 ZSCAN cursor, ARGV 5 count, 6 default ms -> {next
-- cursor, now ms, then host, next allowed ms, queued, delay ms, urls or '' per host}. A page
-- at a time, so a broad crawl's million hosts never hold Redis up for the workers.
OPS.hosts = function()
  local default_ms = fleet_default('', tonumber(ARGV[6]))
  local page = redis.call('ZSCAN', ARGV[3] == 'cool' and K_COOL or K_READY, ARGV[4],
                          'COUNT', tonumber(ARGV[5]))
  local out, flat = {page[1], fmt_int(NOW)}, page[2]
  for i = 1, #flat, 2 do
    local host = flat[i]
    local n = redis.pcall('ZCARD', qkey(host))
    out[#out + 1] = host
    out[#out + 1] = flat[i + 1]
    out[#out + 1] = type(n) == 'number' and n or 0
    out[#out + 1] = host_delay_ms(host, default_ms)
    out[#out + 1] = redis.call('HGET', K_URLS, host) or ''
  end
  return out
end

local f = OPS[OP]
if not f then return redis.error_reply('WEBFARM unknown frontier operation ' .. tostring(OP)) end
local result = f()
finish()
return result
