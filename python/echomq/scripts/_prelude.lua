-- _prelude.lua -- what every verb script shares: the Lua twin of module/emq_core.c (the
-- error texts, parsing, counters, tokens, transitions), module/emq_keys.c (key checks,
-- derived keys, the queue's settings, the fence) and the parts of module/emq_effects.c a
-- script needs (a finished row's retention).
--
-- The client (python/echomq/_scripts.py) sends each verb as
--     FCALL emq_<verb>_<version> <numkeys> <KEYS...> <setting> <argv...>
-- (the library: this prelude, the shared files and every verb, loaded once per server with
-- FUNCTION LOAD), or, where the caller may not load a library, as
--     EVALSHA <sha of shebang + this prelude + the verb's file> <numkeys> <KEYS...> <setting> <argv...>
-- where <argv...> are the EMQ.* command's arguments exactly as the module gets them, so
-- `argv[i]` in a verb script is `argv[i]` of its C handler, and <setting> is the one value
-- the client supplies that the module has on the server: CLAIM's and COMPLETECLAIM's nonce
-- (the random part of their tokens) and max-limit, "<nonce> <max-limit>"; the max-limit of
-- the verbs that take a count or a list (SWEEP, ENQUEUEMANY, RETRYDEAD, PURGE, OBLITERATE,
-- FORGET); CHECKPOINT's max-state-bytes ('' for the other verbs).  KEYS are the keys known before the call (python/echomq/_scripts.py,
-- KEYS_OF): the declared keys of the module command, plus the row of a named id, a claim's
-- request record and the settings of the verbs that always read them.  The Lua addresses
-- keys by the names in argv; KEYS are for cluster routing and the server's ACL check.
--
-- The shape of every verb is the C handler's: parse -> open and type-check -> read ->
-- decide -> apply -> reply, and nothing is written before everything is validated.  A
-- refusal is `emq.refuse(text)`, which unwinds to `emq.run` and answers the error: it can
-- only happen before the first write.
--
-- Numbers.  Lua numbers are doubles: exact up to 2^53.  Counters (attempts, tries, stalled,
-- retries, the failed metric) may hold any 64-bit integer, so they are kept as canonical
-- decimal strings and added exactly (emq.dec_add), as HINCRBY would; times and leases stay
-- at or below 2^53 by the contract's own checks and are plain numbers, written with
-- string.format('%d') (never tostring, which switches to exponents).

local emq = {}

-- ---------------------------------------------------------------------------
-- Errors: the one table of module/emq_core.c, word for word.
-- ---------------------------------------------------------------------------
local E = {
    LEASE_NOT_INTEGER = 'ERR lease-ms is not an integer',
    LEASE_TOO_SMALL = 'ERR lease-ms must be at least 1',
    LEASE_TOO_LARGE = 'ERR lease-ms is too large: the deadline would not be an exact score',
    MAX_STALLED = 'ERR max-stalled must be an integer >= 1',
    LIMIT = 'ERR limit must be an integer >= 1',
    MAX_ATTEMPTS = 'ERR max-attempts must be an integer >= 1',
    CLAIM_COUNT = 'ERR COUNT must be an integer >= 1',
    LIMIT_TOO_LARGE = "ERR limit exceeds the server's emq.max-limit",
    DELAY = 'ERR DELAY must be an integer >= 0',
    DELAY_TOO_LARGE = 'ERR DELAY is too large: the due time would not be an exact score',
    AT = 'ERR AT must be an integer >= 0 (unix time in milliseconds)',
    AT_TOO_LARGE = 'ERR AT is too large: the due time would not be an exact score',
    DELAY_AND_AT = 'ERR DELAY and AT cannot be used together',
    BLOCK = 'ERR BLOCK must be an integer >= 0 (0 waits forever)',
    BLOCK_TOO_LARGE = 'ERR BLOCK is too large: the wait would not end at an exact time',
    MANY_COUNT = 'ERR count must be an integer >= 1',
    MANY_TOO_MANY = "ERR count exceeds the server's emq.max-limit",
    MANY_DUPLICATE = 'ERR the same id appears twice in one EMQ.ENQUEUEMANY',
    FORGET_TOO_MANY = "ERR the number of ids exceeds the server's emq.max-limit",
    SAME_KEY = 'ERR <active> and <job> must be different keys',
    THREE_SETS = 'ERR <active>, <pending> and <dead> must be <base>active, <base>pending and <base>dead',
    PENDING_KEY = 'ERR <pending> must be <base>pending',
    PENDING_ACTIVE_KEYS = 'ERR <pending> and <active> must be <base>pending and <base>active',
    PENDING_ACTIVE_ORDER = 'ERR <active> and <pending> must be <base>active and <base>pending',
    NO_HASH_TAG = 'ERR in cluster mode <base> must contain a hash tag, e.g. emq:{queue}:',
    WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value',
    NOPERM_DERIVED = 'NOPERM this user has no permissions to access the job rows or metrics derived from <base>',
    STALLED_NOT_INTEGER = "ERR a swept job row has a 'stalled' field that is not an integer",
    ATTEMPTS_NOT_INTEGER = "ERR the job row's 'attempts' field is not an integer",
    TRIES_NOT_INTEGER = "ERR the job row's 'tries' field is not an integer",
    FAILED_NOT_INTEGER = "ERR the metrics:failed 'count' field is not an integer",
    OVERFLOW = 'ERR increment or decrement would overflow',
    STALE_EXTEND = 'EMQSTALE extend token mismatch',
    STALE_COMPLETE = 'EMQSTALE complete token mismatch',
    STALE_FAIL = 'EMQSTALE fail token mismatch',
    STALE_RELEASE = 'EMQSTALE release token mismatch',
    NOT_ACTIVE = 'EMQSTALE job is no longer active',
    EXISTS = 'EMQEXISTS a job with this id already exists',
    JOB_KEY = 'ERR <job> must be <base>job:<id>, where <active> is <base>active',
    META_NOT_INTEGER = "ERR the queue's meta hash holds a setting that is not an integer",
    TRYAGAIN = 'TRYAGAIN a key of this queue is moving between cluster nodes; retry',
    SYNTAX = 'ERR syntax error',
    REQ_EMPTY = 'ERR the REQ request id must not be empty',
    REQ_RECORD = "ERR the record of this REQ request id is malformed or another call's",
    STATE_TOO_LARGE = 'ERR the checkpoint state is larger than emq.max-state-bytes',
    OOM = "OOM command not allowed when used memory > 'maxmemory'.",
    RETENTION_VALUE = 'ERR a retention must be -1 (keep forever) or an integer from 0 to 9007199254740992 (ms)',
    DEAD_PENDING_KEYS = 'ERR <dead> and <pending> must be <base>dead and <base>pending',
    DEAD_KEY = 'ERR <dead> must be <base>dead',
    UNTIL = 'ERR UNTIL must be an integer (server ms)',
    RETRIES_NOT_INTEGER = "ERR the job row's 'retries' field is not an integer",
    STATE_PENDING = 'EMQSTATE the job is pending: only a dead or cancelled job can be retried',
    STATE_ACTIVE = 'EMQSTATE the job is active: only a dead or cancelled job can be retried',
    STATE_DONE = 'EMQSTATE the job is done: only a dead or cancelled job can be retried',
    STATE_UNKNOWN = 'EMQSTATE the job has no known state: only a dead or cancelled job can be retried',
    BUSY = 'EMQBUSY the queue has active jobs: obliterate it with FORCE to delete them too',
    PRIORITY = 'ERR PRIORITY must be an integer from -1000 to 1000',
    PRIORITY_FIELD = "ERR the job row's 'priority' field is not an integer from -1000 to 1000",
    PAYLOAD_TOO_LARGE = 'ERR the payload is larger than emq.max-payload-bytes',
    RESULT_TOO_LARGE = 'ERR the result is larger than emq.max-result-bytes',
    TRACE_TOO_LARGE = 'ERR the TRACE is larger than 65536 bytes',
    PROGRESS_TOO_LARGE = 'ERR the progress is larger than emq.max-state-bytes',
    RATE_MAX = 'ERR RATE must be an integer from 1 to 1000000000',
    RATE_PER = 'ERR PER must be an integer from 1 to 86400000 (ms)',
    BACKOFF = 'ERR BACKOFF must be an integer from 0 to 86400000 (ms)',
    LIMIT_FIELD = "ERR the queue's limit hash holds a field that is not a valid integer",
    UNIQUE_KEY = 'ERR the UNIQUE key must be 1 to 512 bytes long',
    UNIQUE_FOR = 'ERR FOR must be an integer from 1 to 2592000000 (ms: 30 days)',
    UNIQUE_UNTIL = "ERR UNTIL takes only 'done' (a time window is FOR <ms>)",
    UNIQUE_FOR_AND_UNTIL = 'ERR FOR and UNTIL cannot be used together',
    UNIQUE_NEEDED = 'ERR FOR, UNTIL and REPLACE need UNIQUE <key>',
    UNIQUE_MANY = 'ERR UNIQUE is for one job: EMQ.ENQUEUEMANY does not take it',
}
emq.E = E

-- Abort the verb with an error reply.  Only ever called before the first write.
function emq.refuse(text)
    error({ emq_refusal = text }, 0)
end

-- Run a verb's body: its reply, or the error it refused with.  Anything else (a bug, or
-- an error the server raised) is raised again untouched.
--
-- `commands` are the core commands the body may call once it has written something.  A
-- user allowed EVALSHA may still be refused one of them (an ACL that names commands), and
-- a refusal after a write would leave the verb half applied: each is checked first
-- (redis.acl_check_cmd checks without running), before anything is read or written.
-- The arguments after the key of each command checked: a well-formed call on KEYS[1],
-- which the server already let the caller read and write.
local CHECK_ARGS = {
    ZREM = { 'm' }, ZADD = { '0', 'm' }, HSET = { 'f', 'v' }, HINCRBY = { 'f', '1' }, HDEL = { 'f' },
    HGET = { 'f' }, HMGET = { 'f' }, SET = { 'v' }, PEXPIREAT = { '0' }, DEL = {}, PERSIST = {},
    RPUSH = { 'm' }, LPUSH = { 'm' }, LPOP = { '1' }, LRANGE = { '0', '0' },
}

