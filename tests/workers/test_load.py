"""Loading emq.so: every refusal says why in the server log; load arguments.

A module whose OnLoad fails leaves the server with one generic line
("Module ... initialization failed"); emq.so logs the reason before it: a
second copy of the module, an API function the server lacks, an unknown or
malformed load argument.  The load arguments (`max-limit <n>`,
`max-state-bytes <n>`) are the settings on every server, and the only way
to give them on Redis 6.2, which has no module configs.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from echomq.keyspace import QueueKeys, queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import MODULE_DIR, ServerFactory, module_command_args, supports
from ..helpers import emq_configs, put_active, sweep_args
from ..helpers import now_ms as server_ms

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]

LIMIT_ERROR = "limit exceeds the server's emq.max-limit"  # redis-py drops the "ERR "


@pytest.fixture(scope="module")
def bare(server_factory: ServerFactory) -> EmbeddedServer:
    """A server started without the module: each test loads (and unloads) it."""
    return server_factory(module_command_args(), load_module=False)


@pytest.fixture
def conn(bare: EmbeddedServer) -> Iterator[redis.Redis]:
    c = bare.client()
    yield c
    if b"emq" in [m[b"name"] for m in c.module_list()]:
        c.execute_command("MODULE", "UNLOAD", "emq")
    c.flushall()
    c.close()


def log_since(srv: EmbeddedServer, mark: int) -> str:
    return srv.logfile.read_text(errors="replace")[mark:]


def log_mark(srv: EmbeddedServer) -> int:
    return len(srv.logfile.read_text(errors="replace"))


def refused(conn: redis.Redis, srv: EmbeddedServer, *args: object) -> str:
    """MODULE LOAD that must fail; returns the server log it wrote."""
    mark = log_mark(srv)
    before = conn.module_list()
    with pytest.raises(redis.ResponseError):
        conn.execute_command("MODULE", "LOAD", *args)
    assert conn.module_list() == before
    log = log_since(srv, mark)
    assert "initialization failed" in log or "failed to load" in log.lower()
    return log


def test_a_second_copy_is_refused_and_says_why(
    bare: EmbeddedServer, conn: redis.Redis, module_so: Path, tmp_path: Path
) -> None:
    conn.execute_command("MODULE", "LOAD", str(module_so))
    copy = tmp_path / "emq-copy.so"
    shutil.copy(module_so, copy)
    log = refused(conn, bare, str(copy))
    assert "<emq> not loaded: a module named 'emq' is already loaded (see MODULE LIST)" in log
    # The first copy is untouched and works.
    assert conn.execute_command("EMQ.ENQUEUE", "emq:{q}:pending", "emq:{q}:", "j", "x") == 1


def test_a_server_without_a_required_function_says_which(bare: EmbeddedServer, conn: redis.Redis) -> None:
    # emq.so built to need one more function than any server has (module/Makefile).
    subprocess.run(["make", "-s", "-C", str(MODULE_DIR), "emq-needs-more.so"], check=True)
    log = refused(conn, bare, str(MODULE_DIR / "emq-needs-more.so"))
    assert "<emq> not loaded: this server has no RedisModule_NoSuchFunctionForTests, which emq needs" in log
    # Nothing of it stayed behind: the real module loads afterwards.
    conn.execute_command("MODULE", "LOAD", str(MODULE_DIR / "emq.so"))


MAX_LIMIT_RANGE = "the load argument max-limit needs an integer from 1 to 100000"
STATE_RANGE = "the load argument max-state-bytes needs an integer from 0 to 16777216"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["bogus", "1"],
            "unknown load argument 'bogus' (emq.so takes: max-limit <n>, max-state-bytes <n>, "
            "max-payload-bytes <n>, max-result-bytes <n>, schedule-timer yes|no)",
        ),
        (["MAX-LIMIT", "5"], "unknown load argument 'MAX-LIMIT'"),
        (["emq.max-limit", "5"], "unknown load argument 'emq.max-limit'"),
        (["max-limit"], "the load argument max-limit needs an integer from 1 to 100000, got ''"),
        (["max-limit", "0"], "the load argument max-limit needs an integer from 1 to"),
        (["max-limit", "1e3"], "the load argument max-limit needs an integer from 1 to 100000, got '1e3'"),
        # above the ceilings the verbs are tested at (issue 28: 2^62 + 1 crashed ENQUEUEMANY)
        (["max-limit", "100001"], f"{MAX_LIMIT_RANGE}, got '100001'"),
        (["max-limit", "4611686018427387905"], f"{MAX_LIMIT_RANGE}, got '4611686018427387905'"),
        (["max-state-bytes", "-1"], STATE_RANGE),
        (["max-state-bytes", "16777217"], STATE_RANGE),
        (
            ["max-payload-bytes", "16777217"],
            "the load argument max-payload-bytes needs an integer from 0 to 16777216",
        ),
        (["max-result-bytes", "x"], "the load argument max-result-bytes needs an integer from 0 to 16777216"),
        (["max-limit", "5", "max-limit", "6"], "the load argument max-limit is given twice"),
        (["schedule-timer", "maybe"], "the load argument schedule-timer needs yes or no"),
        (["schedule-timer"], "the load argument schedule-timer needs yes or no"),
        (["schedule-timer", "no", "schedule-timer", "no"], "the load argument schedule-timer is given twice"),
    ],
)
def test_bad_load_arguments_are_refused_by_name(
    bare: EmbeddedServer, conn: redis.Redis, module_so: Path, args: list[str], words: str
) -> None:
    log = refused(conn, bare, str(module_so), *args)
    assert f"<emq> not loaded: {words}" in log


def test_a_bad_load_argument_stops_a_server_at_start(module_so: Path) -> None:
    srv = EmbeddedServer(load_module=False, args=["--loadmodule", str(module_so), "max-limt", "5"])
    with pytest.raises(RuntimeError, match="exited at start"):
        srv.start()
    try:
        assert "<emq> not loaded: unknown load argument 'max-limt'" in srv.logfile.read_text()
    finally:
        srv.stop()


def test_load_arguments_set_the_ceilings(bare: EmbeddedServer, conn: redis.Redis, module_so: Path) -> None:
    mark = log_mark(bare)
    conn.execute_command(
        "MODULE", "LOAD", str(module_so), "max-limit", "3", "max-state-bytes", "100",
        "max-payload-bytes", "4", "max-result-bytes", "5",
    )  # fmt: skip
    assert (
        "<emq> settings: max-limit 3, max-state-bytes 100, max-payload-bytes 4, max-result-bytes 5"
        in log_since(bare, mark)
    )
    if supports("module_configs"):
        assert emq_configs(conn) == {
            "emq.max-limit": "3",
            "emq.max-state-bytes": "100",
            "emq.max-payload-bytes": "4",
            "emq.max-result-bytes": "5",
            "emq.schedule-timer": "yes",
        }
    with pytest.raises(redis.ResponseError, match=r"^the payload is larger than emq\.max-payload-bytes$"):
        conn.execute_command("EMQ.ENQUEUE", "emq:{q}:pending", "emq:{q}:", "big", "12345")
    keys = put_lapsed(conn, 5)
    with pytest.raises(redis.ResponseError, match=f"^{LIMIT_ERROR}$"):
        conn.execute_command(*sweep_args(keys, 1, 4))
    assert conn.zcard(keys.active) == 5
    assert len(conn.execute_command(*sweep_args(keys, 9, 3))[0]) == 3

    # A reload starts from the defaults again, not from the last load's values.
    conn.execute_command("MODULE", "UNLOAD", "emq")
    mark = log_mark(bare)
    conn.execute_command("MODULE", "LOAD", str(module_so))
    assert "<emq> settings: max-limit 10000, max-state-bytes 65536" in log_since(bare, mark)


def put_lapsed(conn: redis.Redis, n: int) -> QueueKeys:
    now = server_ms(conn)
    for i in range(n):
        put_active(conn, "q", f"j{i}", attempts=1, deadline=now - 1000 - i)
    return queue_keys("q")
