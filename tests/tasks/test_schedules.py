"""Schedules (issue 31; docs/concepts/schedules.md): a job on every tick, once, whoever drives.

A schedule is a row ``<base>schedule:<name>`` (definition, cursor ``last``) and a member of
``<base>schedules`` scored with its next tick.  Workers' sweeps and reapers drive it: a
WATCH on the row, then one MULTI/EXEC that enqueues the tick's job (id ``<name>@<ms>``) and
advances the cursor.  ``ECHOMQ_SCHEDULE_TICKS`` (default 3) sets how many 1 s ticks the
driven tests run (``make schedules-long`` runs 60).

These tests prove the client drivers, so their servers load the module with its own timer off
(``schedule-timer no``): with it on, the server would fire the ticks first and a drive's reply
would count nothing.  The timer is tests/tasks/test_schedule_timer.py's.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import zoneinfo
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from cronsim import CronSim
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import echomq
import echomq.asyncio as emq
from echomq import schedules as rules
from echomq.testing import EmbeddedServer

from .. import containers
from ..calibration import budget
from ..faults import AOF, restart, wait_until
from ..helpers import digest

pytestmark = pytest.mark.backends

Q = "sched"
TICKS = int(os.environ.get("ECHOMQ_SCHEDULE_TICKS", "3"))
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
UTC = timezone.utc


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def next_second(r: redis.Redis, ahead: int = 1) -> int:
    """A whole second at least ``ahead`` seconds from the server's now (epoch ms)."""
    return (server_ms(r) // 1000 + 1 + ahead) * 1000


def sleep_until(r: redis.Redis, at_ms: int) -> None:
    while (left := at_ms - server_ms(r)) > 0:
        time.sleep(left / 1000)


# -- servers whose module leaves the firing to the clients -----------------------------


@pytest.fixture(scope="session")
def clients_only(server_factory: Any, module_so: Path) -> Any:
    """``server_factory``, but a server with the module loads it with ``schedule-timer no`` (a load
    argument: Redis 6.2 has no module configs)."""

    def start(args: list[str] | None = None, load_module: bool = True, **kwargs: Any) -> EmbeddedServer:
        if load_module:
            args = ["--loadmodule", str(module_so), "schedule-timer", "no", *(args or [])]
        server: EmbeddedServer = server_factory(args, load_module=False, **kwargs)
        return server

    return start


@pytest.fixture(scope="module")
def server(clients_only: Any, backend: str) -> Any:
    """This file's shared server: the suite's, with the module's timer off (see the docstring)."""
    if backend == "module" and containers.selected():
        with containers.suite_server() as srv:
            srv.client().config_set("emq.schedule-timer", "no")
            yield srv
            srv.client().config_set("emq.schedule-timer", "yes")
        return
    yield clients_only(load_module=backend == "module")


# -- the rules, without a server -------------------------------------------------------


def library_ticks(expr: str, zone: zoneinfo.ZoneInfo, start: datetime, end: datetime) -> list[int]:
    out: list[int] = []
    for moment in CronSim(expr, start.astimezone(zone)):
        if moment > end:
            return out
        out.append(ms(moment))
    return out


@pytest.mark.parametrize(
    ("first", "last", "switch"),
    [
        (datetime(2026, 3, 26, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC), "spring"),
        (datetime(2026, 10, 22, tzinfo=UTC), datetime(2026, 10, 29, tzinfo=UTC), "autumn"),
    ],
)
def test_a_berlin_2am_cron_follows_the_library_across_both_dst_switches(
    first: datetime, last: datetime, switch: str
) -> None:
    """2:00 does not exist on 29 March 2026 in Berlin (the tick comes at 3:00 CEST) and exists
    twice on 25 October (it comes once, at the first, CEST); the ticks are cronsim's, one a day."""
    schedule = rules.define("nightly", cron="0 2 * * *", tz="Europe/Berlin")
    ticks = [t for t in schedule.ticks_after(ms(first), 10) if t <= ms(last)]
    assert ticks == library_ticks("0 2 * * *", BERLIN, first, last)
    walls = [datetime.fromtimestamp(t / 1000, BERLIN).isoformat() for t in ticks]
    if switch == "spring":
        assert "2026-03-29T03:00:00+02:00" in walls
        assert "2026-03-28T02:00:00+01:00" in walls and "2026-03-30T02:00:00+02:00" in walls
    else:
        assert walls.count("2026-10-25T02:00:00+02:00") == 1
        assert "2026-10-25T02:00:00+01:00" not in walls
        assert "2026-10-26T02:00:00+01:00" in walls
    assert len(ticks) == len({datetime.fromtimestamp(t / 1000, BERLIN).date() for t in ticks})


def test_missed_ticks_after_a_downtime_skip_one_or_all() -> None:
    """Every due tick is consumed; ``missed`` says which of them run."""
    every = {name: rules.define("s", every_ms=1000, missed=name) for name in rules.MISSED_CHOICES}
    # ten ticks due, the latest on time (500 ms late): skip and one run it, all runs the ten
    assert rules.plan(every["skip"], 0, 10_500).fire == [10_000]
    assert rules.plan(every["one"], 0, 10_500).fire == [10_000]
    firing = rules.plan(every["all"], 0, 10_500)
    assert firing.fire == list(range(1000, 10_001, 1000))
    assert (firing.cursor, firing.upcoming[0], firing.dropped) == (10_000, 11_000, 0)
    # the latest due tick 70 s late: skip runs none, one runs only it
    ended = {name: rules.define("s", every_ms=1000, missed=name, end_at=10_000) for name in every}
    skipped = rules.plan(ended["skip"], 0, 80_000)
    assert (skipped.fire, skipped.cursor, skipped.dropped, skipped.upcoming) == ([], 10_000, 10, [])
    assert rules.plan(ended["one"], 0, 80_000).fire == [10_000]
    # all: at most the ceiling, the latest ones
    many = rules.plan(every["all"], 0, 5000 * 1000)
    assert len(many.fire) == rules.MISSED_CEILING and many.fire[-1] == 5_000_000
    assert many.dropped == 5000 - rules.MISSED_CEILING
    # nothing due: the cursor stays
    assert rules.plan(every["all"], 10_000, 10_999) == rules.Firing([], 10_000, firing.upcoming)


def test_a_cron_with_seconds_and_a_long_downtime_keeps_the_latest_ticks() -> None:
    schedule = rules.define("s", cron="* * * * * *", missed="all")
    firing = rules.plan(schedule, 0, 3_000_000_000)
    assert firing.fire == list(range(3_000_000_000 - 999_000, 3_000_000_001, 1000))
    assert firing.dropped >= rules.MAX_SCAN


def test_start_and_end_bound_the_ticks() -> None:
    schedule = rules.define("s", every_ms=300, start_at=1000, end_at=2000)
    assert schedule.ticks_after(0, 10) == [1000, 1300, 1600, 1900]
    cron = rules.define("c", cron="* * * * *", start_at=120_000, end_at=300_000)
    assert cron.ticks_after(0, 10) == [120_000, 180_000, 240_000, 300_000]


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CRON_PARTS = st.sampled_from(
    ["*", "*/5", "0", "59", "60", "1-5", "5-1", "MON", "L", "?", "", "a", "1,2", "*/0", "-1"]
)


@FUZZ
@given(
    st.one_of(st.text(max_size=40), st.lists(CRON_PARTS, min_size=0, max_size=7).map(" ".join)),
    st.one_of(
        st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "", "Nowhere/Land", "../etc"]), st.text()
    ),
)
@example("* * * * *", "0" * 300)  # found by this test: zoneinfo's OSError "File name too long"
def test_any_cron_or_zone_is_accepted_or_refused_with_bad_schedule(cron: str, tz: str) -> None:
    """Whatever the text, define() answers a schedule or BadSchedule -- never another exception --
    and an accepted one yields increasing ticks."""
    try:
        schedule = rules.define("s", cron=cron, tz=tz)
    except echomq.BadSchedule:
        return
    ticks = schedule.ticks_after(1_700_000_000_000, 5)
    assert ticks == sorted(set(ticks)) and all(t > 1_700_000_000_000 for t in ticks)