local declared = {} -- the names in KEYS, for emq.open_derived; made anew by every call
local unique_release = {} -- the unique keys a call's ending jobs release (emq.ended_prepare): id -> key

function emq.run(commands, body)
    declared, unique_release = {}, {}
    for _, key in ipairs(KEYS) do declared[key] = true end
    for _, command in ipairs(commands) do
        if KEYS[1] and not redis.acl_check_cmd(command, KEYS[1], unpack(CHECK_ARGS[command])) then
            return redis.error_reply('NOPERM this user has no permissions to run the \'' .. command:lower()
                .. "' command, which the scripts backend calls")
        end
    end
    local ok, reply = pcall(body)
    if ok then
        return reply
    end
    if type(reply) == 'table' and reply.emq_refusal then
        return redis.error_reply(reply.emq_refusal)
    end
    error(reply, 0)
end

-- A verb: `body` run by emq.run when the verb is called.  Its file ends with
-- `return emq.verb(...)`: loaded as a script it is called at once; in the library
-- (Redis Functions) it is made once, at FUNCTION LOAD, and called by every FCALL.
function emq.verb(commands, body)
    return function() return emq.run(commands, body) end
end

-- The server's own arity error, as it answers for the module's commands.
function emq.wrong_arity(name)
    emq.refuse("ERR wrong number of arguments for '" .. name .. "' command")
end

-- The command's arguments as the C handler sees them (argv[1] is the first one after the
-- command's name; argc counts the name) and the client's setting (ARGV[1]).
function emq.args()
    local argv = {}
    for i = 2, #ARGV do
        argv[i - 1] = ARGV[i]
    end
    return argv, #ARGV, ARGV[1]
end

-- ---------------------------------------------------------------------------
-- The server clock, read once per verb (RedisModule_Milliseconds in the module).
-- ---------------------------------------------------------------------------
function emq.now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An integer as the decimal the module writes (no exponent, no fraction).
local function int(n)
    return string.format('%d', n)
end
emq.int = int

-- ---------------------------------------------------------------------------
-- Numbers (emq_core.c: emq_parse_ll and friends).
-- ---------------------------------------------------------------------------
local MAX_EXACT_SCORE = 9007199254740992 -- 2^53: the latest exact sorted-set score
emq.MAX_EXACT_SCORE = MAX_EXACT_SCORE
local INT64_MAX = '9223372036854775807'
local INT64_MIN_MAGNITUDE = '9223372036854775808'

-- A canonical base-10 signed 64-bit integer: optional '-', digits, no leading zeros, no '+',
-- no spaces, no overflow (the strings Redis itself takes as integers).  Returns the string
-- (canonical, so it is also the exact value) or nil.
local function canonical(s)
    if s == nil or s == false then
        return nil
    end
    local n = #s
    if n == 0 or n > 20 then
        return nil
    end
    if s == '0' then
        return s
    end
    local digits = s
    local negative = s:sub(1, 1) == '-'
    if negative then
        digits = s:sub(2)
    end
    if not digits:find('^[1-9][0-9]*$') then
        return nil
    end
    if #digits == 19 and digits > (negative and INT64_MIN_MAGNITUDE or INT64_MAX) then
        return nil
    end
    if #digits > 19 then
        return nil
    end
    return s
end
emq.canonical = canonical

-- emq_parse_ll: the value as a number (exact up to 2^53, which every check below is about),
-- or nil.
function emq.parse_ll(s)
    local c = canonical(s)
    return c and tonumber(c) or nil
end

