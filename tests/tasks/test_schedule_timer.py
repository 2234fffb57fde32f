"""The server fires due schedule ticks itself (issue 44; module/emq_schedules.c).

With the module and ``emq.schedule-timer yes`` (the default), a master's timer fires every
queue's due ticks with no client process: the same ticks, ids and cursor as a client's drive
(``echomq.schedules.plan``), every fire's writes in one MULTI/EXEC.  These tests start their
own servers (the timer changes what a shared server holds) and drive nothing unless they say so.
The client drivers alone are tests/tasks/test_schedules.py's (there the timer is off).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import echomq
from echomq import schedules as rules
from echomq.testing import EmbeddedServer, schedule_problems

from ..conftest import module_command_args, needs, wait_for_replica
from ..faults import AOF, restart, wait_until
from ..helpers import digest

Q = "tick"
SET = f"emq:{{{Q}}}:schedules"


def server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def row(name: str, queue: str = Q) -> str:
    return f"emq:{{{queue}}}:schedule:{name}"


def jobs_of(r: redis.Redis, name: str, queue: str = Q) -> list[int]:
    """The ticks whose jobs exist (from the ids ``<name>@<tick>``), sorted."""
    prefix = f"emq:{{{queue}}}:job:{name}@"
    return sorted(int(k.decode()[len(prefix) :]) for k in r.scan_iter(match=prefix + "*", count=1000))


def timer_off(module_so: Path) -> list[str]:
    """The server arguments that load the module with its timer off (a load argument: Redis 6.2 too)."""
    return ["--loadmodule", str(module_so), "schedule-timer", "no"]


@pytest.fixture(scope="module")
def timer_server(server_factory: Any) -> EmbeddedServer:
    server: EmbeddedServer = server_factory()
    return server


@pytest.fixture
def r(timer_server: EmbeddedServer) -> Any:
    conn = timer_server.client()
    conn.flushall()
    yield conn
    conn.close()


def test_with_no_client_an_every_300ms_schedule_enqueues_6_to_8_jobs_in_2_2_s(r: redis.Redis) -> None:
    """Issue 44's figure: nothing drives but the server."""
    client = echomq.Client(r)
    client.schedule(Q, "beat", every_ms=300, payload=b"p")
    time.sleep(2.2)
    ticks = jobs_of(r, "beat")
    assert 6 <= len(ticks) <= 8, ticks
    assert ticks == list(range(ticks[0], ticks[-1] + 1, 300))  # one a tick, none skipped
    stored = r.hgetall(row("beat"))
    assert int(stored[b"fired"]) >= len(ticks)
    assert r.hget(f"emq:{{{Q}}}:job:beat@{ticks[0]}", "payload") == b"p"
    # the cursor and the next ticks are what a client's plan stores
    last = int(stored[b"last"])
    expected = rules.define("beat", every_ms=300).ticks_after(last, rules.STORED_TICKS)
    assert r.hget(row("beat"), "ticks") in (
        ",".join(map(str, expected)).encode(),
        # a fire between the two reads
        ",".join(map(str, rules.define("beat", every_ms=300).ticks_after(last + 300, 8))).encode(),
    )


