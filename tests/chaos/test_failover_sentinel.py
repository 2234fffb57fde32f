"""A failover the Sentinels run: the clients follow the new master, fencing holds."""

from __future__ import annotations

import pytest

import echomq
from echomq.keyspace import queue_keys

from ..conftest import ServerFactory
from ..sentinels import start_failover

pytestmark = pytest.mark.slow
Q = queue_keys("q")


def test_sentinel_failover_promotes_a_replica_and_the_client_follows(server_factory: ServerFactory) -> None:
    failover = start_failover(server_factory)
    try:
        client = echomq.Client(failover.master_client(socket_timeout=1))
        client.enqueue("q", b"x", job_id="j")
        old = failover.master_port()
        client.redis.execute_command("WAIT", 2, 2000)
        failover.kill_master()
        new = failover.wait_for_new_master(old)
        assert new != old
        job = client.claim("q", lease_ms=60_000)  # through the Sentinels, on the new master
        assert job is not None and job.id == "j"
        client.complete("q", job.id, job.token)
        assert client.job("q", "j") is not None
    finally:
        failover.stop()