-- Exact addition of two canonical decimal strings, for the 64-bit counters.  Returns the
-- canonical sum, or nil when it leaves the signed 64-bit range (HINCRBY's overflow).
local function mag_cmp(a, b)
    if #a ~= #b then
        return #a < #b and -1 or 1
    end
    if a == b then
        return 0
    end
    return a < b and -1 or 1
end

local function mag_add(a, b)
    local out, carry, i, j = {}, 0, #a, #b
    while i > 0 or j > 0 or carry > 0 do
        local d = carry
        if i > 0 then d = d + a:byte(i) - 48 end
        if j > 0 then d = d + b:byte(j) - 48 end
        out[#out + 1] = string.char(48 + d % 10)
        carry = math.floor(d / 10)
        i, j = i - 1, j - 1
    end
    return string.reverse(table.concat(out))
end

local function mag_sub(a, b) -- a >= b
    local out, borrow, i, j = {}, 0, #a, #b
    while i > 0 do
        local d = a:byte(i) - 48 - borrow
        if j > 0 then d = d - (b:byte(j) - 48) end
        if d < 0 then
            d, borrow = d + 10, 1
        else
            borrow = 0
        end
        out[#out + 1] = string.char(48 + d)
        i, j = i - 1, j - 1
    end
    local s = string.reverse(table.concat(out)):gsub('^0+', '')
    return s == '' and '0' or s
end

function emq.dec_add(a, b)
    if #a < 16 and #b < 16 then -- both below 10^15: doubles are exact
        return int(tonumber(a) + tonumber(b))
    end
    local an, bn = a:sub(1, 1) == '-', b:sub(1, 1) == '-'
    local am, bm = an and a:sub(2) or a, bn and b:sub(2) or b
    local negative, m
    if an == bn then
        negative, m = an, mag_add(am, bm)
    elseif mag_cmp(am, bm) >= 0 then
        negative, m = an, mag_sub(am, bm)
    else
        negative, m = bn, mag_sub(bm, am)
    end
    if m == '0' then
        return '0'
    end
    if mag_cmp(m, negative and INT64_MIN_MAGNITUDE or INT64_MAX) > 0 then
        return nil
    end
    return negative and ('-' .. m) or m
end

-- Compare two canonical decimal strings: -1, 0 or 1.
function emq.dec_cmp(a, b)
    local an, bn = a:sub(1, 1) == '-', b:sub(1, 1) == '-'
    if an ~= bn then
        return an and -1 or 1
    end
    local c = mag_cmp(an and a:sub(2) or a, bn and b:sub(2) or b)
    return an and -c or c
end

-- emq_lease_deadline: <lease-ms> an integer >= 1 whose deadline now + lease is still an
-- exact score.  (A lease above 2^53 is a rounded double here, and still above 2^53 - now.)
function emq.lease_deadline(now, s)
    local c = canonical(s)
    if c == nil then emq.refuse(E.LEASE_NOT_INTEGER) end
    if emq.dec_cmp(c, '1') < 0 then emq.refuse(E.LEASE_TOO_SMALL) end
    if now < 0 or now > MAX_EXACT_SCORE or emq.dec_cmp(c, int(MAX_EXACT_SCORE - now)) > 0 then
        emq.refuse(E.LEASE_TOO_LARGE)
    end
    return now + tonumber(c)
end

-- now + add, when add is a canonical integer >= 0 and the sum lies in [0, 2^53]; else nil
-- (emq_core.c: exact_sum).
local function exact_sum(now, c)
    if now < 0 or now > MAX_EXACT_SCORE or emq.dec_cmp(c, '0') < 0
        or emq.dec_cmp(c, int(MAX_EXACT_SCORE - now)) > 0 then
        return nil
    end
    return now + tonumber(c)
end

-- emq_due_after_delay: DELAY <ms>, an integer >= 0; due at now + ms, an exact score.
function emq.due_after_delay(now, s)
    local c = canonical(s)
    if c == nil or emq.dec_cmp(c, '0') < 0 then emq.refuse(E.DELAY) end
    return exact_sum(now, c) or emq.refuse(E.DELAY_TOO_LARGE)
end

-- emq_due_at: AT <unix-ms>, an integer >= 0 and at most 2^53; due then, or now when past.
function emq.due_at(now, s)
    local c = canonical(s)
    if c == nil or emq.dec_cmp(c, '0') < 0 then emq.refuse(E.AT) end
    if emq.dec_cmp(c, int(MAX_EXACT_SCORE)) > 0 or now < 0 or now > MAX_EXACT_SCORE then
        emq.refuse(E.AT_TOO_LARGE)
    end
    return math.max(tonumber(c), now)
end

-- emq_parse_block: BLOCK <ms>, an integer >= 0 with now + ms an exact time.
function emq.parse_block(now, s)
    local c = canonical(s)
    if c == nil or emq.dec_cmp(c, '0') < 0 then emq.refuse(E.BLOCK) end
    if exact_sum(now, c) == nil then emq.refuse(E.BLOCK_TOO_LARGE) end
    return tonumber(c)
end

-- emq_parse_count: an integer >= 1, or the refusal that names the argument.  The value is a
-- number; above 2^53 it is rounded, which no bound below can tell apart.
function emq.parse_count(s, refusal)
    local v = emq.parse_ll(s)
    if v == nil or v < 1 then emq.refuse(refusal) end
    return v
end

-- The server's emq.max-limit as the client gives it (<setting>, ScriptLimits.max_limit): the
-- module's default without one, and never above the module's own ceiling
-- (emq_core.h: EMQ_MAX_LIMIT_CEILING), whatever a hand-made call says.
emq.DEFAULT_MAX_LIMIT, emq.MAX_LIMIT_CEILING = 10000, 100000
function emq.max_limit(setting)
    local v = tonumber(setting)
    if v == nil or v < 1 then v = emq.DEFAULT_MAX_LIMIT end
    return math.min(math.floor(v), emq.MAX_LIMIT_CEILING)
end

-- The server's emq.max-state-bytes as the client gives it (<setting> of CHECKPOINT), within
-- the module's range (0 to EMQ_MAX_STATE_BYTES_CEILING, 16 MiB).
function emq.max_state_bytes(setting)
    local v = tonumber(setting)
    if v == nil or v < 0 then v = 65536 end
    return math.min(math.floor(v), 16777216)
end

-- emq_parse_limit: <limit> an integer >= 1, and at most the server's emq.max-limit.
function emq.parse_limit(s, max_limit)
    local limit = emq.parse_count(s, E.LIMIT)
    if limit > max_limit then emq.refuse(E.LIMIT_TOO_LARGE) end
    return limit
end

-- emq_count_fits: argc arguments hold `count` groups of `per` from index `from` on.  Lua's
-- numbers are doubles, and a count here is at most emq.max-limit: no overflow to fear.
function emq.count_fits(count, per, from, argc)
    return count >= 0 and from + per * count <= argc
end

-- A count as a LIMIT argument: more than any set can hold means "all".
function emq.limit_arg(n)
    return int(math.min(n, 2147483647))
end

-- emq_incr: the integer field `cur` (nil or false: absent, counts as 0) plus `add` (a
-- canonical string), with HINCRBY's refusals.  Returns the canonical result.
function emq.incr(cur, add, not_integer)
    local v = '0'
    if cur then
        v = canonical(cur)
        if v == nil then emq.refuse(not_integer) end
    end
    local next = emq.dec_add(v, add)
    if next == nil then emq.refuse(E.OVERFLOW) end
    return next
end

-- emq_parse_retention / emq_parse_retention_arg: -1 or 0 .. 2^53 (compared exactly: the
-- double nearest 2^53 + 1 is 2^53).
function emq.parse_retention(s, refusal)
    local c = canonical(s)
    if c == nil or emq.dec_cmp(c, '-1') < 0 or emq.dec_cmp(c, int(MAX_EXACT_SCORE)) > 0 then
        emq.refuse(refusal)
    end
    return tonumber(c)
end

-- emq_option_is: ASCII case-insensitive.
function emq.option_is(arg, name)
    return arg ~= nil and #arg == #name and arg:upper() == name
end

-- ---------------------------------------------------------------------------
-- Keys (emq_core.c: emq_key_is, emq_base_has_hash_tag, emq_job_key_matches;
-- emq_keys.c: emq_check_queue_keys, emq_check_cluster_base).
-- ---------------------------------------------------------------------------
function emq.base_has_hash_tag(base)
    local open = base:find('{', 1, true)
    if open == nil then return false end
    local close = base:find('}', open + 1, true)
    return close ~= nil and close > open + 1
end

-- Cluster mode is asked of the server only for a base without a hash tag (never for the
-- client's own keys): INFO is the one way a script can tell.
local function cluster_enabled()
    return redis.call('INFO', 'cluster'):find('cluster_enabled:1', 1, true) ~= nil
end

-- keys[i] must be base .. suffix[i] (keys are argv positions).
function emq.check_queue_keys(argv, first, suffixes, base, mismatch)
    for i, suffix in ipairs(suffixes) do
        if argv[first + i - 1] ~= base .. suffix then emq.refuse(mismatch) end
    end
end

function emq.check_cluster_base(base)
    if not emq.base_has_hash_tag(base) and cluster_enabled() then emq.refuse(E.NO_HASH_TAG) end
end

function emq.check_queue(argv, first, suffixes, base, mismatch)
    emq.check_queue_keys(argv, first, suffixes, base, mismatch)
    emq.check_cluster_base(base)
end

-- <job> is <base>job:<id> for the <base> of <active>.
function emq.job_key_matches(active, job, id)
    local suffix = 'active'
    if #active < #suffix or active:sub(-#suffix) ~= suffix then return false end
    return job == active:sub(1, #active - #suffix) .. 'job:' .. id
end

-- ---------------------------------------------------------------------------
-- Opening keys.  A declared key was checked by the server before the script ran (ACL,
-- cluster routing); its type is read with TYPE.  A key derived from <base> at run time is
-- opened with emq.open_derived, which does what emq_open_derived does in C: the caller's
-- ACL first (redis.acl_check_cmd, which asks without running anything), then the first
-- touch, a call the server refuses for a key of a slot on the move, caught with
-- redis.pcall and answered with the module's words -- before anything is read or written.
-- ---------------------------------------------------------------------------
function emq.type(key)
    return redis.call('TYPE', key).ok
end

function emq.type_ok(t, want)
    return t == 'none' or t == want
end

-- What a verb does to a derived key (emq_keys.h: EMQ_DERIVED_*), as letters: r read its fields
-- (HGET; GET for a string), w create or change it (HSET; SET), d delete it (DEL), s the key is
-- a string (a request record), z a sorted set (a lane: <base>priority, <base>delayed).
emq.READ, emq.READ_WRITE, emq.CREATE, emq.DELETE, emq.READ_DELETE = 'r', 'rw', 'w', 'd', 'rd'
emq.RECORD, emq.RECORD_CREATE, emq.LANE = 'rws', 'ws', 'rwz'

-- The error a refused touch becomes: TRYAGAIN for a key this node does not serve as it
-- stands (an absent key of a slot on the move: Redis says "non local key", Valkey
-- "undeclared keys were accessed during rehashing"), the module's NOPERM for an ACL
-- refusal (Redis and Valkey word it differently too).  Anything else is raised again.
local function refusal_of(err)
    if err:find('non local key', 1, true) or err:find('TRYAGAIN', 1, true)
        or err:find('during rehashing', 1, true) then
        return E.TRYAGAIN
    end
    if err:find('NOPERM', 1, true) or err:find("can't access", 1, true)
        or err:find('ACL failure', 1, true) or err:find('No permissions', 1, true) then
        return E.NOPERM_DERIVED
    end
    error({ err = err }, 0)
end

-- May the caller do `access` to the key?  Asked as the module asks it (emq_acl_may): could the
-- caller run the core commands that do the same -- HGET, HSET, DEL (GET and SET for a string)
-- -- checked by the server selector by selector (one selector must allow both the command and
-- the key), before the key is touched at all.  A script's every call is checked by the server
-- too, so a write is asked as each command a verb may apply to such a key (HSET, HINCRBY,
-- HDEL, PEXPIREAT, PERSIST, DEL; SET, PEXPIREAT for a string): a call refused after the first
-- write would leave the verb half applied.  (The module, whose writes the server does not
-- check, asks HSET, SET, DEL alone: docs/reference/acl.md.)
local function has(access, letter)
    return access:find(letter, 1, true) ~= nil
end

local HASH_WRITES = {
    { 'HSET', 'f', 'v' }, { 'HINCRBY', 'f', '1' }, { 'HDEL', 'f' }, { 'PEXPIREAT', '0' }, { 'PERSIST' }, { 'DEL' },
}
local STRING_WRITES = { { 'SET', 'v' }, { 'PEXPIREAT', '0' } }
local STRING_READS = { { 'GET' }, { 'STRLEN' }, { 'GETRANGE', '0', '0' } } -- a claim's record, read a window at a time
local HASH_READS = { { 'HGET', 'f' } }
local ZSET_READS = { { 'ZSCORE', 'm' }, { 'ZRANGE', '0', '0' }, { 'ZCARD' } }
local ZSET_WRITES = { { 'ZADD', '0', 'm' }, { 'ZREM', 'm' } }

local function may_all(name, commands)
    for _, c in ipairs(commands) do
        if not redis.acl_check_cmd(c[1], name, unpack(c, 2)) then return false end
    end
    return true
end

local function may(name, access)
    local reads, writes = HASH_READS, HASH_WRITES
    if has(access, 's') then
        reads, writes = STRING_READS, STRING_WRITES
    elseif has(access, 'z') then
        reads, writes = ZSET_READS, ZSET_WRITES
    end
    if has(access, 'r') and not may_all(name, reads) then return false end
    if has(access, 'w') and not may_all(name, writes) then return false end
    if has(access, 'd') and not redis.acl_check_cmd('DEL', name) then return false end
    return true
end
emq.may = may

-- Touch a derived key for `access` (emq.READ, emq.READ_WRITE or emq.CREATE) without raising:
-- its type, or nil and the module's refusal.
function emq.touch(name, access)
    if not may(name, access) then return nil, E.NOPERM_DERIVED end
    local t = redis.pcall('TYPE', name)
    if t.err then return nil, refusal_of(t.err) end
    -- An absent key may be absent only from this node: its slot may be on the move, and on
    -- the importing node (a call redirected there with ASKING) a single-key call is served
    -- whether or not the key already arrived.  A call naming it beside another key of the
    -- slot is refused (TRYAGAIN) while any of them is missing there, as the module answers.
    -- Asked only for an absent key, so the common path costs nothing (emq_absent_key_is_final).
    if t.ok == 'none' and KEYS[1] and KEYS[1] ~= name then
        local e = redis.pcall('EXISTS', KEYS[1], name)
        if type(e) == 'table' and e.err then return nil, refusal_of(e.err) end
    end
    return t.ok, nil
end

-- Open a derived key: its type, after the checks (emq_open_derived).  A key given in KEYS
-- (`declared`, made by emq.run) was checked by the server before the Lua ran, for reading
-- and writing (EVAL's and FCALL's keys are read-write), and routed the call.
function emq.open_derived(name, access)
    if declared[name] then return emq.type(name) end
    local t, refused = emq.touch(name, access)
    if refused then emq.refuse(refused) end
    return t
end

-- A field of a hash key, or nil when the key is not a hash or has no such field (emq_hget).
function emq.hget(key, ktype, field)
    if ktype ~= 'hash' then return nil end
    local v = redis.call('HGET', key, field)
    return v or nil
end

function emq.hexists(key, ktype, field)
    return ktype == 'hash' and redis.call('HEXISTS', key, field) == 1
end

-- ---------------------------------------------------------------------------
-- The queue's settings (emq_keys.c: emq_read_meta).
-- ---------------------------------------------------------------------------
emq.DEFAULT_DONE_TTL_MS = 3600000
emq.DEFAULT_CANCELLED_TTL_MS = 86400000
emq.DEFAULT_DEAD_TTL_MS = -1

function emq.read_meta(base)
    local meta = {
        paused = false,
        done_ttl = emq.DEFAULT_DONE_TTL_MS,
        cancelled_ttl = emq.DEFAULT_CANCELLED_TTL_MS,
        dead_ttl = emq.DEFAULT_DEAD_TTL_MS,
    }
    local name = base .. 'meta'
    local t = emq.open_derived(name, emq.READ)
    if not emq.type_ok(t, 'hash') then emq.refuse(E.WRONGTYPE) end
    if t == 'hash' then
        local v = redis.call('HMGET', name, 'paused', 'done_ttl_ms', 'cancelled_ttl_ms', 'dead_ttl_ms')
        meta.paused = v[1] ~= false
        if v[2] then meta.done_ttl = emq.parse_retention(v[2], E.META_NOT_INTEGER) end
        if v[3] then meta.cancelled_ttl = emq.parse_retention(v[3], E.META_NOT_INTEGER) end
        if v[4] then meta.dead_ttl = emq.parse_retention(v[4], E.META_NOT_INTEGER) end
    end
    return meta
end

-- A finished row's retention (emq_effects.c: emq_fx_retain): kept (-1), deleted at once
-- (0), or expiring at now + ttl, absolute (PEXPIREAT), so a replica and the AOF expire it
-- when the master does.  now + ttl may pass 2^53: added exactly.
function emq.retain(row, now, ttl)
    if ttl < 0 then return end
    if ttl == 0 then
        redis.call('DEL', row)
        return
    end
    redis.call('PEXPIREAT', row, emq.dec_add(int(now), int(ttl)))
end

-- ---------------------------------------------------------------------------
-- The fence (emq_core.c: emq_holder, emq_holder_error, emq_is_retry_of,
-- emq_closed_route; emq_keys.c: emq_check_holder_or_retry).
-- ---------------------------------------------------------------------------
emq.HOLDER_OK, emq.HOLDER_GONE, emq.HOLDER_STALE_TOKEN, emq.HOLDER_NOT_ACTIVE = 'ok', 'gone', 'stale', 'inactive'
emq.TO_PENDING, emq.TO_DEAD, emq.TO_CANCELLED = 'pending', 'dead', 'cancelled'

local STALE = { extend = E.STALE_EXTEND, complete = E.STALE_COMPLETE, fail = E.STALE_FAIL, release = E.STALE_RELEASE }

-- The error for a holder verdict that is neither OK nor GONE; nil for those two.
function emq.holder_error(verb, holder)
    if holder == emq.HOLDER_STALE_TOKEN then return STALE[verb] end
    if holder == emq.HOLDER_NOT_ACTIVE then return E.NOT_ACTIVE end
    return nil
end

-- The holder verdict for <id> and <token> (the row's token byte for byte, and membership of
-- <active>), and for NOT_ACTIVE whether this is the retry of `verb` whose reply was lost:
-- returns holder, retry, route (where the first call sent the job).
function emq.check_holder_or_retry(active, row, rtype, id, token, verb)
    local current = emq.hget(row, rtype, 'token')
    local holder
    if current == nil then
        holder = emq.HOLDER_GONE
    elseif current ~= token then
        holder = emq.HOLDER_STALE_TOKEN
    elseif redis.call('ZSCORE', active, id) then
        holder = emq.HOLDER_OK
    else
        holder = emq.HOLDER_NOT_ACTIVE
    end
    local retry, route = false, emq.TO_PENDING
    if holder == emq.HOLDER_NOT_ACTIVE then
        local closed_by = emq.hget(row, rtype, 'closed_by')
        if closed_by and (closed_by == verb or closed_by:sub(1, #verb + 1) == verb .. ':') then
            retry = true
            local where = closed_by:match('^[^:]*:(.*)$')
            if where == 'dead' then
                route = emq.TO_DEAD
            elseif where == 'cancelled' then
                route = emq.TO_CANCELLED
            end
        end
    end
    return holder, retry, route
end

-- 1 when a row's state says the job is over (emq_state_is_finished).
function emq.state_is_finished(state)
    return state == 'done' or state == 'dead' or state == 'cancelled'
end

-- May RETRY move a row in this state back to pending?  nil, or the EMQSTATE refusal.
function emq.retry_check(state)
    if state == nil then return E.STATE_UNKNOWN end
    if state == 'dead' or state == 'cancelled' then return nil end
    if state == 'pending' then return E.STATE_PENDING end
    if state == 'active' then return E.STATE_ACTIVE end
    if state == 'done' then return E.STATE_DONE end
    return E.STATE_UNKNOWN
end

-- ---------------------------------------------------------------------------
-- Sorted sets.
-- ---------------------------------------------------------------------------

-- Up to `limit` members scored at or below `max` (a score argument: a number's decimal or
-- '+inf'), lowest first (emq_zset_head).
function emq.zset_head(set, max, limit)
    if limit < 1 then return {} end
    return redis.call('ZRANGE', set, '-inf', max, 'BYSCORE', 'LIMIT', 0, emq.limit_arg(limit))
end

-- ---------------------------------------------------------------------------
-- Past maxmemory?  The module asks its context (REDISMODULE_CTX_FLAGS_OOM); a script reads
-- what that flag is made of: the memory in use, less what eviction does not count, above
-- maxmemory.  Asked only where a verb that is not deny-oom grows memory (a checkpoint's state
-- or progress, a COMPLETE's result).
-- ---------------------------------------------------------------------------
function emq.past_maxmemory()
    local info = redis.call('INFO', 'memory')
    local function field(name)
        return tonumber(info:match('\n' .. name .. ':(%d+)') or '0')
    end
    local max = field('maxmemory')
    if max == 0 then return false end
    return field('used_memory') - field('mem_not_counted_for_evict') > max
end

-- The server's settings a script cannot read, as the client gives them: emq.max-payload-bytes and
-- emq.max-result-bytes (module default 1 MiB), within the module's range (0 to 16 MiB).
function emq.max_bytes(setting)
    local v = tonumber(setting)
    if v == nil or v < 0 then v = 1048576 end
    return math.min(math.floor(v), 16777216)
end

-- ---------------------------------------------------------------------------
-- The v3 keyspace (emq_core.c: priorities, counters, pieces; emq_row.c; emq_lanes.c).
-- ---------------------------------------------------------------------------
local SEQ_LIMIT = 4398046511104 -- 2^42
local SEQ_TAIL_FIRST = 4294967296 -- 2^32: tails from here up, heads below
emq.PROMOTE_MAX, emq.DROP_MAX, emq.PIECE_BYTES, emq.MAX_PIECES = 1000, 1000, 64, 16

-- emq_parse_priority: an integer from -1000 to 1000.
function emq.parse_priority(s)
    local v = emq.parse_ll(s)
    if v == nil or v < -1000 or v > 1000 then emq.refuse(E.PRIORITY) end
    return v
end

-- emq_row_priority / emq_row_level: the row's `priority` (absent: 0).
function emq.row_level(row, rtype)
    local v = emq.hget(row, rtype, 'priority')
    if v == nil then return 0 end
    local level = emq.parse_ll(v)
    if level == nil or level < -1000 or level > 1000 then emq.refuse(E.PRIORITY_FIELD) end
    return level
end

-- emq_priority_score / emq_priority_level: exact doubles (below 2^53).
function emq.priority_score(level, seq)
    return (level + 1024) * SEQ_LIMIT + seq
end

function emq.priority_level(score)
    return math.floor(score / SEQ_LIMIT) - 1024
end

-- emq_parse_meta_counter: `stale` and `seq` of <base>meta, canonical integers >= 0 (absent: '0'),
-- kept as decimal strings (exact whatever their size).
local function meta_counter(v)
    if not v then return '0' end
    local c = canonical(v)
    if c == nil or emq.dec_cmp(c, '0') < 0 then emq.refuse(E.META_NOT_INTEGER) end
    return c
end

-- emq_next_seq: seq + 1; 2^32 when the lane is empty, the counter is below 2^32 or past 2^42 - 1.
local function next_seq(seq, lane_empty)
    if lane_empty or emq.dec_cmp(seq, int(SEQ_TAIL_FIRST)) < 0 or emq.dec_cmp(seq, int(SEQ_LIMIT - 1)) >= 0 then
        return int(SEQ_TAIL_FIRST)
    end
    return emq.dec_add(seq, '1')
end

-- emq_head_seq: the i-th (from 0) of the n jobs one call puts back at a level's head, below the
-- level's first job (seq `first`, nil: none) and below 2^32, in the call's order; never below 0.
local function head_seq(first, n, i)
    local top = SEQ_TAIL_FIRST - 1
    if first ~= nil and first - 1 < top then top = first - 1 end
    local seq = top - (n - 1 - i)
    return seq < 0 and 0 or seq
end

-- emq_pieces / emq_row_pieces: the fields that store `value` as `field` (appended to `out` as
-- field, value, ...): whole up to 64 bytes and above 1024, else in pieces of 64.
function emq.pieces(out, field, value)
    local n = #value
    if n <= 64 or n > 1024 then
        out[#out + 1] = field
        out[#out + 1] = value
        return 1
    end
    local count = 0
    for at = 1, n, 64 do
        out[#out + 1] = count == 0 and field or field .. ':' .. count
        out[#out + 1] = value:sub(at, at + 63)
        count = count + 1
    end
    return count
end

local function piece_fields(field)
    local names = {}
    for i = 1, 15 do names[i] = field .. ':' .. i end
    return names
end
local PIECES = { payload = piece_fields('payload'), result = piece_fields('result') }

-- emq_row_value: the value with its pieces joined (nil: no such field).  Only a head of exactly 64
-- bytes has pieces; a piece longer than 64 bytes is not one of ours, and ends the value.
function emq.row_value(row, rtype, field)
    if rtype ~= 'hash' then return nil end
    local head = redis.call('HGET', row, field)
    if not head then return nil end
    if #head ~= 64 then return head end
    local pieces = redis.call('HMGET', row, unpack(PIECES[field]))
    local parts = { head }
    for i = 1, 15 do
        local piece = pieces[i]
        if not piece or #piece > 64 then break end
        parts[#parts + 1] = piece
    end
    return table.concat(parts)
end

-- emq_row_drop_pieces: HDEL the pieces of `field` from `keep` on, when the stored head may have any.
function emq.drop_pieces(row, rtype, field, keep)
    if rtype ~= 'hash' then return end
    local head = redis.call('HGET', row, field)
    if not head or #head ~= 64 then return end
    for i = math.max(keep, 1), 15 do
        if redis.call('HDEL', row, field .. ':' .. i) == 0 then break end
    end
end

-- ---------------------------------------------------------------------------
-- The lanes (emq_lanes.c): where a job waits, decided first, written last in one order.
-- ---------------------------------------------------------------------------
local Lanes = {}
Lanes.__index = Lanes

function emq.lanes(base, pending)
    return setmetatable({
        base = base, pending = pending,
        priority = base .. 'priority', delayed = base .. 'delayed', meta = base .. 'meta',
        opened = {}, types = {}, priority_card = 0,
        seq = '0', stale = '0', seq_changed = false, stale_changed = false,
        leave_delayed = {}, tails = {}, heads = {}, priority_add = {}, delayed_add = {}, leave_priority = {},
        priority_heads = {},
        pops = 0, promoted_tails = {}, promoted_priority = {}, promoted = 0, dropped = 0,
    }, Lanes)
end

-- emq_lanes_open: which = { priority = true, delayed = true, meta = true }, in that order.
function Lanes:open(priority, delayed, meta)
    if priority and not self.opened.priority then
        self.opened.priority = true
        local t = emq.open_derived(self.priority, emq.LANE)
        if not emq.type_ok(t, 'zset') then emq.refuse(E.WRONGTYPE) end
        self.types.priority = t
        if t == 'zset' then self.priority_card = redis.call('ZCARD', self.priority) end
    end
    if delayed and not self.opened.delayed then
        self.opened.delayed = true
        local t = emq.open_derived(self.delayed, emq.LANE)
        if not emq.type_ok(t, 'zset') then emq.refuse(E.WRONGTYPE) end
        self.types.delayed = t
    end
    if meta and not self.opened.meta then
        self.opened.meta = true
        local t = emq.open_derived(self.meta, emq.READ_WRITE)
        if not emq.type_ok(t, 'hash') then emq.refuse(E.WRONGTYPE) end
        self.types.meta = t
        self.stale = meta_counter(emq.hget(self.meta, t, 'stale'))
        self.seq = meta_counter(emq.hget(self.meta, t, 'seq'))
    end
end

local function push(list, id, score)
    list[#list + 1] = { id = id, score = score }
end

-- emq_lanes_place: the tail (a new turn, the next seq) or the head (given back: below the level's
-- first job, settled at apply) of a lane.
function Lanes:place(id, level, head)
    if level == 0 then
        push(head and self.heads or self.tails, id)
        return
    end
    self:open(true, false, not head)
    if head then
        push(self.priority_heads, id, level)
        return
    end
    self.seq = next_seq(self.seq, self.priority_card == 0 and #self.priority_add == 0 and #self.priority_heads == 0)
    self.seq_changed = true
    push(self.priority_add, id, emq.priority_score(level, tonumber(self.seq)))
end

function Lanes:delay(id, due)
    self:open(false, true, false)
    push(self.delayed_add, id, due)
end

-- emq_lanes_enter: delayed until `due`, or at its lane's tail now.
function Lanes:enter(id, level, due, now)
    if due > now then self:delay(id, due) else self:place(id, level, false) end
end

function Lanes:is_delayed(id)
    return self.types.delayed == 'zset' and redis.call('ZSCORE', self.delayed, id) ~= false
end

-- emq_lanes_remove: out of <base>delayed, else <base>priority, else a tombstone in <pending>.
function Lanes:remove(id, level)
    self:open(false, true, false)
    if self:is_delayed(id) then
        push(self.leave_delayed, id)
        return
    end
    if level ~= 0 then
        self:open(true, false, false)
        if self.types.priority == 'zset' and redis.call('ZSCORE', self.priority, id) then
            push(self.leave_priority, id)
        end
        return
    end
    self:open(false, false, true)
    self.stale = emq.incr(self.stale, '1', E.META_NOT_INTEGER)
    self.stale_changed = true
end

-- emq_lanes_promote: the due members of <base>delayed (at most PROMOTE_MAX, in due order) to their
-- lanes' tails; a member whose row is gone or not pending only leaves <base>delayed.
function Lanes:promote(now)
    self:open(false, true, false)
    if self.types.delayed ~= 'zset' then return end
    local ids = redis.call('ZRANGE', self.delayed, '-inf', int(now), 'BYSCORE', 'LIMIT', 0, emq.PROMOTE_MAX)
    for _, id in ipairs(ids) do
        local row = self.base .. 'job:' .. id
        local rtype = emq.open_derived(row, emq.READ)
        if not emq.type_ok(rtype, 'hash') then emq.refuse(E.WRONGTYPE) end
        push(self.leave_delayed, id)
        if emq.hget(row, rtype, 'state') == 'pending' then
            local level = emq.row_level(row, rtype)
            self.promoted = self.promoted + 1
            self:place(id, level, false)
            if level == 0 then
                push(self.promoted_tails, id)
            else
                push(self.promoted_priority, id, self.priority_add[#self.priority_add].score)
            end
        else
            self.dropped = self.dropped + 1
        end
    end
end

-- emq_lanes_due_left: a member still due after this call's moves (1), else the next due time.
function Lanes:due_left(now)
    if self.types.delayed ~= 'zset' then return false, -1 end
    local skip = self.promoted + self.dropped
    local got = redis.call('ZRANGE', self.delayed, skip, skip, 'WITHSCORES')
    if #got == 0 then return false, -1 end
    local at = tonumber(got[2])
    if at ~= math.floor(at) then at = math.floor(at) + 1 end
    if at <= now then return true, -1 end
    return false, at
end

-- The entries of <pending> from 0-based index `from`, read a window at a time (nothing written).
function Lanes:entries()
    local window, first, size = {}, 0, 0
    local t = emq.type(self.pending)
    if t == 'list' then size = redis.call('LLEN', self.pending) end
    return function(index)
        if index >= size then return nil end
        if index < first or index >= first + #window then
            first = index
            window = redis.call('LRANGE', self.pending, index, index + 63)
        end
        return window[index - first + 1]
    end
end

-- A script passes a call's arguments through Lua's stack, at most 8000 of them: one command per
-- 3,999 ids (the module sends one for all; the only difference, in the number of events).
local CHUNK = 3999
local function chunked(command, key, items, scored)
    local args = {}
    for i, item in ipairs(items) do
        if scored then args[#args + 1] = int(item.score) end
        args[#args + 1] = item.id
        if i % CHUNK == 0 or i == #items then
            redis.call(command, key, unpack(args))
            args = {}
        end
    end
end

-- settle_heads (emq_lanes.c): the jobs put back at levels other than 0 take their seqs, per level
-- from how many this call puts back and the level's first job (ZRANGE BYSCORE LIMIT 0 1).
function Lanes:settle_heads()
    if #self.priority_heads == 0 then return end
    local levels = {}
    for _, h in ipairs(self.priority_heads) do
        local v = levels[h.score]
        if v == nil then
            v = { count = 0, seen = 0 }
            levels[h.score] = v
            if self.types.priority == 'zset' then
                local from = emq.priority_score(h.score, 0)
                local got = redis.call('ZRANGE', self.priority, int(from), '(' .. int(from + SEQ_LIMIT), 'BYSCORE',
                    'LIMIT', 0, 1, 'WITHSCORES')
                if #got > 0 then v.first = math.floor(tonumber(got[2])) - from end
            end
        end
        v.count = v.count + 1
    end
    for _, h in ipairs(self.priority_heads) do
        local v = levels[h.score]
        push(self.priority_add, h.id, emq.priority_score(h.score, head_seq(v.first, v.count, v.seen)))
        v.seen = v.seen + 1
    end
    self.priority_heads = {}
end

-- emq_lanes_apply: the one order of every verb's lane writes.
function Lanes:apply()
    self:settle_heads() -- reads <base>priority: before the first write
    if #self.leave_delayed > 0 then chunked('ZREM', self.delayed, self.leave_delayed) end
    if #self.tails > 0 then chunked('RPUSH', self.pending, self.tails) end
    if #self.heads > 0 then
        local rev = {}
        for i = #self.heads, 1, -1 do rev[#rev + 1] = self.heads[i] end
        chunked('LPUSH', self.pending, rev)
    end
    if #self.priority_add > 0 then chunked('ZADD', self.priority, self.priority_add, true) end
    if #self.delayed_add > 0 then chunked('ZADD', self.delayed, self.delayed_add, true) end
    if self.pops > 0 then redis.call('LPOP', self.pending, self.pops) end
    if #self.leave_priority > 0 then chunked('ZREM', self.priority, self.leave_priority) end
    if self.seq_changed and self.stale_changed then
        redis.call('HSET', self.meta, 'seq', self.seq, 'stale', self.stale)
    elseif self.seq_changed then
        redis.call('HSET', self.meta, 'seq', self.seq)
    elseif self.stale_changed then
        redis.call('HSET', self.meta, 'stale', self.stale)
    end
end

-- ---------------------------------------------------------------------------
-- The two hooks (emq_end.c): a job leaves <active>; a job ends.  Each a prepare (reads and
-- checks: may refuse) and an apply (writes).  Adding a step: beside the ones below.
-- ---------------------------------------------------------------------------
function emq.left_active_prepare(base, id) end

function emq.left_active_apply(base, id) end

-- Step (emq_unique.c: emq_unique_end_prepare): a unique key the job holds is released -- an UNTIL
-- key at any end, a FOR window only when the row goes.  The row is the caller's, checked by it.
function emq.ended_prepare(base, id, how, already)
    local row = base .. 'job:' .. id
    local key = emq.hget(row, emq.type(row), 'unique')
    if key == nil then return end
    local name = base .. 'unique:' .. key
    if emq.open_derived(name, 'rds') ~= 'string' or redis.call('GET', name) ~= id then return end
    if how ~= 'deleted' and redis.call('PTTL', name) >= 0 then return end
    unique_release[id] = name
end

-- Step: the announcement on <base>done:<id> (SPUBLISH: the scripts need Redis 7.0, which has it).
-- The module publishes whatever the caller's channel permissions; a script publishes as the
-- caller, so a caller who may not publish there ends the job unannounced.
function emq.ended_apply(base, id, how, already)
    local name = unique_release[id]
    if name then
        unique_release[id] = nil
        if redis.call('EXISTS', name) == 1 then redis.call('DEL', name) end
    end
    if already then return end
    local channel = base .. 'done:' .. id
    if redis.acl_check_cmd('SPUBLISH', channel, id) then redis.call('SPUBLISH', channel, id) end
end

-- ---------------------------------------------------------------------------
-- Unique jobs (emq_unique.c): ENQUEUE ... UNIQUE <key> [FOR <ms> | UNTIL done] [REPLACE].
-- ---------------------------------------------------------------------------
emq.UNIQUE_TAKE, emq.UNIQUE_HELD, emq.UNIQUE_REPLACE = 0, 1, 2
local UNIQUE_KEY_MAX, UNIQUE_FOR_MAX = 512, 2592000000

-- emq_unique_option: the option at argv[i] if it is UNIQUE, FOR, UNTIL or REPLACE, into `u`: how
-- many arguments it takes (2, or 1 for REPLACE); 0 when it is none of them.  `u` nil
-- (ENQUEUEMANY): UNIQUE is refused, the others are not its options.
function emq.unique_option(u, argv, i, argc)
    local opt = argv[i]
    local unique, replace = emq.option_is(opt, 'UNIQUE'), emq.option_is(opt, 'REPLACE')
    local for_, until_ = emq.option_is(opt, 'FOR'), emq.option_is(opt, 'UNTIL')
    if u == nil then
        if unique then emq.refuse(E.UNIQUE_MANY) end
        return 0
    end
    if replace then
        if u.replace then emq.refuse(E.SYNTAX) end
        u.replace = true
        return 1
    end
    if not unique and not for_ and not until_ then return 0 end
    if i + 1 >= argc then emq.refuse(E.SYNTAX) end
    local val = argv[i + 1]
    if unique then
        if u.key then emq.refuse(E.SYNTAX) end
        if #val == 0 or #val > UNIQUE_KEY_MAX then emq.refuse(E.UNIQUE_KEY) end
        u.key = val
    else
        local again, other
        if for_ then again, other = u.for_ms ~= nil, u.until_done else again, other = u.until_done, u.for_ms ~= nil end
        if again then emq.refuse(E.SYNTAX) end
        if other then emq.refuse(E.UNIQUE_FOR_AND_UNTIL) end
        if for_ then
            local ms = emq.parse_ll(val)
            if ms == nil or ms < 1 or ms > UNIQUE_FOR_MAX then emq.refuse(E.UNIQUE_FOR) end
            u.for_ms = ms
        else
            if not emq.option_is(val, 'DONE') then emq.refuse(E.UNIQUE_UNTIL) end
            u.until_done = true
        end
    end
    return 2
end

-- emq_unique_options_check: FOR, UNTIL and REPLACE need UNIQUE.
function emq.unique_options_check(u)
    if u.key == nil and (u.replace or u.for_ms or u.until_done) then emq.refuse(E.UNIQUE_NEEDED) end
end

-- emq_unique_decide: free or an orphan's (TAKE), held (HELD), or held by a pending job with
-- REPLACE given (REPLACE); and the holder.  Without UNIQUE: TAKE.
function emq.unique_decide(base, u)
    if u.key == nil then return emq.UNIQUE_TAKE end
    local name = base .. 'unique:' .. u.key
    local t = emq.open_derived(name, emq.RECORD)
    if not emq.type_ok(t, 'string') then emq.refuse(E.WRONGTYPE) end
    if t == 'none' then return emq.UNIQUE_TAKE end
    local holder = redis.call('GET', name)
    local window = redis.call('PTTL', name) >= 0
    local row = base .. 'job:' .. holder
    local rtype = emq.open_derived(row, u.replace and emq.READ_WRITE or emq.READ)
    local state = emq.hget(row, rtype, 'state')
    if not window and state ~= 'pending' and state ~= 'active' then return emq.UNIQUE_TAKE end -- an orphan
    if u.replace and state == 'pending' then return emq.UNIQUE_REPLACE, holder end
    return emq.UNIQUE_HELD, holder
end

-- emq_unique_take: the key names `id` (SET, and PEXPIREAT now + FOR).
function emq.unique_take(base, u, id, now)
    if u.key == nil then return end
    local name = base .. 'unique:' .. u.key
    redis.call('SET', name, id)
    if u.for_ms then redis.call('PEXPIREAT', name, int(now + u.for_ms)) end
end

-- emq_unique_replace: the pending holder's payload becomes `payload` (its old pieces dropped).
function emq.unique_replace(base, holder, payload)
    local row = base .. 'job:' .. holder
    local fields = {}
    local n = emq.pieces(fields, 'payload', payload)
    emq.drop_pieces(row, 'hash', 'payload', n)
    redis.call('HSET', row, unpack(fields))
end

return emq