@needs("module_configs", "the timer is switched off and on with CONFIG SET")
@pytest.mark.parametrize("missed", rules.MISSED_CHOICES)
def test_missed_ticks_after_a_gap_follow_the_clients_plan(server_factory: Any, missed: str) -> None:
    """The timer off, the cursor set back 70 s (as if no one had fired since), the timer on: the
    server fires what ``plan`` fires at that cursor, and stores plan's cursor and ticks."""
    r = server_factory().client()
    r.config_set("emq.schedule-timer", "no")
    try:
        client = echomq.Client(r)
        schedule = rules.define("gap", every_ms=1000, missed=missed)
        ended = rules.define("ended", every_ms=1000, missed=missed, end_at=server_ms(r) - 61_000)
        client.schedule(Q, "gap", every_ms=1000, missed=missed)
        client.schedule(Q, "ended", every_ms=1000, missed=missed, end_at=ended.end_at)
        since = (server_ms(r) // 1000 - 70) * 1000 + 500
        for name in ("gap", "ended"):
            r.hset(row(name), "last", since)
            r.zadd(SET, {name: since + 500})
        r.config_set("emq.schedule-timer", "yes")
        assert wait_until(lambda: int(r.hget(row("gap"), "last") or 0) > since + 60_000, 5)
        assert wait_until(lambda: int(r.hget(row("ended"), "last") or 0) != since, 5)
    finally:
        r.config_set("emq.schedule-timer", "no")
    for name, rule in (("gap", schedule), ("ended", ended)):
        cursor = int(r.hget(row(name), "last"))
        # "gap" fired at a now in [cursor, cursor + 1000); "ended" at any now past its end
        firing = rules.plan(rule, since, cursor if name == "gap" else server_ms(r))
        assert firing.cursor == cursor
        assert jobs_of(r, name) == firing.fire, name
        assert int(r.hget(row(name), "fired")) == len(firing.fire)
        assert r.hget(row(name), "ticks").decode() == ",".join(map(str, firing.upcoming))
        score = r.zscore(SET, name)
        assert score == (firing.upcoming[0] if firing.upcoming else float("inf"))
    if missed == "all":
        assert len(jobs_of(r, "gap")) >= 70 and len(jobs_of(r, "ended")) == 9
    elif missed == "one":
        assert len(jobs_of(r, "gap")) == 1 and len(jobs_of(r, "ended")) == 1
    else:  # the latest due tick of "gap" is on time, none of "ended"'s
        assert len(jobs_of(r, "gap")) == 1 and jobs_of(r, "ended") == []


def test_a_cron_fires_from_its_stored_ticks_and_stops_when_they_run_out(
    r: redis.Redis, timer_server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server cannot parse cron: it fires the stored ticks while one of them is still ahead
    (7 of the 8), then waits for a client, whose drive tops the ticks up; then it fires again."""
    client = echomq.Client(r)
    info = client.schedule(Q, "sec", cron="* * * * * *", missed="all")  # every second
    stored = info.upcoming
    assert len(stored) == rules.STORED_TICKS
    wait_until(lambda: server_ms(r) > stored[-1] + 1500, 15)
    assert jobs_of(r, "sec") == stored[:-1]  # the 8th is due, but nothing after it is known
    assert r.hget(row("sec"), "ticks") == str(stored[-1]).encode()
    assert int(r.hget(row("sec"), "last")) == stored[-2]
    assert r.hget(row("sec"), "fired") == b"7"
    said = schedule_problems(r, Q)  # what `echomq check` prints
    assert len(said) == 1 and "'sec' is out of stored ticks" in said[0]
    from echomq.cli import main

    assert main(["--url", timer_server.url, "inspect", Q]) == 0
    assert "'sec' is out of stored ticks" in capsys.readouterr().out
    assert main(["--url", timer_server.url, "check", Q]) == 1
    assert "'sec' is out of stored ticks" in capsys.readouterr().out
    # a client's drive computes the rest with cronsim: the 8th and every second since, once each
    fired = client.drive_schedules(Q).fired
    assert fired and fired[0] == rules.job_id("sec", stored[-1])
    topped = client.schedules(Q)[0]
    assert schedule_problems(r, Q) == []
    assert len(topped.upcoming) == rules.STORED_TICKS
    assert wait_until(lambda: len(jobs_of(r, "sec")) > 7 + len(fired), 5)  # the server goes on
    ticks = jobs_of(r, "sec")
    assert ticks == list(range(ticks[0], ticks[-1] + 1, 1000))


def test_the_server_and_client_drivers_fire_each_tick_once(
    r: redis.Redis, timer_server: EmbeddedServer
) -> None:
    """Three clients drive in a loop while the server's timer fires: one job per tick, none lost."""
    client = echomq.Client(r)
    client.schedule(Q, "race", every_ms=100, missed="all")
    stop = threading.Event()
    drove: list[str] = []

    def driver() -> None:
        c = echomq.Client(timer_server.client())
        while not stop.is_set():
            drove.extend(c.drive_schedules(Q).fired)
            time.sleep(0.02)  # about as often as the timer (50 ms): each wins some ticks

    threads = [threading.Thread(target=driver) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
    with r.pipeline(transaction=True) as pipe:  # the count and the removal at one instant
        pipe.hget(row("race"), "fired")
        pipe.delete(row("race"))
        pipe.zrem(SET, "race")
        fired = int(pipe.execute()[0])
    ticks = jobs_of(r, "race")
    assert len(ticks) == fired  # `fired` counts each tick's job once, whoever fired it
    assert len(ticks) >= 15
    assert ticks == list(range(ticks[0], ticks[-1] + 1, 100))  # every tick, each once
    assert len(set(drove)) == len(drove)  # no two clients fired one tick


def test_a_replica_never_fires_and_fires_once_promoted(server_factory: Any, module_so: Path) -> None:
    """The master's timer is off, the replica's on: nothing fires; REPLICAOF NO ONE: it fires.
    The replica's keys equal the master's (DEBUG DIGEST) while the master fires."""
    master = server_factory(timer_off(module_so), load_module=False)
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    echomq.Client(m).schedule(Q, "beat", every_ms=100, missed="all")
    time.sleep(0.8)
    wait_for_replica(m, s)
    assert jobs_of(m, "beat") == [] and jobs_of(s, "beat") == []
    assert digest(m) == digest(s)
    s.execute_command("REPLICAOF", "NO", "ONE")
    assert wait_until(lambda: len(jobs_of(s, "beat")) >= 3, 5)
    ticks = jobs_of(s, "beat")
    assert ticks == list(range(ticks[0], ticks[-1] + 1, 100))


def test_a_replica_holds_what_the_master_fired(server_factory: Any) -> None:
    master = server_factory()
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    now = server_ms(m)
    echomq.Client(m).schedule(Q, "beat", every_ms=100, missed="all", end_at=now + 1000)
    assert wait_until(lambda: m.zscore(SET, "beat") == float("inf"), 5)
    wait_for_replica(m, s)
    assert len(jobs_of(m, "beat")) >= 9
    assert jobs_of(s, "beat") == jobs_of(m, "beat")
    assert digest(m) == digest(s)


def test_a_restart_with_aof_finds_the_schedules_and_fires(server_factory: Any, tmp_path: Path) -> None:
    """The index is module memory: after a restart the scan finds the schedule again.  The AOF
    replays what was fired, job and cursor together: the keys equal those before the restart."""
    server = server_factory(AOF, dir=tmp_path)
    r = server.client()
    client = echomq.Client(r)
    now = server_ms(r)
    client.schedule(Q, "done", every_ms=100, missed="all", end_at=now + 600)
    client.schedule(Q, "beat", every_ms=200, missed="all")
    assert wait_until(lambda: r.zscore(SET, "done") == float("inf"), 5)
    client.unschedule(Q, "beat")
    before, fired = digest(r), jobs_of(r, "done")
    assert len(fired) >= 5
    restart(server)
    r = server.client()
    assert digest(r) == before
    echomq.Client(r).schedule(Q, "beat", every_ms=200, missed="all")
    r.close()
    restart(server)  # the schedule only in the AOF, the index empty
    r = server.client()
    assert wait_until(lambda: len(jobs_of(r, "beat")) >= 3, 5)
    assert jobs_of(r, "done") == fired


def test_the_setting_no_fires_nothing(server_factory: Any, module_so: Path) -> None:
    server = server_factory(timer_off(module_so), load_module=False)
    r = server.client()
    echomq.Client(r).schedule(Q, "beat", every_ms=50, missed="all")
    time.sleep(0.6)
    assert jobs_of(r, "beat") == []
    assert "schedule-timer no" in server.logfile.read_text()


def test_a_malformed_row_is_skipped_logged_once_and_the_others_fire(
    r: redis.Redis, timer_server: EmbeddedServer
) -> None:
    client = echomq.Client(r)
    with r.pipeline(transaction=True) as pipe:  # both in one go: the timer sees them together
        pipe.hset(row("bad"), mapping={"every_ms": "soon", "missed": "skip", "last": "0", "fired": "0"})
        pipe.zadd(SET, {"bad": 1})
        pipe.execute()
    client.schedule(Q, "good", every_ms=100, missed="all")
    assert wait_until(lambda: len(jobs_of(r, "good")) >= 5, 5)
    assert jobs_of(r, "bad") == []
    log = timer_server.logfile.read_text()
    assert log.count(f"{row('bad')} is not fired until it changes: every_ms") == 1
    # mended, it fires
    r.hset(row("bad"), "every_ms", "100")
    assert wait_until(lambda: jobs_of(r, "bad") != [], 5)


def test_flushall_leaves_no_stale_index_and_a_removed_schedule_stops(r: redis.Redis) -> None:
    client = echomq.Client(r)
    client.schedule(Q, "beat", every_ms=50, missed="all")
    assert wait_until(lambda: len(jobs_of(r, "beat")) >= 2, 5)
    r.flushall()
    time.sleep(0.3)
    assert r.dbsize() == 0
    client.schedule(Q, "again", every_ms=50, missed="all")  # learnt again from its ZADD
    assert wait_until(lambda: len(jobs_of(r, "again")) >= 2, 5)
    client.unschedule(Q, "again")
    time.sleep(0.1)
    count = len(jobs_of(r, "again"))
    time.sleep(0.4)
    assert len(jobs_of(r, "again")) == count


def test_past_maxmemory_the_timer_waits_as_a_clients_drive_is_refused(r: redis.Redis) -> None:
    """EMQ.ENQUEUE is deny-oom: a client's EXEC is refused whole past maxmemory, and the timer
    fires nothing either; with memory back it fires, under ``missed``."""
    client = echomq.Client(r)
    client.schedule(Q, "beat", every_ms=100, missed="one")
    policy = r.config_get("maxmemory-policy")["maxmemory-policy"]
    try:
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", 1)
        time.sleep(0.1)
        count = len(jobs_of(r, "beat"))
        time.sleep(0.5)
        assert len(jobs_of(r, "beat")) == count
    finally:
        r.config_set("maxmemory", 0)
        r.config_set("maxmemory-policy", policy)
    assert wait_until(lambda: len(jobs_of(r, "beat")) > count, 5)


def test_a_schedule_in_another_database_fires(r: redis.Redis, timer_server: EmbeddedServer) -> None:
    """The index records the database with the key: a client may use any."""
    other = timer_server.client(db=3)
    echomq.Client(other).schedule(Q, "other", every_ms=100, missed="all")
    assert wait_until(lambda: len(jobs_of(other, "other")) >= 3, 5)
    assert r.dbsize() == 0  # db 0: nothing written there
    other.flushdb()


@needs("acl_keys", "the derived keys are ACL-checked from Redis 7.0")
def test_a_client_without_key_permission_is_still_refused(
    r: redis.Redis, timer_server: EmbeddedServer
) -> None:
    """The timer's own calls skip the user check; a client's do not, even while the timer fires."""
    echomq.Client(r).schedule(Q, "beat", every_ms=50, missed="all")
    r.execute_command("ACL", "SETUSER", "pendingonly", "reset", "on", ">pw", "+@all", f"~emq:{{{Q}}}:pending")
    try:
        limited = timer_server.client(username="pendingonly", password="pw")
        with pytest.raises(redis.ResponseError, match="no permissions"):
            limited.execute_command("EMQ.ENQUEUE", f"emq:{{{Q}}}:pending", f"emq:{{{Q}}}:", "mine", "x")
        assert r.exists(f"emq:{{{Q}}}:job:mine") == 0
        assert wait_until(lambda: len(jobs_of(r, "beat")) >= 2, 5)
    finally:
        r.execute_command("ACL", "DELUSER", "pendingonly")


@needs("module_configs", "the timer is switched off with CONFIG SET before the unload")
def test_unload_is_refused_while_the_timer_runs_and_leaves_nothing_after(server_factory: Any) -> None:
    server = server_factory(module_command_args())
    r = server.client()
    echomq.Client(r).schedule(Q, "beat", every_ms=100, missed="all")
    assert wait_until(lambda: len(jobs_of(r, "beat")) >= 1, 5)
    with pytest.raises(redis.ResponseError, match=r"(?i)timer"):
        r.execute_command("MODULE", "UNLOAD", "emq")
    r.config_set("emq.schedule-timer", "no")
    r.execute_command("MODULE", "UNLOAD", "emq")
    count = len(jobs_of(r, "beat"))
    r.zadd(SET, {"beat": 0})  # a keyspace event with the module gone
    time.sleep(0.3)
    assert len(jobs_of(r, "beat")) == count
    assert r.ping()


# -- the C rules against the Python ones, in-process (cffi) -------------------------------

CDEF = """
typedef struct {
    int is_cron; long long every_ms; int has_start, has_end; long long start_at, end_at;
    int missed; long long last; int nticks; long long ticks[8];
} EmqScheduleRow;
typedef struct {
    long long *fire; int nfire; long long cursor; int nupcoming; long long upcoming[8];
} EmqScheduleFiring;
const char *emq_schedule_parse(EmqScheduleRow *row, const char *cron, size_t cronlen,
    const char *every, size_t everylen, const char *start, size_t startlen, const char *end,
    size_t endlen, const char *missed, size_t missedlen, const char *last, size_t lastlen,
    const char *ticks, size_t tickslen);
int emq_schedule_plan(const EmqScheduleRow *row, long long now_ms, EmqScheduleFiring *out);
"""
PLAN_FIRE, PLAN_NOT_DUE, PLAN_OUT_OF_TICKS = 0, 1, 2


class CRules:
    def __init__(self, path: Path) -> None:
        cffi = pytest.importorskip("cffi", reason="cffi is in the [test] extra")
        self.ffi = cffi.FFI()
        self.ffi.cdef(CDEF)
        self.lib: Any = self.ffi.dlopen(str(path))

    def plan(self, fields: dict[str, bytes | None], now: int) -> tuple[int, list[int], int, list[int]] | str:
        """(verdict, fire, cursor, upcoming), or the parse refusal's text."""
        row = self.ffi.new("EmqScheduleRow *")
        args: list[Any] = []
        for name in ("cron", "every_ms", "start_at", "end_at", "missed", "last", "ticks"):
            value = fields.get(name)
            args += [self.ffi.NULL, 0] if value is None else [self.ffi.new("char[]", value), len(value)]
        bad = self.lib.emq_schedule_parse(row, *args)
        if bad != self.ffi.NULL:
            return str(self.ffi.string(bad).decode())
        out = self.ffi.new("EmqScheduleFiring *")
        buf = self.ffi.new("long long[]", rules.MISSED_CEILING)
        out.fire = buf
        verdict = self.lib.emq_schedule_plan(row, now, out)
        return verdict, list(buf[0 : out.nfire]), out.cursor, list(out.upcoming[0 : out.nupcoming])


@pytest.fixture(scope="module")
def c_rules(module_so: Path) -> CRules:
    return CRules(module_so)


def _fields(schedule: rules.Schedule, last: int, ticks: list[int]) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = dict(schedule.fields())
    out["last"] = str(last).encode()
    out["ticks"] = ",".join(map(str, ticks)).encode()
    return out


@given(
    every=st.integers(1, 5000),
    start=st.none() | st.integers(0, 10**6),
    span=st.none() | st.integers(0, 10**6),
    missed=st.sampled_from(rules.MISSED_CHOICES),
    last=st.integers(0, 2 * 10**6),
    ahead=st.integers(0, 10**7),
)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_c_plan_of_an_every_ms_row_is_pythons(
    c_rules: CRules, every: int, start: int | None, span: int | None, missed: str, last: int, ahead: int
) -> None:
    end = None if span is None else (start or 0) + span
    schedule = rules.define("s", every_ms=every, start_at=start, end_at=end, missed=missed)
    now = last + ahead
    got = c_rules.plan(_fields(schedule, last, []), now)
    assert not isinstance(got, str), got
    verdict, fire, cursor, upcoming = got
    firing = rules.plan(schedule, last, now)
    assert (fire, cursor, upcoming) == (firing.fire, firing.cursor, firing.upcoming)
    assert verdict == (PLAN_FIRE if firing.cursor != last else PLAN_NOT_DUE)


@given(
    cron=st.sampled_from(["* * * * * *", "*/7 * * * * *", "0 * * * *", "*/5 9-17 * * MON-FRI"]),
    missed=st.sampled_from(rules.MISSED_CHOICES),
    last=st.integers(1_700_000_000_000, 1_800_000_000_000),
    ahead=st.integers(0, 10**8),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_c_plan_of_a_cron_row_is_pythons_while_a_stored_tick_is_ahead(
    c_rules: CRules, cron: str, missed: str, last: int, ahead: int
) -> None:
    schedule = rules.define("c", cron=cron, missed=missed)
    stored = schedule.ticks_after(last, rules.STORED_TICKS)
    now = last + ahead
    got = c_rules.plan(_fields(schedule, last, stored), now)
    assert not isinstance(got, str), got
    verdict, fire, cursor, upcoming = got
    if stored and stored[-1] > now:
        firing = rules.plan(schedule, last, now)
        assert (fire, cursor) == (firing.fire, firing.cursor)
        assert upcoming == [t for t in stored if t > cursor] == firing.upcoming[: len(upcoming)]
    else:  # every stored tick due: the clients' to compute
        assert verdict == PLAN_OUT_OF_TICKS


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"every_ms": b"soon"}, "every_ms is not an integer"),
        ({"every_ms": b"0"}, "every_ms is not an integer from 1"),
        ({"every_ms": b"100", "cron": b"* * * * *"}, "exactly one of cron and every_ms"),
        ({}, "exactly one of cron and every_ms"),
        ({"every_ms": b"100", "missed": b"some"}, "missed is not one of skip, one, all"),
        ({"every_ms": b"100", "last": b"1e3"}, "last is not epoch ms"),
        ({"every_ms": b"100", "start_at": b"10", "end_at": b"5"}, "end_at comes before start_at"),
        ({"cron": b"* * * * *", "ticks": b"5,3"}, "ticks are not ascending"),
        ({"cron": b"* * * * *", "ticks": b"1,2,3,4,5,6,7,8,9"}, "more than 8 ticks"),
        ({"cron": b"* * * * *", "ticks": b"1,x"}, "ticks is not a list of epoch ms"),
    ],
)
def test_a_malformed_row_is_refused_by_the_c_rules(
    c_rules: CRules, fields: dict[str, bytes | None], words: str
) -> None:
    got = c_rules.plan(fields, 10**12)
    assert isinstance(got, str) and words in got


