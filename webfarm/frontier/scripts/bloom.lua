-- webfarm frontier, part 2 of 3: the scalable Bloom filter over bitmaps.
--
-- Layer i holds cap0 * 2^i fingerprints at error rate err0 / 2^i (RedisBloom's rule: the
-- compound rate stays below 2 * err0); a fingerprint is in the filter when it is in any
-- layer. Python passes two 32-bit hashes h1, h2 of the fingerprint; the k bit positions of
-- layer i are (h1 + j*h2 + (j^3-j)/6) mod m_i (enhanced double hashing), exact in doubles:
-- every intermediate stays below 2^38.

local LN2 = math.log(2)
local MAXBITS = 4294967296 -- 2^32 bits = 512 MB, the largest string Redis allows by default
local B = nil

local function bloom_grow()
  local i = B.n
  local p = B.err0 * 0.5 ^ i
  local cap = B.cap0 * 2 ^ i
  local m = math.ceil(cap * -math.log(p) / (LN2 * LN2))
  if m > MAXBITS then
    m = MAXBITS
    cap = math.floor(m * LN2 * LN2 / -math.log(p))
  end
  local k = math.ceil(-math.log(p) / LN2)
  -- preallocate: no greedy string growth, so memory is exactly m bits
  redis.call('SETRANGE', K_BLOOM .. ':' .. i, math.ceil(m / 8) - 1, '\0')
  B.m[i], B.k[i], B.c[i], B.f[i] = m, k, cap, 0
  B.n = i + 1
  redis.call('HSET', K_BLOOM, 'n', B.n, 'm' .. i, m, 'k' .. i, k, 'c' .. i, cap, 'f' .. i, 0)
end

-- Layers' parameters from the 'bloom' hash; with cap0/err0, create layer 0 if there is none.
local function bloom_load(cap0, err0)
  if B then return B end
  local flat = redis.call('HGETALL', K_BLOOM)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  B = {m = {}, k = {}, c = {}, f = {}, n = 0, dirty = {}}
  if h.n then
    B.n, B.cap0, B.err0 = tonumber(h.n), tonumber(h.cap0), tonumber(h.err0)
    for i = 0, B.n - 1 do
      local s = tostring(i)
      B.m[i], B.k[i] = tonumber(h['m' .. s]), tonumber(h['k' .. s])
      B.c[i], B.f[i] = tonumber(h['c' .. s]), tonumber(h['f' .. s]) or 0
    end
  elseif cap0 then
    B.cap0, B.err0 = tonumber(cap0), tonumber(err0)
    redis.call('HSET', K_BLOOM, 'cap0', cap0, 'err0', err0)
    bloom_grow()
  end
  return B
end

local function bloom_pos(i, h1, h2, j)
  return math.fmod(h1 + j * h2 + (j * j * j - j) / 6, B.m[i])
end

-- Bit by bit: a fingerprint that is not in the layer usually fails on its first bits.
local function bloom_test(i, h1, h2)
  local key = K_BLOOM .. ':' .. i
  for j = 0, B.k[i] - 1 do
    if redis.call('GETBIT', key, bloom_pos(i, h1, h2, j)) == 0 then return false end
  end
  return true
end

local function bloom_has(h1, h2)
  for i = B.n - 1, 0, -1 do
    if bloom_test(i, h1, h2) then return true end
  end
  return false
end

local function bloom_add(h1, h2) -- true when the fingerprint was new (and is now added)
  if bloom_has(h1, h2) then return false end
  local last = B.n - 1
  if B.f[last] >= B.c[last] then
    bloom_grow()
    last = B.n - 1
  end
  local args = {'BITFIELD', K_BLOOM .. ':' .. last}
  for j = 0, B.k[last] - 1 do
    local n = #args
    args[n + 1], args[n + 2], args[n + 3], args[n + 4] = 'SET', 'u1', bloom_pos(last, h1, h2, j), 1
  end
  redis.call(unpack(args))
  B.f[last] = B.f[last] + 1
  B.dirty[last] = true
  d_seen = d_seen + 1
  return true
end

local function bloom_save()
  if not B then return end
  for i, _ in pairs(B.dirty) do redis.call('HSET', K_BLOOM, 'f' .. i, B.f[i]) end
end
