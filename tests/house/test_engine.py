"""The engine under test, and what the module found in it.

`make test` runs the suite on Redis 7.0 and Valkey 8, and its smoke subset on
Redis 6.2, Valkey 9 and Redis 8 (`--engine redis|valkey|redis62|valkey9|redis8`).  These
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

from .. import containers
from ..conftest import FEATURE_FUNCTIONS, FEATURES, engine_version, supports

pytestmark = pytest.mark.smoke

EXPECTED = {
    "redis": ("redis", 7, 0),
    "valkey": ("valkey", 8, None),
    "redis62": ("redis", 6, 2),
    "valkey9": ("valkey", 9, None),
    "redis8": ("redis", 8, None),
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


# The features that are the server's own commands rather than module API functions, and a
# command each brings: the table must say what the server really has.
FEATURE_COMMANDS = {"script_flags": "FUNCTION", "waitaof": "WAITAOF", "hash_field_expiry": "HPEXPIRE"}


def test_the_features_table_names_the_commands_the_engine_has(r: redis.Redis) -> None:
    assert set(FEATURE_COMMANDS) == {f for f, functions in FEATURE_FUNCTIONS.items() if not functions}
    for feature, command in FEATURE_COMMANDS.items():
        try:
            r.execute_command(command)  # no arguments: an arity error where the command exists
        except redis.ResponseError as exc:
            has = "unknown command" not in str(exc).lower()
        else:
            raise AssertionError(f"{command} with no arguments was accepted")
        assert has == supports(feature), f"{feature}: the engine {'has' if has else 'lacks'} {command}"