def test_after_a_resharding_the_node_that_got_the_queue_fires_its_ticks(server_factory: Any) -> None:
    """Issue 44: the index is found after a resharding too.  A queue's slot, with a schedule whose
    ticks have not begun, is moved from its master to another (SETSLOT, MIGRATE, as
    ``redis-cli --cluster reshard`` does it): the target's timer learns the set from the keys'
    arrival (RESTORE's keyspace event), fires every tick with no client, and the source fires none."""
    from redis.cluster import RedisCluster

    from ..clusters import node_id, owner_and_another, start_cluster, wait_for

    nodes = start_cluster(server_factory, 3)
    try:
        source, target = owner_and_another(nodes, SET)
        src, dst = source.client(), target.client()
        client = echomq.Client(RedisCluster(host=source.host, port=source.port))
        first = (server_ms(src) // 1000 + 3) * 1000  # the ticks begin after the move
        client.schedule(Q, "beat", every_ms=200, start_at=first, end_at=first + 1000, missed="all")
        slot = int(src.execute_command("CLUSTER", "KEYSLOT", SET))
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(source))
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(target))
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        assert {SET.encode(), row("beat").encode()} <= set(keys)
        src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
        for conn in (dst, src):
            conn.execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
        # the fault: every key of the queue left the source (it answers MOVED for them now)
        assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0 and dst.exists(SET) == 1
        assert server_ms(dst) < first, "the move took past the first tick: nothing here tells who fired it"
        wait_for(lambda: dst.zscore(SET, "beat") == float("inf"), "the target fired every tick", timeout=10)
        assert jobs_of(dst, "beat") == [first + i * 200 for i in range(6)]
        assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0  # the source fired none
        assert int(dst.hget(row("beat"), "fired") or 0) == 6
        client.redis.close()
    finally:
        for n in nodes:
            n.stop()
