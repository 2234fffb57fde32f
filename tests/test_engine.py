"""The engine under test, and what the module found in it.

`make test` runs the suite on Redis 7.0 and Valkey 8, and its smoke subset on
Redis 6.2 and Valkey 9 (`--engine redis|valkey|redis62|valkey9`).  These
tests make sure each run really talks to the engine it names, and that the
module found exactly the optional API the engines table (docs/reference/engines.md) says that
engine has: each function it lacks is named in the server log with what
falls back, and nothing else is.
"""

from __future__ import annotations

import re

import pytest
import redis

from echomq.testing import EmbeddedServer

from . import containers
from .conftest import FEATURE_FUNCTIONS, FEATURES, engine_version, supports

EXPECTED = {
    "redis": ("redis", 7, 0),
    "valkey": ("valkey", 8, None),
    "redis62": ("redis", 6, 2),
    "valkey9": ("valkey", 9, None),
}


def test_the_selected_engine_is_the_one_running(request: pytest.FixtureRequest, r: redis.Redis) -> None:
    info = r.info("server")
    engine = request.config.getoption("--engine")
    is_valkey = info.get("server_name") == "valkey" or "valkey_version" in info
    version = str(info["valkey_version"] if is_valkey else info["redis_version"])
    assert engine_version() == ("valkey" if is_valkey else "redis", tuple(int(x) for x in version.split(".")))
    if engine is None or containers.selected():  # a container's server is the image's, whatever --engine
        return
    name, major, minor = EXPECTED[engine]
    assert (name == "valkey") == is_valkey, info
    assert int(version.split(".")[0]) == major, info
    if minor is not None:
        assert int(version.split(".")[1]) == minor, info


def test_module_finds_what_the_engines_table_says(server: EmbeddedServer, r: redis.Redis) -> None:
    assert b"emq" in [m[b"name"] for m in r.module_list()]
    log = server.logfile.read_text(errors="replace")
    missing = set(re.findall(r"<emq> this server has no RedisModule_(\w+); falling back: \S", log))
    expected = set().union(*(FEATURE_FUNCTIONS[f] for f in FEATURES if not supports(f)))
    assert missing == expected
    if not expected:
        assert "<emq> loaded; every optional module API function was found" in log
    assert "<emq> settings: max-limit 10000, max-state-bytes 65536" in log
