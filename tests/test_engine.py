"""The engine under test: Redis or Valkey, and what the module found in it.

`make test` runs the suite twice, `--engine redis` then `--engine valkey`;
these tests make sure each run really talks to the engine it names, and that
the module resolved its whole API there (an optional function the server
lacks would be named in the server log with what falls back).
"""

from __future__ import annotations

import pytest
import redis

from echomq.testing import EmbeddedServer


def test_the_selected_engine_is_the_one_running(request: pytest.FixtureRequest, r: redis.Redis) -> None:
    info = r.info("server")
    engine = request.config.getoption("--engine")
    is_valkey = info.get("server_name") == "valkey" or "valkey_version" in info
    if engine == "valkey":
        assert is_valkey, info
        assert int(str(info["valkey_version"]).split(".")[0]) >= 8
    elif engine == "redis":
        assert not is_valkey, info
        assert int(str(info["redis_version"]).split(".")[0]) >= 7


def test_module_loaded_with_every_optional_api(server: EmbeddedServer, r: redis.Redis) -> None:
    assert b"emq" in [m[b"name"] for m in r.module_list()]
    log = server.logfile.read_text(errors="replace")
    assert "<emq> loaded; every optional module API function was found" in log
    assert "falling back" not in log