@FUZZ
@given(
    st.integers(1, 10**7),
    st.integers(0, 2**45),
    st.integers(0, 10**9),
    st.sampled_from(rules.MISSED_CHOICES),
    st.one_of(st.none(), st.integers(0, 2**45)),
)
def test_a_plan_fires_due_ticks_once_in_order_and_moves_the_cursor_forward(
    every: int, last: int, gap: int, missed: str, end: int | None
) -> None:
    """The fired ticks are due ticks (after the cursor, up to now), increasing, at most the ceiling;
    the cursor never goes back; the next plan from the new cursor at the same time fires nothing."""
    schedule = rules.define("s", every_ms=every, missed=missed, end_at=end)
    now = last + gap
    firing = rules.plan(schedule, last, now)
    assert all(last < t <= now for t in firing.fire)
    assert firing.fire == sorted(set(firing.fire)) and len(firing.fire) <= rules.MISSED_CEILING
    assert firing.cursor >= last and (not firing.fire or firing.fire[-1] == firing.cursor)
    assert all(t > firing.cursor for t in firing.upcoming)
    again = rules.plan(schedule, firing.cursor, now)
    assert again.fire == [] and again.cursor == firing.cursor
    if missed == "all":
        due = (firing.cursor - (firing.fire[0] if firing.fire else firing.cursor)) // every + 1
        assert len(firing.fire) == (min(due, rules.MISSED_CEILING) if firing.fire else 0)


