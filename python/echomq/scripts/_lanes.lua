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
        gl = {}, gl_index = {}, ring = base .. 'groups', ring_len = 0, ring_pops = 0, ring_popped_empty = false,
        ring_push = {}, ring_push_from = 0,
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
        self.meta_ring = emq.hexists(self.meta, t, 'ring')
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

-- emq_lanes_open_ring: <base>groups, the ring of the groups a claim rotates through (a list).
function Lanes:open_ring()
    if self.ring_opened then return end
    self.ring_opened = true
    local t = emq.open_derived(self.ring, emq.READ_WRITE)
    if not emq.type_ok(t, 'list') then emq.refuse(E.WRONGTYPE) end
    self.types.ring = t
    if t == 'list' then self.ring_len = redis.call('LLEN', self.ring) end
end

-- emq_lanes_ring_at: the ring's member at 0-based `index` as stored, or nil.
function Lanes:ring_at(index)
    if not self.ring_opened or index >= self.ring_len then return nil end
    return redis.call('LINDEX', self.ring, index) or nil
end

-- emq_lanes_group: a group's lane <base>g:<g> (and the ring), opened once per call.
function Lanes:group(name)
    local g = self.gl_index[name]
    if g then return g end
    self:open_ring()
    g = { group = name, lane = self.base .. 'g:' .. name, hash = self.base .. 'group:' .. name, card = 0,
        in_ring = false, enters = false, leaves = false, add = {}, leave = {}, heads = {}, promoted = {},
        taken = 0, promoted_next = 1, held = false, took = 0 }
    self.gl[#self.gl + 1] = g
    self.gl_index[name] = g
    local t = emq.open_derived(g.lane, emq.LANE)
    if not emq.type_ok(t, 'zset') then emq.refuse(E.WRONGTYPE) end
    g.ltype = t
    if t == 'zset' then g.card = redis.call('ZCARD', g.lane) end
    local h = emq.open_derived(g.hash, emq.READ_WRITE)
    if not emq.type_ok(h, 'hash') then emq.refuse(E.WRONGTYPE) end
    g.in_ring = emq.hexists(g.hash, h, 'ring')
    g.paused = emq.hexists(g.hash, h, 'paused')
    g.active, g.cap = emq.group_caps_read(g.hash, h, self.base)
    emq.group_index_check(self.base)
    return g
end

-- ring_enter (emq_lanes.c): the group enters the ring's tail (a new ring starts with the empty name).
local function ring_enter(self, g)
    if g.in_ring or g.enters then return end
    if not emq.group_claimable(true, g.paused, g.active, g.cap) then -- settled at apply
        g.held = true
        return
    end
    g.enters = true
    if self.ring_len == 0 and #self.ring_push == 0 then push(self.ring_push, '') end
    push(self.ring_push, g.group)
end

Lanes.ring_enter = ring_enter

-- edge_seq (emq_lanes.c): the seq of the level's first (last) member of a sorted set, or nil.
local function edge_seq(key, ktype, level, last)
    if ktype ~= 'zset' then return nil end
    local from = emq.priority_score(level, 0)
    local got
    if last then
        got = redis.call('ZRANGE', key, '(' .. int(from + SEQ_LIMIT), int(from), 'BYSCORE', 'REV', 'LIMIT', 0, 1,
            'WITHSCORES')
    else
        got = redis.call('ZRANGE', key, int(from), '(' .. int(from + SEQ_LIMIT), 'BYSCORE', 'LIMIT', 0, 1,
            'WITHSCORES')
    end
    if #got == 0 then return nil end
    return math.floor(tonumber(got[2])) - from
end

-- emq_lanes_place_in: a job of `group` (nil: Lanes:place) at its group lane's tail (<base>meta's
-- seq, above the lane's own last seq at the level) or head.
function Lanes:place_in(id, group, level, head)
    if group == nil then return self:place(id, level, head) end
    local g = self:group(group)
    self:open(false, false, true)
    if head then
        push(g.heads, id, level)
    else
        local last = edge_seq(g.lane, g.ltype, level, true)
        local seq = next_seq(self.seq, false)
        if last ~= nil and tonumber(seq) <= last then seq = int(last + 1) end
        self.seq = seq
        self.seq_changed = true
        push(g.add, id, emq.priority_score(level, tonumber(seq)))
    end
    if not g.in_ring then ring_enter(self, g) end
end

function Lanes:enter_in(id, group, level, due, now)
    if due ~= now then self:delay(id, due) else self:place_in(id, group, level, false) end
end

-- emq_lanes_remove_in: out of <base>delayed, else out of its group's lane.
function Lanes:remove_in(id, group, level)
    if group == nil then return self:remove(id, level) end
    self:open(false, true, false)
    if self:is_delayed(id) then
        push(self.leave_delayed, id)
        return
    end
    local g = self:group(group)
    if g.ltype == 'zset' and redis.call('ZSCORE', g.lane, id) then push(g.leave, id) end
end

-- emq_lanes_place_row / enter_row / remove_row: with the level and the group the row names.
function Lanes:place_row(id, row, rtype, head)
    local level = emq.row_level(row, rtype)
    self:place_in(id, emq.hget(row, rtype, 'group'), level, head)
end

function Lanes:enter_row(id, row, rtype, due, now)
    local level = emq.row_level(row, rtype)
    self:enter_in(id, emq.hget(row, rtype, 'group'), level, due, now)
end

function Lanes:remove_row(id, row, rtype)
    local level = emq.row_level(row, rtype)
    self:remove_in(id, emq.hget(row, rtype, 'group'), level)
end

function Lanes:delay(id, due)
    self:open(false, true, false)
    push(self.delayed_add, id, due)
end

-- emq_lanes_enter: at its lane's tail when due now; else (later, or already past) delayed, scored `due`.
function Lanes:enter(id, level, due, now)
    if due ~= now then self:delay(id, due) else self:place(id, level, false) end
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
            local group = emq.hget(row, rtype, 'group')
            self.promoted = self.promoted + 1
            if group ~= nil then
                self:place_in(id, group, level, false)
                local g = self:group(group)
                push(g.promoted, id, g.add[#g.add].score)
            elseif level == 0 then
                self:place(id, level, false)
                push(self.promoted_tails, id)
            else
                self:place(id, level, false)
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
local function settle_in(key, ktype, heads, add)
    if #heads == 0 then return end
    local levels = {}
    for _, h in ipairs(heads) do
        local v = levels[h.score]
        if v == nil then
            v = { count = 0, seen = 0 }
            levels[h.score] = v
            v.first = edge_seq(key, ktype, h.score, false)
        end
        v.count = v.count + 1
    end
    for _, h in ipairs(heads) do
        local v = levels[h.score]
        push(add, h.id, emq.priority_score(h.score, head_seq(v.first, v.count, v.seen)))
        v.seen = v.seen + 1
    end
end

function Lanes:settle_heads()
    settle_in(self.priority, self.types.priority, self.priority_heads, self.priority_add)
    self.priority_heads = {}
    for _, g in ipairs(self.gl) do
        settle_in(g.lane, g.ltype, g.heads, g.add)
        g.heads = {}
    end
end

-- apply_groups (emq_lanes.c): the group lanes' writes, then the ring's, then the groups' flags.
function Lanes:apply_groups()
    for _, g in ipairs(self.gl) do
        if #g.add > 0 then chunked('ZADD', g.lane, g.add, true) end
        if #g.leave > 0 then chunked('ZREM', g.lane, g.leave) end
    end
    if self.ring_opened and (self.ring_pops > 0 or #self.ring_push > self.ring_push_from) then
        -- the ring as it is left; deleted when no group is left in it (the empty name alone)
        local stays = self.ring_len - self.ring_pops
        local groups = stays - ((self.ring_len > 0 and not self.ring_popped_empty) and 1 or 0)
        local pushed = {}
        for i = self.ring_push_from + 1, #self.ring_push do
            pushed[#pushed + 1] = self.ring_push[i]
            if self.ring_push[i].id ~= '' then groups = groups + 1 end
        end
        if groups <= 0 then
            if self.ring_len > 0 then redis.call('DEL', self.ring) end
        else
            if self.ring_pops > 0 then redis.call('LPOP', self.ring, self.ring_pops) end
            if #pushed > 0 then chunked('RPUSH', self.ring, pushed) end
        end
        -- <base>meta says whether the ring exists: a claim of a queue without groups opens no other key
        if self.opened.meta and (groups > 0) ~= self.meta_ring then
            if groups > 0 then redis.call('HSET', self.meta, 'ring', '1') else redis.call('HDEL', self.meta, 'ring') end
        end
    end
    for _, g in ipairs(self.gl) do
        if g.enters ~= g.leaves then
            local existed = redis.call('EXISTS', g.hash) == 1
            if g.enters then redis.call('HSET', g.hash, 'ring', '1') else redis.call('HDEL', g.hash, 'ring') end
            emq.group_index_sync(self.base, g.group, existed)
        end
    end
    -- the groups a cap or a pause kept out, settled as they stand (emq_group_settle)
    for _, g in ipairs(self.gl) do
        if g.held and not g.enters then emq.group_settle(self.base, g.group) end
    end
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
    self:apply_groups()
    if self.seq_changed and self.stale_changed then
        redis.call('HSET', self.meta, 'seq', self.seq, 'stale', self.stale)
    elseif self.seq_changed then
        redis.call('HSET', self.meta, 'seq', self.seq)
    elseif self.stale_changed then
        redis.call('HSET', self.meta, 'stale', self.stale)
    end
end

