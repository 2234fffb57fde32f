"""Redis Clusters of real servers for the tests (no fixtures here: see the test files).

`start_cluster` starts N nodes with the module loaded and joins them with
the engine's own `redis-cli --cluster create` (or valkey-cli), the tool an
operator uses; `owner` asks the nodes which one serves a key.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import pytest
from redis.cluster import key_slot

from echomq.testing import EmbeddedServer

from .conftest import ServerFactory, engine_cli


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"cluster: {what}")


def start_node(server_factory: ServerFactory, load_module: bool = True) -> EmbeddedServer:
    # The bus port is given, not port + 10000, which does not exist for a high
    # ephemeral port; if someone takes it first, try again with another.
    for attempt in range(3):
        try:
            return server_factory(
                [
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-port", str(free_port()),
                    "--cluster-node-timeout", "5000",
                ],
                load_module=load_module,
            )  # fmt: skip
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def cluster_cli() -> str:
    cli = engine_cli()
    if cli is None:
        pytest.skip("no redis-cli/valkey-cli beside the server binary: cannot run --cluster create")
    return cli


def start_cluster(
    server_factory: ServerFactory, nodes: int = 3, load_module: bool = True, replicas: int = 0
) -> list[EmbeddedServer]:
    """N nodes, every slot served, every node agreeing that the cluster is ok (with the module,
    or without it: a cluster for the scripts backend); with ``replicas``, that many replicas of
    each master among the N (``redis-cli --cluster create --cluster-replicas``)."""
    cli = cluster_cli()
    started = [start_node(server_factory, load_module) for _ in range(nodes)]
    addresses = [f"{n.host}:{n.port}" for n in started]
    done = subprocess.run(
        [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas), "--cluster-yes"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    conns = [n.client() for n in started]

    def all_ok() -> bool:
        for c in conns:
            info = c.execute_command("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text or f"cluster_known_nodes:{nodes}" not in text:
                return False
        return True

    wait_for(all_ok, "state ok on every node")
    for c in conns:
        c.close()
    return started


def owner(nodes: list[EmbeddedServer], key: str | bytes) -> EmbeddedServer:
    """The node that serves `key`, asked of the nodes themselves."""
    slot = key_slot(key.encode() if isinstance(key, str) else key)
    probe = nodes[0].client()
    try:
        for start, end, master, *_ in probe.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                port = int(master[1])
                return next(n for n in nodes if n.port == port)
    finally:
        probe.close()
    raise AssertionError(f"no node serves slot {slot}")


def owner_and_another(nodes: list[EmbeddedServer], key: str | bytes) -> tuple[EmbeddedServer, EmbeddedServer]:
    """The node that serves `key`, and another master: the two ends of a move of its slot."""
    source = owner(nodes, key)
    return source, next(n for n in nodes if n is not source)


def node_id(node: EmbeddedServer) -> str:
    c = node.client()
    try:
        value = c.execute_command("CLUSTER", "MYID")
        return value.decode() if isinstance(value, bytes) else str(value)
    finally:
        c.close()


def queue_in_slot(slot: int, prefix: str = "q") -> str:
    """A queue name whose keys hash to `slot`."""
    for i in range(10_000_000):
        name = f"{prefix}{i}"
        if key_slot(name.encode()) == slot:
            return name
    raise AssertionError(f"no queue name for slot {slot}")


def flush(nodes: list[EmbeddedServer]) -> None:
    """Empty every node, so that a node's DEBUG DIGEST covers one test's keys and nothing else.

    A test that says "this call wrote nothing" compares a node's digest before and after it;
    keys an earlier test of the module left behind expire by their own clock (a claim's
    request record lives as long as its lease: 1 s in the tests above), and one that expires
    between the two digests changes it though the call wrote nothing.  An idle machine runs
    the next test within that second, a loaded one does not.
    """
    for node in nodes:
        c = node.client()
        try:
            c.flushall()
        finally:
            c.close()