# -- on a server ---------------------------------------------------------------------------

BAD: list[dict[str, Any]] = [
    {"cron": "61 * * * *"},
    {"cron": "every day"},
    {"cron": "* * * * *", "tz": "Mars/Olympus_Mons"},
    {"cron": "* * * * *", "tz": ""},
    {"every_ms": 0},
    {"every_ms": -5},
    {"every_ms": 1.5},
    {"cron": "* * * * *", "every_ms": 1000},
    {},
    {"every_ms": 1000, "missed": "some"},
    {"every_ms": 1000, "start_at": 5000, "end_at": 4000},
    {"every_ms": 1000, "start_at": datetime(2026, 1, 1)},  # naive: which zone?
    {"every_ms": 1000, "payload": 42},
]


@pytest.mark.parametrize("bad", BAD, ids=[str(sorted(b.items())) for b in BAD])
def test_bad_input_is_a_typed_error_that_changes_nothing(
    r: redis.Redis, client: echomq.Client, bad: dict[str, Any]
) -> None:
    client.schedule(Q, "kept", every_ms=60_000)
    before = digest(r)
    with pytest.raises(echomq.BadSchedule) as info:
        client.schedule(Q, "kept", **bad)
    assert isinstance(info.value, ValueError)
    with pytest.raises(echomq.BadSchedule):
        client.schedule(Q, "new one", every_ms=1000)  # a space: not a name
    assert digest(r) == before


def test_add_list_replace_remove(r: redis.Redis, client: echomq.Client) -> None:
    info = client.schedule(Q, "report", cron="*/5 * * * *", payload=b"weekly", tz="Europe/Berlin")
    now = server_ms(r)
    assert info.schedule.cron == "*/5 * * * *" and info.fired == 0
    assert now - 5000 < info.last_ms <= now
    assert info.next_ms is not None and info.next_ms % 300_000 == 0 and info.next_ms > info.last_ms
    assert len(info.upcoming) == rules.STORED_TICKS
    assert r.zscore(f"emq:{{{Q}}}:schedules", "report") == info.next_ms
    r.hset(f"emq:{{{Q}}}:schedule:report", mapping={"last": 1000, "fired": 7})
    same = client.schedule(Q, "report", cron="*/5 * * * *", payload=b"monthly", tz="Europe/Berlin")
    assert (same.last_ms, same.fired, same.schedule.payload) == (1000, 7, b"monthly")  # the cursor kept
    replaced = client.schedule(Q, "report", every_ms=60_000, payload="daily")
    assert replaced.last_ms >= now and replaced.fired == 7  # new timing: ticks from now on
    assert replaced.schedule.cron is None and r.hget(f"emq:{{{Q}}}:schedule:report", "cron") is None
    client.schedule(Q, "another", every_ms=1000)
    assert [s.name for s in client.schedules(Q)] == ["another", "report"]
    assert client.unschedule(Q, "report") is True
    assert client.unschedule(Q, "report") is False
    assert [s.name for s in client.schedules(Q)] == ["another"]
    assert not r.exists(f"emq:{{{Q}}}:schedule:report")


