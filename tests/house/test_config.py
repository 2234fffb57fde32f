"""The operator's ceilings as module configs (Redis 7.0+, Valkey).

`emq.max-limit`, `emq.max-state-bytes`, `emq.max-payload-bytes` and
`emq.max-result-bytes` are `CONFIG GET/SET`-able,
`CONFIG REWRITE` writes them back, and they can be given in the config file,
on the command line or with `MODULE LOADEX ... CONFIG`; a load argument is
the value at load where none of those gives one.  SWEEP reads
`emq.max-limit` on every call: a larger <limit> is refused, writing
nothing, whatever the client.  (Redis 6.2 has no module configs: there the
load arguments are the settings, tests/workers/test_load.py.)
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, server_binary, server_wrapper

from ..conftest import ServerFactory, module_command_args, needs
from ..helpers import digest, emq_configs, now_ms, put_active, sweep_args

pytestmark = [
    needs("module_configs", "the settings are load arguments only (tests/workers/test_load.py)"),
    pytest.mark.smoke,
    pytest.mark.memcheck,
]

DEFAULTS = {
    "emq.max-limit": "10000",
    "emq.max-state-bytes": "65536",
    "emq.max-payload-bytes": "1048576",
    "emq.max-result-bytes": "1048576",
    "emq.schedule-timer": "yes",
}


def lapsed(r: redis.Redis, n: int) -> None:
    now = now_ms(r)
    for i in range(n):
        put_active(r, "q", f"j{i}", attempts=1, deadline=now - 1000 - i)


def test_defaults(r: redis.Redis) -> None:
    assert emq_configs(r) == DEFAULTS


def test_config_set_lowers_the_ceiling_sweep_obeys(r: redis.Redis) -> None:
    keys = queue_keys("q")
    lapsed(r, 6)
    try:
        r.config_set("emq.max-limit", 5)
        assert emq_configs(r)["emq.max-limit"] == "5"
        before = digest(r)
        with pytest.raises(redis.ResponseError, match=r"^limit exceeds the server's emq\.max-limit$"):
            r.execute_command(*sweep_args(keys, 9, 6))
        assert digest(r) == before
        # At the ceiling it runs; <limit> 5 takes five of the six.
        assert len(r.execute_command(*sweep_args(keys, 9, 5))[0]) == 5
        r.config_set("emq.max-limit", 100_000)
        assert len(r.execute_command(*sweep_args(keys, 9, 100_000))[0]) == 1
    finally:
        r.config_set("emq.max-limit", 10_000)


def test_the_default_ceiling_refuses_the_issues_sweep(r: redis.Redis) -> None:
    keys = queue_keys("q")
    lapsed(r, 3)
    with pytest.raises(redis.ResponseError, match=r"emq\.max-limit"):
        r.execute_command(*sweep_args(keys, 9, 200_000))
    assert len(r.execute_command(*sweep_args(keys, 9, 10_000))[0]) == 3


@pytest.mark.parametrize(
    ("name", "value"),
    [("emq.max-limit", "0"), ("emq.max-limit", "-1"), ("emq.max-limit", "x"), ("emq.max-state-bytes", "-1"),
     ("emq.max-state-bytes", "1gb"), ("emq.no-such", "1"),
     # above the ceilings the verbs are tested at (issue 28: a max-limit of 2^62 + 1 let ENQUEUEMANY
     # overflow its count and crash the server)
     ("emq.max-limit", "100001"), ("emq.max-limit", "4611686018427387905"),
     ("emq.max-limit", "9223372036854775807"), ("emq.max-state-bytes", "16777217"),
     ("emq.max-payload-bytes", "-1"), ("emq.max-payload-bytes", "16777217"), ("emq.max-result-bytes", "17mb"),
     ("emq.max-result-bytes", "x"), ("emq.schedule-timer", "maybe"), ("emq.schedule-timer", "2")],
)  # fmt: skip
def test_bad_values_are_refused(r: redis.Redis, name: str, value: str) -> None:
    with pytest.raises(redis.ResponseError):
        r.config_set(name, value)
    assert emq_configs(r) == DEFAULTS


def test_the_ceilings_are_named_in_the_refusal(r: redis.Redis) -> None:
    """The server's own words: which config, and the range it takes."""
    with pytest.raises(redis.ResponseError, match=r"emq\.max-limit.*between 1 and 100000 inclusive"):
        r.config_set("emq.max-limit", 100_001)
    for name in ("emq.max-state-bytes", "emq.max-payload-bytes", "emq.max-result-bytes"):
        with pytest.raises(redis.ResponseError, match=rf"{name}.*between 0 and 16777216 inclusive"):
            r.config_set(name, "17mb")
    try:
        r.config_set("emq.max-limit", 100_000)
        for name in ("emq.max-state-bytes", "emq.max-payload-bytes", "emq.max-result-bytes"):
            r.config_set(name, "16mb")
        assert emq_configs(r) == {
            "emq.max-limit": "100000",
            "emq.max-state-bytes": "16777216",
            "emq.max-payload-bytes": "16777216",
            "emq.max-result-bytes": "16777216",
            "emq.schedule-timer": "yes",
        }
    finally:
        for name, value in DEFAULTS.items():
            r.config_set(name, value)


