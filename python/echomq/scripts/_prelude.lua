-- _prelude.lua -- what every verb script shares, the first of four files read as one text
-- (python/echomq/_scripts.py: PRELUDE), split by concept as the C files are: this one the Lua
-- twin of module/emq_core.c (the error texts, parsing, counters, limits); _keys.lua of
-- module/emq_keys.c (key checks, derived keys, the queue's settings, the fence) and the parts
-- of module/emq_effects.c a script needs (a finished row's retention); _lanes.lua of the v3
-- keyspace (emq_row.c, emq_lanes.c); _end.lua of the end hooks and unique keys (emq_end.c,
-- emq_unique.c), and it returns the table.
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
    GROUP = 'ERR GROUP must be 1 to 128 bytes of letters, digits and -_.:@',
    GROUP_FIELD = "ERR the group hash's 'active' field is not an integer from 0 to 2^53",
    AFTER_TOO_MANY = 'ERR AFTER takes at most 1000 dependencies',
    AFTER_EMPTY_ID = 'ERR a dependency id must not be empty',
    AFTER_SELF = 'ERR a job cannot depend on itself',
    AFTER_POLICY = 'ERR ON_PARENT_FAILURE must be fail, ignore or continue',
    AFTER_MISSING = "ERR MISSING takes only 'done' (without it a missing dependency is refused)",
    AFTER_NEEDED = 'ERR ON_PARENT_FAILURE and MISSING need AFTER <id> ...',
    AFTER_MANY = 'ERR AFTER is for one job: EMQ.ENQUEUEMANY does not take it',
    AFTER_FIELD = "ERR the job's 'waits' field is not an integer from 1 to 1000",
    GROUP_MAX = 'ERR MAX must be an integer from 1 to 1000000000',
    GROUP_MAX_FIELD = "ERR the group hash's 'max' field is not an integer from 1 to 1000000000",
    GROUP_WALK = "ERR the queue has more than 10000 groups: set MAX on each group, not *",
    GROUP_DEFAULT_FIELD = "ERR the queue's meta hash's 'group_max' field is not an integer from 1 to 1000000000",
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
local group_left = {} -- the jobs leaving <active> whose group counts one less (emq.left_active_prepare)
local group_next = 1 -- where emq.left_active_apply looks first: the verbs apply in prepare order
local group_defer = false -- emq.left_active_apply leaves the ring's settle to emq.settle_deferred

function emq.run(commands, body)
    declared, unique_release, group_left, group_next, group_defer = {}, {}, {}, 1, false
    emq.deps_reset()
    for _, key in ipairs(KEYS) do declared[key] = true end
    for _, command in ipairs(commands) do
        if KEYS[1] and not redis.acl_check_cmd(command, KEYS[1], unpack(CHECK_ARGS[command])) then
            return redis.error_reply('NOPERM this user has no permissions to run the \'' .. command:lower()
                .. "' command, which the scripts backend calls")
        end
    end
    local ok, reply = pcall(body)
    if ok then
        emq.deps_after()
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

-- emq_due_at: AT <unix-ms>, an integer >= 0 and at most 2^53; due then (a time past is kept).
function emq.due_at(now, s)
    local c = canonical(s)
    if c == nil or emq.dec_cmp(c, '0') < 0 then emq.refuse(E.AT) end
    if emq.dec_cmp(c, int(MAX_EXACT_SCORE)) > 0 or now < 0 or now > MAX_EXACT_SCORE then
        emq.refuse(E.AT_TOO_LARGE)
    end
    return tonumber(c)
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