def test_a_nightly_berlin_schedule_fires_each_night_once_across_both_switches(
    r: redis.Redis, client: echomq.Client
) -> None:
    """The cursor set back to 27 March 2026: one drive (missed="all") fires every night since,
    exactly the library's ticks, with 3:00 CEST on 29 March and 2:00 CEST once on 25 October."""
    now = server_ms(r)
    if now < ms(datetime(2026, 10, 27, tzinfo=UTC)):
        pytest.skip("the server's clock is before 27 October 2026: the autumn switch is not past yet")
    client.schedule(Q, "nightly", cron="0 2 * * *", tz="Europe/Berlin", missed="all")
    since = datetime(2026, 3, 27, tzinfo=UTC)
    r.hset(f"emq:{{{Q}}}:schedule:nightly", "last", ms(since))  # as if added then, never driven
    r.zadd(f"emq:{{{Q}}}:schedules", {"nightly": ms(since) + 1})
    result = client.drive_schedules(Q)
    expected = library_ticks("0 2 * * *", BERLIN, since, datetime.fromtimestamp(server_ms(r) / 1000, UTC))
    if len(expected) > rules.MISSED_CEILING:
        pytest.skip("more nights since March than one drive fires")
    assert result.fired == [rules.job_id("nightly", t) for t in expected]
    assert f"nightly@{ms(datetime(2026, 3, 29, 1, tzinfo=UTC))}" in result.fired  # 03:00 CEST
    assert f"nightly@{ms(datetime(2026, 10, 25, 0, tzinfo=UTC))}" in result.fired  # 02:00 CEST
    assert f"nightly@{ms(datetime(2026, 10, 25, 1, tzinfo=UTC))}" not in result.fired  # not again at CET
    assert client.counts(Q).pending == len(expected)
    assert client.drive_schedules(Q).fired == []


