"""A master, its replicas and three Sentinels of real servers (no fixtures here).

The failover tests need what an operator runs: replicas that a Sentinel
promotes when the master dies, and clients that follow the promotion by
asking the Sentinels (redis-py's `redis.sentinel.Sentinel`).  Sentinel is
the server binary in sentinel mode (`redis-server sentinel.conf
--sentinel`, and the same for valkey-server), started here with a
configuration file of its own in a temporary directory.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.sentinel import Sentinel

from echomq.testing import EmbeddedServer, server_binary

from .clusters import free_port, wait_for
from .conftest import ServerFactory

MASTER = "echomq"
FAST_SYNC = ["--repl-diskless-sync-delay", "0"]


@dataclass
class SentinelProcess:
    port: int
    dir: Path
    process: subprocess.Popen[bytes]

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_sentinel(
    master: EmbeddedServer, quorum: int, down_after_ms: int, failover_timeout_ms: int = 5000
) -> SentinelProcess:
    directory = Path(tempfile.mkdtemp(prefix="echomq-sentinel-"))
    port = free_port()
    conf = directory / "sentinel.conf"
    conf.write_text(
        f"port {port}\n"
        "bind 127.0.0.1\n"
        f"dir {directory}\n"
        f"logfile {directory / 'sentinel.log'}\n"
        f"sentinel monitor {MASTER} {master.host} {master.port} {quorum}\n"
        f"sentinel down-after-milliseconds {MASTER} {down_after_ms}\n"
        f"sentinel failover-timeout {MASTER} {failover_timeout_ms}\n"
        f"sentinel parallel-syncs {MASTER} 1\n"
    )
    process = subprocess.Popen(
        [server_binary(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    sentinel = SentinelProcess(port, directory, process)

    def answers() -> bool:
        try:
            return bool(sentinel.client().ping())
        except redis.exceptions.ConnectionError:
            return False

    wait_for(answers, f"sentinel on {port} answers", timeout=10)
    return sentinel


@dataclass
class Failover:
    """A master with replicas, watched by Sentinels."""

    servers: list[EmbeddedServer]
    sentinels: list[SentinelProcess] = field(default_factory=list)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def sentinel(self, **kwargs: object) -> Sentinel:
        return Sentinel(self.addresses, socket_timeout=1, **kwargs)

    def master_client(self, **kwargs: object) -> redis.Redis:
        """A client that follows the master the Sentinels name."""
        return self.sentinel().master_for(MASTER, **kwargs)

    def master_port(self) -> int:
        _host, port = self.sentinel().discover_master(MASTER)
        return int(port)

    def master_server(self) -> EmbeddedServer:
        port = self.master_port()
        return next(s for s in self.servers if s.port == port)

    def kill_master(self) -> EmbeddedServer:
        """SIGKILL the master: its last writes may never reach a replica."""
        master = self.master_server()
        assert master.process is not None
        master.process.kill()
        master.process.wait()
        return master

    def wait_for_new_master(self, old_port: int, timeout: float = 30.0) -> int:
        def promoted() -> bool:
            try:
                port = self.master_port()
            except redis.exceptions.RedisError:
                return False
            if port == old_port:
                return False
            role = next(s for s in self.servers if s.port == port).client().execute_command("ROLE")[0]
            return role == b"master"

        wait_for(promoted, "the Sentinels promote a replica", timeout=timeout)
        return self.master_port()

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()


def start_failover(
    server_factory: ServerFactory,
    replicas: int = 2,
    down_after_ms: int = 400,
    failover_timeout_ms: int = 5000,
    **server_options: object,
) -> Failover:
    """A master, ``replicas`` replicas and three Sentinels (quorum 2); ``server_options`` for each server."""
    master = server_factory(FAST_SYNC, **server_options)
    servers = [master]
    for _ in range(replicas):
        servers.append(
            server_factory([*FAST_SYNC, "--replicaof", master.host, str(master.port)], **server_options)
        )
    m = master.client()

    def replicas_online() -> bool:
        return int(m.info("replication").get("connected_slaves", 0)) == replicas

    wait_for(replicas_online, "replicas connected")
    failover = Failover(servers)
    failover.sentinels = [start_sentinel(master, 2, down_after_ms, failover_timeout_ms) for _ in range(3)]

    def sentinels_see_everyone() -> bool:
        for s in failover.sentinels:
            c = s.client()
            known = c.execute_command("SENTINEL", "REPLICAS", MASTER)
            others = c.execute_command("SENTINEL", "SENTINELS", MASTER)
            if len(known) < replicas or len(others) < len(failover.sentinels) - 1:
                return False
        return True

    wait_for(sentinels_see_everyone, "sentinels know the replicas and each other", timeout=30)
    return failover


def poll(predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False
