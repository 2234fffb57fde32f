"""Persistence: the AOF and the RDB hold exactly what the master held.

The module never writes EMQ.* to the AOF: it propagates its effects as
plain ZADD/ZREM/HSET with absolute values, so a server replaying the AOF
reads no clock of its own and ends with the master's data to the bit
(same DEBUG DIGEST).  The RDB holds plain sorted sets and hashes, so a
DEBUG RELOAD, or a fresh server loading the dump, gives the same digest.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import pytest
import redis

from ..conftest import ServerFactory
from ..helpers import digest
from ..traffic import assert_covers_everything, run_traffic

QUEUES = ["alpha", "beta", "gamma"]


def wait_for_rewrite(r: redis.Redis, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = r.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            assert info["aof_last_bgrewrite_status"] == "ok"
            return
        time.sleep(0.05)
    raise TimeoutError("BGREWRITEAOF did not finish")


@pytest.mark.slow
def test_fresh_server_replaying_the_aof_has_the_masters_digest(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    master_dir, replay_dir = tmp_path / "master", tmp_path / "replay"
    master_dir.mkdir()
    master = server_factory(["--appendonly", "yes", "--appendfsync", "always"], dir=master_dir)
    m = master.client()
    rng = random.Random(11)
    seen = run_traffic(m, rng, QUEUES[:2], ops=150)
    # Half the history in the rewritten base file, half in the increment.
    m.bgrewriteaof()
    wait_for_rewrite(m)
    seen += run_traffic(m, rng, QUEUES[2:], ops=150)
    assert_covers_everything(seen)
    expected = digest(m)
    assert m.dbsize() > 0
    m.close()
    master.stop()  # a clean shutdown: everything is in the AOF

    aof_files = list((master_dir / "appendonlydir").glob("*.aof"))
    assert any(".incr." in f.name for f in aof_files), aof_files
    for f in aof_files:  # effects only: no EMQ.* to re-run against another clock
        assert b"EMQ." not in f.read_bytes().upper(), f

    shutil.copytree(master_dir, replay_dir)
    replay = server_factory(["--appendonly", "yes"], dir=replay_dir)
    r = replay.client()
    assert r.info("persistence")["aof_enabled"] == 1
    assert digest(r) == expected
    r.close()


@pytest.mark.slow
def test_debug_reload_and_a_fresh_server_loading_the_rdb_keep_the_digest(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    master_dir, fresh_dir = tmp_path / "master", tmp_path / "fresh"
    master_dir.mkdir()
    master = server_factory(dir=master_dir)
    m = master.client()
    seen = run_traffic(m, random.Random(12), QUEUES, ops=250)
    assert_covers_everything(seen)
    expected = digest(m)

    m.execute_command("DEBUG", "RELOAD")  # save the RDB, flush, load it back
    assert digest(m) == expected
    m.close()
    master.stop()

    fresh_dir.mkdir()
    shutil.copy2(master_dir / "dump.rdb", fresh_dir / "dump.rdb")
    fresh = server_factory(dir=fresh_dir)
    f = fresh.client()
    assert f.dbsize() > 0
    assert digest(f) == expected
    f.close()