def test_concurrent_drivers_of_one_tick_enqueue_one_job(server: EmbeddedServer, r: redis.Redis) -> None:
    """Eight clients drive the same due tick at once: one job, one ``fired``, three rounds."""
    clients = [echomq.Client(server.client()) for _ in range(8)]
    for round_ in range(3):
        name = f"once-{round_}"
        at = next_second(r)
        clients[0].schedule(Q, name, every_ms=1000, start_at=at, end_at=at, missed="all")
        sleep_until(r, at + 10)
        barrier = threading.Barrier(len(clients))
        results: list[echomq.DriveResult] = []

        def drive(c: echomq.Client, barrier: threading.Barrier, results: list[echomq.DriveResult]) -> None:
            barrier.wait()
            results.append(c.drive_schedules(Q))

        threads = [threading.Thread(target=drive, args=(c, barrier, results)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fired = [job for result in results for job in result.fired]
        assert fired == [rules.job_id(name, at)]
        assert clients[0].schedules(Q)[round_].fired == 1
    assert clients[0].counts(Q).pending == 3


def _expected(name: str, first: int, n: int) -> list[str]:
    return [rules.job_id(name, first + i * 1000) for i in range(n)]


def test_four_workers_and_a_reaper_run_each_tick_once(server: EmbeddedServer, r: redis.Redis) -> None:
    """Two thread workers, two asyncio workers and a Reaper drive one schedule of 1 s ticks: every
    tick's job runs exactly once, none missing (done rows are not kept: a tick fired twice would run
    twice)."""
    client = echomq.Client(server.client())
    client.retention(Q, done_ms=0)
    first = next_second(r)
    client.schedule(Q, "beat", every_ms=1000, start_at=first, end_at=first + (TICKS - 1) * 1000, missed="all")
    ran: list[str] = []
    lock = threading.Lock()

    def handler(ctx: echomq.JobContext) -> None:
        with lock:
            ran.append(str(ctx.id))

    async def ahandler(ctx: emq.JobContext) -> None:
        with lock:
            ran.append(str(ctx.id))

    stop = threading.Event()

    def asyncio_workers() -> None:
        async def main() -> None:
            workers = [
                emq.Worker(emq.Client(redis.asyncio.Redis(port=server.port)), Q, ahandler, reap_interval=0.3)
                for _ in range(2)
            ]
            for w in workers:
                await w.__aenter__()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            for w in workers:
                await w.__aexit__(None, None, None)

        asyncio.run(main())

    aio = threading.Thread(target=asyncio_workers)
    aio.start()
    workers = [echomq.Worker(echomq.Client(server.client()), Q, handler, reap_interval=0.3) for _ in range(2)]
    try:
        with echomq.Reaper(echomq.Client(server.client()), Q, interval=0.5), workers[0], workers[1]:
            assert wait_until(lambda: len(ran) >= TICKS, timeout=TICKS + 30)
            time.sleep(1.0)  # a duplicate would come now
    finally:
        stop.set()
        aio.join()
    assert sorted(ran) == _expected("beat", first, TICKS)
    assert client.schedules(Q)[0].fired == TICKS


@pytest.fixture
def aof_server(clients_only: Any, backend: str, tmp_path: Path) -> EmbeddedServer:
    server: EmbeddedServer = clients_only(AOF, dir=tmp_path, load_module=backend == "module")
    return server


def test_ticks_across_a_restart_with_aof_fire_once_none_lost(aof_server: EmbeddedServer) -> None:
    """Three drivers loop; the server is restarted (SIGTERM, AOF) after the first tick and stays down
    over the next: every tick's job is enqueued once (missed="all"), none twice."""
    r = aof_server.client()
    n = TICKS
    first = next_second(r)
    control = echomq.Client(aof_server.client())
    control.schedule(Q, "beat", every_ms=1000, start_at=first, end_at=first + (n - 1) * 1000, missed="all")
    fired: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def driver() -> None:
        c = echomq.Client.from_url(aof_server.url)
        while not done.is_set():
            try:
                result = c.drive_schedules(Q)
            except redis.ConnectionError:
                time.sleep(0.05)
                continue
            with lock:
                fired.extend(result.fired)
            time.sleep(0.1)

    threads = [threading.Thread(target=driver) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        sleep_until(r, first + 300)
        restart(aof_server, down_for=1.5)
        r = aof_server.client()
        sleep_until(r, first + (n - 1) * 1000 + 700)
        assert wait_until(lambda: len(fired) >= n, timeout=15)
        time.sleep(0.5)
    finally:
        done.set()
        for t in threads:
            t.join()
    assert sorted(fired) == _expected("beat", first, n)
    assert control.counts(Q).pending == n
    assert control.schedules(Q)[0].fired == n


def test_asyncio_client_has_the_same_schedules(server: EmbeddedServer, r: redis.Redis) -> None:
    async def main() -> None:
        client = emq.Client(redis.asyncio.Redis(port=server.port))
        first = next_second(r, 0)
        info = await client.schedule(Q, "a", every_ms=200, start_at=first, end_at=first + 400, missed="all")
        assert info.next_ms == first
        with pytest.raises(echomq.BadSchedule):
            await client.schedule(Q, "a", every_ms=0)
        await asyncio.sleep(max(0, first + 500 - server_ms(r)) / 1000)
        drives = await asyncio.gather(*(client.drive_schedules(Q) for _ in range(4)))
        assert sorted(j for d in drives for j in d.fired) == [f"a@{first + i}" for i in (0, 200, 400)]
        assert [s.fired for s in await client.schedules(Q)] == [3]
        assert (await client.schedules(Q))[0].next_ms is None  # past end_at
        assert await client.unschedule(Q, "a") is True
        await client.aclose()

    asyncio.run(main())


def test_the_cli_adds_lists_and_removes(
    server: EmbeddedServer, client: echomq.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    from echomq.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["--url", server.url, "schedule", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run("add", Q, "digest", "--cron", "0 8 * * *", "--tz", "Europe/Berlin", "--payload", "hi")
    assert code == 0 and out.startswith("digest: next tick ") and "T08:00:00+01:00" in out
    assert run("add", Q, "beat", "--every", "30s", "--missed", "all")[0] == 0
    code, out, _ = run("list", Q)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == [
        "NAME",
        "TASK",
        "WHEN",
        "TZ",
        "MISSED",
        "NEXT",
        "TICK",
        "LAST",
        "TICK",
        "FIRED",
    ]
    assert lines[2].split()[:6] == ["beat", "-", "every", "30000", "ms", "UTC"]  # "-": a raw payload
    assert lines[3].split()[:5] == ["digest", "-", "cron", "0", "8"]
    assert client.schedules(Q)[1].schedule.payload == b"hi"
    assert run("remove", Q, "beat")[:2] == (0, "removed 'beat' (the jobs it enqueued stay)\n")
    assert run("remove", Q, "beat")[0] == 1
    code, _, err = run("add", Q, "x", "--cron", "bad")
    assert (code, err) == (1, "echomq: bad cron expression 'bad': Wrong number of fields\n")
    assert [s.name for s in client.schedules(Q)] == ["digest"]


@pytest.mark.slow
def test_schedules_on_a_cluster_fire_on_the_queues_node(clients_only: Any, backend: str) -> None:
    """On Redis Cluster the WATCH/MULTI/EXEC goes to the node of the queue's slot."""
    from redis.cluster import RedisCluster

    from ..clusters import start_cluster

    nodes = start_cluster(clients_only, 3, load_module=backend == "module")
    try:
        client = echomq.Client(RedisCluster(host=nodes[0].host, port=nodes[0].port))
        r = nodes[0].client()
        for queue in ("a", "b", "c"):
            first = next_second(r, 0)
            client.schedule(queue, "beat", every_ms=200, start_at=first, end_at=first + 200, missed="all")
        sleep_until(r, first + 300)
        for queue in ("a", "b", "c"):
            assert client.drive_schedules(queue).fired  # each queue's ticks (some maybe fired already)
            assert client.drive_schedules(queue).fired == []
            assert [s.fired for s in client.schedules(queue)] == [2]
            assert client.counts(queue).pending == 2
            assert client.unschedule(queue, "beat") is True
    finally:
        for n in nodes:
            n.stop()


def test_a_failover_to_a_replica_neither_repeats_nor_loses_a_tick(clients_only: Any, backend: str) -> None:
    """Ticks fired on the master reach the replica with their cursor (one MULTI/EXEC); the master
    dies, the replica is promoted, and driving it fires the remaining ticks only, each once."""
    from ..conftest import wait_for_replica

    module = backend == "module"
    master = clients_only(load_module=module)
    replica = clients_only(["--replicaof", master.host, str(master.port)], load_module=module)
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    n = TICKS
    first = next_second(m)
    on_master = echomq.Client(master.client())
    on_master.schedule(Q, "beat", every_ms=1000, start_at=first, end_at=first + (n - 1) * 1000, missed="all")
    sleep_until(m, first + 1200)
    fired = on_master.drive_schedules(Q).fired
    assert fired == _expected("beat", first, 2)
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    master.stop()
    s.execute_command("REPLICAOF", "NO", "ONE")
    on_replica = echomq.Client(replica.client())
    later = on_replica.drive_schedules(Q).fired  # (a tick that came due meanwhile, at most)
    assert not set(later) & set(fired)  # the replica knows those ticks are consumed
    sleep_until(s, first + (n - 1) * 1000 + 100)
    fired += later + on_replica.drive_schedules(Q).fired
    assert fired == _expected("beat", first, n)
    assert on_replica.counts(Q).pending == n
    assert on_replica.schedules(Q)[0].fired == n


@pytest.mark.parametrize("driver", ["worker", "asyncio worker", "reaper", "asyncio reaper"])
def test_each_driver_alone_fires_the_ticks(server: EmbeddedServer, r: redis.Redis, driver: str) -> None:
    """Any one of them is enough: a thread worker's or an asyncio worker's sweep, or a reaper."""
    first = next_second(r, 0)
    control = echomq.Client(server.client())
    control.schedule(Q, "solo", every_ms=200, start_at=first, end_at=first + 400, missed="all")

    def fired() -> int:
        return control.schedules(Q)[0].fired

    if driver == "worker":
        with echomq.Worker(echomq.Client(server.client()), Q, lambda ctx: None, reap_interval=0.1):
            assert wait_until(lambda: fired() == 3, timeout=15)
    elif driver == "reaper":
        with echomq.Reaper(echomq.Client(server.client()), Q, interval=0.1):
            assert wait_until(lambda: fired() == 3, timeout=15)
    else:

        async def main() -> None:
            aclient = emq.Client(redis.asyncio.Redis(port=server.port))
            if driver == "asyncio worker":

                async def handler(ctx: emq.JobContext) -> None:
                    return None

                runner: Any = emq.Worker(aclient, Q, handler, reap_interval=0.1)
            else:
                runner = emq.Reaper(aclient, Q, interval=0.1)
            async with runner:
                deadline = time.monotonic() + 15
                while fired() < 3 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            await aclient.aclose()

        asyncio.run(main())
    assert fired() == 3
    ids = {rules.job_id("solo", first + i) for i in (0, 200, 400)}
    assert all(r.exists(f"emq:{{{Q}}}:job:{i}") for i in ids)  # done rows are kept an hour


def test_workers_at_their_defaults_fire_each_tick_on_time(server: EmbeddedServer, r: redis.Redis) -> None:
    """Issue 44: two thread workers and an asyncio worker at their defaults (a sweep every 5-15 s)
    and a schedule of 500 ms ticks added while they run (missed="skip", the default): every tick's
    job, none dropped, each enqueued within 150 ms of its tick (scaled to the machine).  Their sweeps
    drove the schedules: 0 or 1 of the 8 ticks fired, the others dropped as missed."""
    workers = [echomq.Worker(echomq.Client(server.client()), Q, lambda ctx: None) for _ in range(2)]
    stop = threading.Event()
    ready = threading.Event()

    def asyncio_worker() -> None:
        async def main() -> None:
            async def handler(ctx: emq.JobContext) -> None:
                return None

            aclient = emq.Client(redis.asyncio.Redis(port=server.port))
            async with emq.Worker(aclient, Q, handler):
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)
            await aclient.aclose()

        asyncio.run(main())

    aio = threading.Thread(target=asyncio_worker)
    aio.start()
    try:
        with workers[0], workers[1]:
            assert ready.wait(10)
            time.sleep(0.3)  # their listeners subscribed: the schedule's add wakes them
            control = echomq.Client(server.client())
            first = next_second(r, 0)
            control.schedule(Q, "half", every_ms=500, start_at=first, end_at=first + 3500)
            expected = [rules.job_id("half", first + i * 500) for i in range(8)]
            within_s = first / 1000 - time.time() + 15
            assert wait_until(lambda: control.schedules(Q)[0].fired >= 8, timeout=within_s)
            time.sleep(0.6)  # a duplicate would come now
    finally:
        stop.set()
        aio.join()
    rows = {job: r.hgetall(f"emq:{{{Q}}}:job:{job}") for job in expected}
    assert all(rows.values()), [job for job, row in rows.items() if not row]
    late = {job: int(row[b"enqueued_at"]) - int(job.rsplit("@", 1)[1]) for job, row in rows.items()}
    assert all(0 <= ms <= budget(0.15) * 1000 for ms in late.values()), late
    assert control.schedules(Q)[0].fired == 8


LONG = os.environ.get("ECHOMQ_SCHEDULE_LONG") == "1"


@pytest.mark.skipif(not LONG, reason="three minutes of a minute cron: make schedules-long runs it")
def test_a_minute_cron_fires_each_minute_once_across_a_restart_and_a_failover(
    clients_only: Any, backend: str, tmp_path: Path
) -> None:
    """Issue 44's long form: a ``* * * * *`` cron driven by three drivers (thread workers' own
    drivers, at their defaults) on the master.  The master is restarted (SIGTERM, AOF) across the
    second minute's tick, then dies just before the third; its replica is promoted and a worker on it
    fires the third.  Each minute's job once, none lost."""
    from ..conftest import wait_for_replica

    module = backend == "module"
    master = clients_only(AOF, dir=tmp_path, load_module=module)
    replica = clients_only(["--replicaof", master.host, str(master.port)], load_module=module)
    m = master.client()
    wait_for_replica(m, replica.client())
    control = echomq.Client(master.client())
    control.schedule(Q, "minute", cron="* * * * *", missed="skip")
    first = (server_ms(m) // 60_000 + 1) * 60_000

    def workers_on(server: EmbeddedServer) -> list[echomq.Worker]:
        out = [echomq.Worker(echomq.Client.from_url(server.url), Q, lambda ctx: None) for _ in range(3)]
        for w in out:
            w.start()
        return out

    workers = workers_on(master)
    try:
        sleep_until(m, first + 60_000 - 1_000)  # the first minute fired; the second is a second away
        restart(master, down_for=2.0)  # down across the second minute's tick
        m = master.client()
        sleep_until(m, first + 120_000 - 3_000)
        m.execute_command("WAIT", 1, 5000)
        wait_for_replica(m, replica.client())
        for w in workers:
            w.stop()
        master.stop()
        s = replica.client()
        s.execute_command("REPLICAOF", "NO", "ONE")
        workers = workers_on(replica)
        sleep_until(s, first + 120_000 + 3_000)
    finally:
        for w in workers:
            w.stop()
    on_replica = echomq.Client(replica.client())
    ticks = [first, first + 60_000, first + 120_000]
    jobs = {j: replica.client().exists(f"emq:{{{Q}}}:job:{rules.job_id('minute', j)}") for j in ticks}
    assert all(jobs.values()), jobs
    assert on_replica.schedules(Q)[0].fired == 3
    assert len(list(replica.client().scan_iter(match=f"emq:{{{Q}}}:job:minute@*"))) == 3  # none other