def test_state_bytes_take_memory_units(r: redis.Redis) -> None:
    try:
        r.config_set("emq.max-state-bytes", "1kb")
        assert emq_configs(r)["emq.max-state-bytes"] == "1024"
    finally:
        r.config_set("emq.max-state-bytes", 65536)


@contextmanager
def server_from_file(conf: Path, where: Path) -> Iterator[redis.Redis]:
    """A server started as `<server> <conf> --port ...`: the config file must
    be its first argument, which echomq.testing.EmbeddedServer does not do, and
    CONFIG REWRITE needs one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    wrapper = server_wrapper()
    cmd = [*wrapper, server_binary(), str(conf), "--port", str(port), "--bind", "127.0.0.1"]
    cmd += ["--dir", str(where), "--logfile", str(where / "server.log"), "--save", ""]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, decode_responses=True)
    try:
        deadline = time.monotonic() + (120 if wrapper else 10)
        while True:
            assert proc.poll() is None, (where / "server.log").read_text()
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=120 if wrapper else 10)


def test_config_file_values_and_rewrite_round_trip(tmp_path: Path, module_so: Path) -> None:
    conf = tmp_path / "emq.conf"
    # A load argument is the value at load; the file's line overrides it.
    conf.write_text(
        f"loadmodule {module_so} max-limit 77 max-state-bytes 1000 max-payload-bytes 5000\n"
        "emq.max-limit 123\nemq.max-result-bytes 7\n"
    )
    with server_from_file(conf, tmp_path) as c:
        assert emq_configs(c) == {
            "emq.max-limit": "123",
            "emq.max-state-bytes": "1000",
            "emq.max-payload-bytes": "5000",
            "emq.max-result-bytes": "7",
            "emq.schedule-timer": "yes",
        }
        c.config_set("emq.max-limit", 456)
        c.config_set("emq.max-state-bytes", "2mb")
        c.config_set("emq.max-payload-bytes", "1mb")
        c.config_rewrite()
    text = conf.read_text()
    assert "emq.max-limit 456" in text and "emq.max-state-bytes 2mb" in text
    assert "emq.max-payload-bytes 1mb" in text and "emq.max-result-bytes 7" in text
    with server_from_file(conf, tmp_path) as c:
        assert emq_configs(c) == {
            "emq.max-limit": "456",
            "emq.max-state-bytes": "2097152",
            "emq.max-payload-bytes": "1048576",
            "emq.max-result-bytes": "7",
            "emq.schedule-timer": "yes",
        }


def test_command_line_and_loadex(server_factory: ServerFactory, module_so: Path) -> None:
    srv = server_factory(["--emq.max-limit", "42"])
    c = srv.client()
    assert emq_configs(c)["emq.max-limit"] == "42"
    c.close()
    bare = server_factory(module_command_args(), load_module=False)
    c = bare.client()
    c.execute_command(
        "MODULE", "LOADEX", str(module_so), "CONFIG", "emq.max-limit", "9", "ARGS", "max-limit", "8"
    )
    assert emq_configs(c)["emq.max-limit"] == "9"
    c.close()


def test_a_bad_value_in_the_config_file_stops_the_server_and_says_why(
    tmp_path: Path, module_so: Path
) -> None:
    srv = EmbeddedServer(["--emq.max-limit", "0"], module=module_so, dir=tmp_path)
    with pytest.raises(RuntimeError, match="exited at start"):
        srv.start()
    log = srv.logfile.read_text()
    assert "emq.max-limit" in log
    assert "<emq> not loaded: a value given for an emq.* config was refused" in log
