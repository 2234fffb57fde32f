"""Real faults for the tests: a stalled server, a frozen one, a restarted one, a half-open connection.

Nothing is simulated: ``stall`` runs DEBUG SLEEP on the server, ``frozen``
sends SIGSTOP/SIGCONT to its process, ``restart`` stops it with SIGTERM (AOF
on: the data is kept) and starts a new one on the same port and directory,
and ``Proxy`` is a TCP proxy in front of a server whose connections can be
made half-open: bytes are accepted and never forwarded, with no FIN or RST,
as a NAT or firewall that dropped its state does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from echomq.testing import EmbeddedServer

from .calibration import budget

AOF = ["--appendonly", "yes", "--appendfsync", "always"]


def pythonpath(*dirs: str | os.PathLike[str]) -> str:
    """PYTHONPATH for a child process: the caller's own first (a test run against another copy of the
    package sets it), then ``dirs``."""
    parts = [os.environ.get("PYTHONPATH", ""), *map(str, dirs)]
    return os.pathsep.join(p for p in parts if p)


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, step: float = 0.01) -> bool:
    """Poll ``predicate`` until it holds, for ``timeout`` seconds as an idle machine counts them.

    The timeout scales with the machine (``calibration.budget``): a worker process that takes
    20 s to start on a loaded machine is no failure of what the test checks.  A wait for
    something that must not happen only watches longer.
    """
    deadline = time.monotonic() + budget(timeout)
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def stall(server: EmbeddedServer, seconds: float) -> threading.Thread:
    """DEBUG SLEEP the server for ``seconds`` from a thread of its own; returns the thread (join it)."""

    def sleep() -> None:
        conn = server.client(socket_timeout=None)
        try:
            conn.execute_command("DEBUG", "SLEEP", str(seconds))
        finally:
            conn.close()

    thread = threading.Thread(target=sleep, name="test-stall", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def frozen(server: EmbeddedServer) -> Iterator[None]:
    """The server's process stopped (SIGSTOP) for the block: connections stay open, nothing answers.

    A server in a container (tests/containers.py) is paused by its engine
    instead: the same to its clients.
    """
    pause = getattr(server, "pause", None)
    if pause is not None:
        pause()
        try:
            yield
        finally:
            server.unpause()  # type: ignore[attr-defined]
        return
    assert server.process is not None
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def restart(
    server: EmbeddedServer, down_for: float = 0.0, on_down: Callable[[], object] | None = None
) -> EmbeddedServer:
    """SIGTERM the server (it flushes its AOF), wait ``down_for``, start it again on the same port and dir.

    ``on_down`` is called once the old process has exited.
    """
    assert server.process is not None and not server._own_dir, "restart needs dir=... (the data must stay)"
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=server.stop_timeout)
    server.process = None
    if on_down is not None:
        on_down()
    time.sleep(down_for)
    server._fixed_port = server.port
    server.start()
    return server


def no_echomq_threads(timeout: float = 2.0) -> list[str]:
    """The echomq threads still alive after ``timeout`` (empty: none left behind)."""

    def left() -> list[str]:
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("echomq-"))

    wait_until(lambda: not left(), timeout)
    return left()


class Proxy:
    """A TCP proxy to ``port``; ``blackhole()`` makes every connection open so far half-open.

    After ``blackhole()`` those connections still accept bytes (the kernel
    ACKs them) but nothing is forwarded either way and nothing is closed:
    a client reading a reply waits for ever, or until its own timeout.
    Connections opened later work.

    Four hooks see each chunk as it passes: ``hold_reply(data)`` returns how
    long to hold a chunk from the server (a slow network), ``hold_request(data)``
    the same for a chunk from the client, ``lose_reply(data)`` True drops one
    (a message lost on the way: ``lost`` counts them), and
    ``reset_request(data)`` True closes the connection instead of
    forwarding a chunk from the client (a reset: ``resets`` counts them).
    ``held_replies`` and ``held_requests`` count the chunks held a nonzero
    time: a fault test asserts its fault fired, so that a refactor cannot
    turn it into a happy-path one (``dropped``, ``lost``, ``refused`` too).

    ``drop()`` closes every connection open so far (the server sees its
    clients leave); while ``refuse`` is True a new connection is closed as
    soon as it is accepted (``refused`` counts them): the server is out of
    reach, as when it restarts or the network is down.
    """

    def __init__(self, port: int) -> None:
        self.target = port
        self.generation = 0
        self.dropped = 0
        self.hold_reply: Callable[[bytes], float] | None = None
        self.hold_request: Callable[[bytes], float] | None = None
        self.reset_request: Callable[[bytes], bool] | None = None
        self.lose_reply: Callable[[bytes], bool] | None = None
        self.lost = 0
        self.resets = 0
        self.held_replies = 0
        self.held_requests = 0
        self.refuse = False
        self.refused = 0
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="test-proxy", daemon=True).start()

    def blackhole(self) -> None:
        self.generation += 1
        self.dropped = 0  # bytes from a client its half-open connections swallowed since

    def drop(self) -> None:
        """Close every connection open so far, both ways."""
        sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
                if self.refuse:
                    self.refused += 1
                    client.close()
                    continue
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                if self._closed:
                    return
                continue
            self._sockets += [client, upstream]
            gen = self.generation
            for a, b, up in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(
                    target=self._pump, args=(a, b, gen, up), name="test-proxy-pump", daemon=True
                ).start()

    def _pump(self, a: socket.socket, b: socket.socket, generation: int, up: bool) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    if self.generation == generation:
                        b.shutdown(socket.SHUT_WR)
                    return
                if self.generation != generation:  # after blackhole(): dropped on the floor
                    if up:
                        self.dropped += len(data)
                    continue
                if up and self.reset_request is not None and self.reset_request(data):
                    self.resets += 1
                    for s in (a, b):
                        with contextlib.suppress(OSError):
                            s.close()
                    return
                if not up and self.lose_reply is not None and self.lose_reply(data):
                    self.lost += 1
                    continue
                hold = self.hold_request if up else self.hold_reply
                if hold is not None and (seconds := hold(data)) > 0:
                    if up:
                        self.held_requests += 1
                    else:
                        self.held_replies += 1
                    time.sleep(seconds)
                b.sendall(data)
        except OSError:
            return


def server_log_has(server: EmbeddedServer, text: str) -> bool:
    return text in Path(server.logfile).read_text(errors="replace")


def pooled_connections(client: Any) -> list[object]:
    """Every connection the client's pools hold (redis-py's and the worker's own subscribers')."""
    pools = []
    r = client.redis
    if isinstance(r, redis.Redis):
        pools.append(r.connection_pool)
    else:  # a cluster client: each node's
        pools += [node.redis_connection.connection_pool for node in r.get_nodes() if node.redis_connection]
    own = getattr(client, "_pool", None)
    if own is not None and own._subscribers is not None:
        pools.append(own._subscribers)
    found: list[object] = []
    for pool in pools:
        found += [*pool._available_connections, *pool._in_use_connections]  # type: ignore[union-attr]
    return found


def cut_connections(client: Any) -> list[object]:
    """Connections left with a stop's 1 ms cut: the next command on one times out under load."""
    return [
        c
        for c in pooled_connections(client)
        if min(getattr(c, "socket_timeout", None) or 1.0, getattr(c, "socket_connect_timeout", None) or 1.0)
        < 0.01
    ]
