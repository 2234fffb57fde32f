"""Development tools: a throwaway redis-server with the emq module loaded.

For tests, scripts, the demo and the benchmark, not for production (there,
load ``echomq.module_path()`` into a server you run):

    from echomq.testing import EmbeddedServer

    with EmbeddedServer() as server:
        client = echomq.Client(server.client())
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._module_so import module_path
from .keyspace import QueueKeys, queue_keys

__all__ = ["EmbeddedServer", "queue_problems", "server_binary", "server_wrapper"]


def server_binary() -> str:
    """The server to start: ``$ECHOMQ_SERVER_BIN``, else ``redis-server`` on PATH."""
    name = os.environ.get("ECHOMQ_SERVER_BIN") or "redis-server"
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found; install it (Debian: apt-get install redis-server) or set ECHOMQ_SERVER_BIN"
        )
    return found


def server_wrapper() -> list[str]:
    """A command to run the server under, from ``$ECHOMQ_SERVER_WRAPPER``.

    E.g. ``valgrind --log-file=/tmp/vg.%p.log``: every server this package
    starts runs as ``<wrapper...> redis-server ...``.  Empty when unset.
    """
    return shlex.split(os.environ.get("ECHOMQ_SERVER_WRAPPER", ""))


def _pid_answering(probe: redis.Redis) -> int | None:
    """The pid of the server answering ``probe`` (None when nothing that speaks RESP answers)."""
    try:
        return int(probe.info("server")["process_id"])
    except (redis.exceptions.RedisError, KeyError, ValueError):
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedServer:
    """A redis-server child process on a free loopback port, with emq.so loaded.

    ``port`` fixes the port (default: a free one).  ``args`` are extra server
    options (``["--appendonly", "yes"]``).  The server's files live in a
    temporary directory removed on ``stop()`` unless ``dir`` is given.
    ``wrapper`` prefixes the server command (a memory checker); it defaults
    to ``$ECHOMQ_SERVER_WRAPPER``, and a wrapped server gets
    ``wrapped_timeout`` seconds to start and to stop, since a checker both
    slows it down and writes its report at exit.
    """

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        module: str | os.PathLike[str] | None = None,
        binary: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        load_module: bool = True,
        startup_timeout: float = 10.0,
        port: int | None = None,
        wrapper: Sequence[str] | None = None,
        wrapped_timeout: float = 120.0,
    ) -> None:
        self.args = list(args)
        self._fixed_port = port
        self.module: Path | None = None
        if load_module:
            self.module = Path(module) if module else module_path()
        self.binary = binary or server_binary()
        self._own_dir = dir is None
        self.dir = Path(dir) if dir else Path(tempfile.mkdtemp(prefix="echomq-server-"))
        self.wrapper = list(wrapper) if wrapper is not None else server_wrapper()
        self.startup_timeout = max(startup_timeout, wrapped_timeout) if self.wrapper else startup_timeout
        self.stop_timeout = wrapped_timeout if self.wrapper else 10.0
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def logfile(self) -> Path:
        return self.dir / "server.log"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new redis-py client for this server."""
        return redis.Redis(host=self.host, port=self.port, **kwargs)

    def start(self) -> EmbeddedServer:
        """Start the server and wait until it answers; RuntimeError (with the server's own words) if not.

        Success means this very process answers on the port: a port someone
        else's server already holds is reported as taken, never used.
        """
        last_error: Exception | None = None
        if self._fixed_port is not None:
            try:
                self._start_once(self._fixed_port)
                return self
            except _PortTaken as exc:
                raise RuntimeError(f"port {self._fixed_port} is taken: {exc}") from None
        for _ in range(5):  # a free port can be taken by someone else before we bind it
            try:
                self._start_once(_free_port())
                return self
            except _PortTaken as exc:
                last_error = exc
        raise RuntimeError(f"could not start {self.binary}: {last_error}")

    def _start_once(self, port: int) -> None:
        cmd = [
            *self.wrapper,
            self.binary,
            "--port",
            str(port),
            "--bind",
            self.host,
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(self.logfile),
        ]
        if self.module is not None:
            cmd += ["--loadmodule", str(self.module)]
        cmd += self.args
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.port = port
        deadline = time.monotonic() + self.startup_timeout
        # One try per probe (redis-py would retry ten times): this loop is the retry.
        probe = self.client(socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
        other: int | None = None  # the pid of a server that answered on our port and is not ours
        try:
            while True:
                if self.process.poll() is not None:
                    log = self.log_tail()
                    self.process = None
                    if "Address already in use" in log:
                        said = _server_says(log, "Address already in use")
                        if other is None:  # ours gave up before the first probe: ask who is there
                            other = _pid_answering(probe)
                        owner = f" (pid {other} answers there)" if other is not None else ""
                        raise _PortTaken(f"{said}{owner}")
                    raise RuntimeError(f"{self.binary} exited at start: {_server_says(log)}\n{log}")
                try:
                    if probe.ping():
                        pid = int(probe.info("server")["process_id"])
                        if self._is_ours(pid):
                            return
                        other = pid  # not ours: ours is about to fail to bind, or still loading
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    # Not up yet (loading, refusing; under a memory checker it can take longer than
                    # the probe's 1 s to answer), or something that is not a server holds the port.
                    pass
                if time.monotonic() > deadline:
                    log = self.log_tail()  # before stop() removes the directory
                    self.stop()
                    if other is not None:
                        raise _PortTaken(f"another server (pid {other}) answers on port {port}")
                    said = _server_says(log)
                    raise RuntimeError(f"{self.binary} did not answer PING on port {port}: {said}")
                time.sleep(0.02)
        finally:
            probe.close()

    def _is_ours(self, pid: int) -> bool:
        """The server answering is the process we started (or, under a wrapper, one of its children)."""
        proc = self.process
        if proc is None:
            return False
        seen = 0
        while pid > 1 and seen < 8:
            if pid == proc.pid:
                return True
            try:  # Linux: the parent is the 4th field of /proc/<pid>/stat, after the ")" of the name
                stat = Path(f"/proc/{pid}/stat").read_text()
                pid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return False
            seen += 1
        return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.logfile.read_text(errors="replace")
        except OSError:
            text = ""
        if self.process is not None and self.process.stderr is not None and self.process.poll() is not None:
            text += self.process.stderr.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server (without saving) and remove its files."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _PortTaken(RuntimeError):
    pass


def _server_says(log: str, needle: str = "") -> str:
    """The server's own line about what went wrong: one containing ``needle``, else its last warning."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if needle and needle in line:
            return line
    for line in reversed(lines):
        if " # " in line:  # the server's warning lines
            return line
    return lines[-1] if lines else "(the server wrote no log)"


def queue_problems(r: redis.Redis, queue: str, *, batch: int = 1000) -> list[str]:
    """Where ``queue`` breaks the invariants every EMQ.* verb keeps; [] when it holds.

    - every member of ``priority`` and ``delayed`` has a row that says
      pending, every member of ``active`` and ``dead`` one that says active
      and dead (so no id is in two of them); a member of ``priority`` is at
      its row's level;
    - every row that says pending waits somewhere: in ``delayed``, in its
      group's lane ``g:<g>`` (a row with a ``group``), in ``priority`` (a
      row with a level), else in the list ``pending`` (its lane) -- a row
      edited to a level while its id is in the list waits in no lane: the
      claims drop that entry as a tombstone; one that says active or dead
      is in that set; a ``done`` or ``cancelled`` row is in
      none; a row in any other state (or none) is in no lane;
    - ``meta``'s ``stale`` counts the list's tombstones exactly: the list's
      length less the pending jobs that wait in it (when it is short, the
      entries without a row are named: a member added by hand);
    - no unique key is an orphan: every ``unique:<key>`` without an expiry
      (UNTIL done) names a job whose row says pending or active
      (docs/concepts/unique.md);
    - every group whose lane holds a job is in the ring ``groups`` once, with
      ``ring`` 1 in ``group:<g>`` (and every group in the ring has it), unless
      it is paused or has as many jobs active as its ``max`` (EMQ.GROUPLIMIT):
      then it is not in the ring; the ring holds the empty name once;
    - every group's ``active`` count equals the number of its jobs in
      ``active`` (docs/concepts/flow-control.md, "Groups").

    Reads every member and every row (SCAN, ZSCAN, LRANGE, pipelined in
    ``batch``es): a tool for tests and benchmarks, not for a busy production
    queue.
    """
    keys = queue_keys(queue)
    sets = {"priority": keys.priority, "delayed": keys.delayed, "active": keys.active, "dead": keys.dead}
    states = {"priority": "pending", "delayed": "pending", "active": "active", "dead": "dead"}
    problems: list[str] = []
    lane_pattern = "".join("\\" + c if c in "\\*?[]" else c for c in keys.base) + "g:*"
    lane_prefix = len(keys.base.encode()) + 2
    lanes = sorted(r.scan_iter(match=lane_pattern, count=batch))
    for lane in lanes:
        name = "g:" + lane[lane_prefix:].decode("utf-8", "surrogateescape")
        sets[name], states[name] = lane.decode("utf-8", "surrogateescape"), "pending"
    problems += _ring_problems(r, keys.base, [lane[lane_prefix:] for lane in lanes if r.zcard(lane)])
    where: dict[bytes, list[str]] = {}
    levels: dict[bytes, int] = {}
    for name, key in sets.items():
        for member, score in r.zscan_iter(key, count=batch):
            where.setdefault(member, []).append(name)
            if name == "priority" or name.startswith("g:"):
                levels[member] = int(score) // 2**42 - 1024
    listed = r.lrange(keys.pending, 0, -1) if r.type(keys.pending) == b"list" else []
    entries = [e if isinstance(e, bytes) else e.encode() for e in listed]
    in_list = set(entries)
    members = list(where)
    for i in range(0, len(members), batch):
        chunk = members[i : i + batch]
        pipe = r.pipeline(transaction=False)
        for member in chunk:
            pipe.hmget(keys.job(member), "state", "priority", "group")
        for member, got in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
            names = where[member]
            if len(names) > 1:
                problems.append(f"{member!r} is in {' and '.join(names)}")
            if isinstance(got, Exception):
                problems.append(f"{member!r} is in {names[0]} but its row is not a hash")
                continue
            state, level, group = got
            named = (group or b"").decode("utf-8", "surrogateescape")
            if names[0].startswith("g:") and named != names[0][2:]:
                problems.append(f"{member!r} is in {names[0]} but its row names group {group!r}")
            if state is None:
                problems.append(f"{member!r} is in {names[0]} without its row (or the row has no state)")
            elif state.decode() != states[names[0]]:
                problems.append(f"{member!r} is in {names[0]} but its row says {state.decode()}")
            if (names[0] == "priority" or names[0].startswith("g:")) and int(level or 0) != levels[member]:
                problems.append(f"{member!r} is at level {levels[member]} but its row says {level!r}")
    pattern = "".join("\\" + c if c in "\\*?[]" else c for c in keys.base) + "job:*"
    rows = list(r.scan_iter(match=pattern, count=batch))
    prefix = len(keys.base.encode()) + 4
    resident = 0
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        pipe = r.pipeline(transaction=False)
        for row in chunk:
            pipe.hmget(row, "state", "priority", "group")
        for row, got in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(got, Exception):
                continue  # not a row: nothing claims a state
            member, text_state, level, group = row[prefix:], (got[0] or b"").decode(), got[1], got[2]
            held = where.get(member, [])
            if text_state == "waiting":  # waiting for its dependencies: in no lane (dependency_problems)
                if held:
                    problems.append(f"row {row!r} says waiting but {held[0]} holds it")
                continue
            if text_state not in ("pending", "active", "dead", "done", "cancelled"):
                says = f"says {text_state!r}" if got[0] is not None else "has no state"
                problems.append(f"row {row!r} {says}: no lane holds it, no verb moves it")
                continue
            if text_state in ("active", "dead") and text_state not in held:
                problems.append(f"row {row!r} says {text_state} but {text_state} does not hold it")
            if text_state == "pending":
                lane = (
                    "delayed"
                    if "delayed" in held
                    else "g:" + group.decode("utf-8", "surrogateescape")
                    if group is not None
                    else "priority"
                    if level is not None
                    else "pending"
                )
                if lane == "pending":
                    resident += 1
                    if member not in in_list:
                        problems.append(f"row {row!r} says pending but waits nowhere (not in the list)")
                elif lane not in held:
                    listed_too = " (the list holds it: a claim drops it there)" if member in in_list else ""
                    problems.append(
                        f"row {row!r} says pending at level {level!r} but {lane} does not hold it{listed_too}"
                    )
            if text_state in ("done", "cancelled") and held:
                problems.append(f"row {row!r} says {text_state} but {held[0]} holds it")
    stale = r.hget(keys.meta, "stale") if r.type(keys.meta) == b"hash" else None
    if int(stale or 0) != len(entries) - resident:
        said = (
            f"meta stale is {int(stale or 0)}: the list has {len(entries)} entries, {resident} waiting jobs"
        )
        if int(stale or 0) < len(entries) - resident:
            rowless = _rowless(r, keys, sorted(in_list), batch)
            if rowless:
                said += f" (entries without a row: {', '.join(repr(e) for e in rowless)})"
        problems.append(said)
    return (
        problems
        + unique_problems(r, queue, batch=batch)
        + group_problems(r, queue, batch=batch)
        + schedule_problems(r, queue)
        + dependency_problems(r, queue, batch=batch)
    )


def _ring_problems(r: redis.Redis, base: str, waiting: list[bytes]) -> list[str]:
    """The ring ``<base>groups`` against the groups whose lanes hold a job (``waiting``)."""
    ring_key = base + "groups"
    kind = r.type(ring_key)
    listed = r.lrange(ring_key, 0, -1) if kind == b"list" else []
    ring = [m if isinstance(m, bytes) else m.encode() for m in listed]
    problems: list[str] = []
    if kind not in (b"list", b"none"):
        return [f"the ring {ring_key!r} is a {kind!r}, not a list"]
    if ring and ring.count(b"") != 1:
        problems.append(f"the ring holds the empty name {ring.count(b'')} times, not once")
    if ring and len(ring) == 1:
        problems.append("the ring holds no group (the empty name alone)")
    meta_says = r.type(base + "meta") == b"hash" and r.hexists(base + "meta", "ring")
    if bool(ring) != bool(meta_says):
        said = "set" if meta_says else "absent"
        problems.append(f"meta's ring is {said} but the ring has {len(ring)} members")
    for group in sorted(set(ring) - {b""}):
        if ring.count(group) > 1:
            problems.append(f"group {group!r} is in the ring {ring.count(group)} times")
        if r.hget(base + "group:" + group.decode("utf-8", "surrogateescape"), "ring") != b"1":
            problems.append(f"group {group!r} is in the ring but its ring flag is not 1")
        held = _held_by(r, base, group)
        if held:
            problems.append(f"group {group!r} is in the ring but {held}")
    for group in waiting:
        if group not in ring and not _held_by(r, base, group):
            problems.append(f"group {group!r} has jobs in its lane but is not in the ring")
    return problems


def _held_by(r: redis.Redis, base: str, group: bytes) -> str:
    """Why a group may not be claimed now (EMQ.GROUPLIMIT: paused, or as many active as its
    ``max``), or "" when it may."""
    key = base + "group:" + group.decode("utf-8", "surrogateescape")
    if r.type(key) != b"hash":
        return ""
    active, cap, paused = r.hmget(key, "active", "max", "paused")
    if paused is not None:
        return "it is paused"
    whose = "its max"
    if cap is None:  # the queue's default cap (<base>meta's group_max) holds it
        meta = base + "meta"
        cap, whose = r.hget(meta, "group_max") if r.type(meta) == b"hash" else None, "the group_max"
    if cap is not None and cap.isdigit() and int(active or 0) >= int(cap):
        return f"it has {int(active or 0)} active, {whose} is {int(cap)}"
    return ""


def group_problems(r: redis.Redis, queue: str, *, batch: int = 1000) -> list[str]:
    """Where a group's count is off: ``<base>group:<g>``'s ``active`` (absent: 0) against the
    jobs of ``<g>`` in ``active`` (their rows' ``group``), for every group either names.  The
    count is kept by every claim and every path out of ``active``, so none should differ.  And
    the index ``<base>groupset`` names exactly the groups whose hash exists.
    SCANs ``<base>group:*`` and reads the rows of ``active``."""
    keys = queue_keys(queue)
    running: dict[bytes, int] = {}
    members = [m for m, _ in r.zscan_iter(keys.active, count=batch)] if r.type(keys.active) == b"zset" else []
    for i in range(0, len(members), batch):
        pipe = r.pipeline(transaction=False)
        for member in members[i : i + batch]:
            pipe.hget(keys.job(member), "group")
        for got in pipe.execute(raise_on_error=False):
            if isinstance(got, bytes):
                running[got] = running.get(got, 0) + 1
    pattern = "".join("\\" + c if c in "\\*?[]" else c for c in keys.base) + "group:*"
    prefix = len(keys.base.encode()) + len(b"group:")
    counted: dict[bytes, bytes | None] = {}
    found = list(r.scan_iter(match=pattern, count=batch))
    for i in range(0, len(found), batch):
        chunk = found[i : i + batch]
        pipe = r.pipeline(transaction=False)
        for key in chunk:
            pipe.hget(key, "active")
        for key, got in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
            counted[key[prefix:]] = got if isinstance(got, bytes) else None
    problems: list[str] = []
    index = keys.base + "groupset"
    kind = r.type(index)
    if kind not in (b"zset", b"none"):
        problems.append(f"the group index {index!r} is a {kind!r}, not a sorted set")
    else:
        listed = {m if isinstance(m, bytes) else str(m).encode() for m in r.zrange(index, 0, -1)}
        for name in sorted(set(counted) - listed):
            problems.append(f"group {name!r} has a hash but is not in the index {index!r}")
        for name in sorted(listed - set(counted)):
            problems.append(f"group {name!r} is in the index {index!r} but has no hash")
    for group in sorted(set(running) | set(counted)):
        said = counted.get(group)
        if not (said or b"0").isdigit():
            problems.append(f"group {group!r} has an 'active' that is not a count: {said!r}")
            continue
        if int(said or 0) != running.get(group, 0):
            running_now = running.get(group, 0)
            problems.append(
                f"group {group!r} counts {int(said or 0)} active but {running_now} of its jobs are in active"
            )
    return problems


def schedule_problems(r: redis.Redis, queue: str) -> list[str]:
    """The queue's cron schedules that no one fires: every tick stored in the row is due, so the
    module's timer (which has no cron parser) waits for a client to compute the next ones."""
    from . import schedules as rules

    set_key = rules.schedules_key(queue)
    if r.type(set_key) != b"zset":
        return []
    seconds, micros = r.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    due = rules.names_of(r.zrangebyscore(set_key, "-inf", now, start=0, num=rules.MAX_SCHEDULES))
    problems: list[str] = []
    for name in due:
        row = r.hgetall(rules.schedule_key(queue, name))
        if rules.out_of_ticks(row, now):
            stored = rules.text_of(row, "ticks")
            problems.append(
                f"schedule {name!r} is out of stored ticks (its last, {stored}, is due): "
                "the server's timer fires a cron only from them; a worker, a Reaper or drive_schedules "
                "computes the next ones"
            )
    return problems


def _rowless(r: redis.Redis, keys: QueueKeys, ids: list[bytes], batch: int) -> list[bytes]:
    """The ``ids`` that have no row."""
    out: list[bytes] = []
    for i in range(0, len(ids), batch):
        chunk = ids[i : i + batch]
        pipe = r.pipeline(transaction=False)
        for member in chunk:
            pipe.exists(keys.job(member))
        out += [m for m, n in zip(chunk, pipe.execute(), strict=True) if not n]
    return out


def _as_bytes(v: bytes | str) -> bytes:
    return v if isinstance(v, bytes) else v.encode()


def dependency_problems(r: redis.Redis, queue: str, *, batch: int = 1000) -> list[str]:
    """Where ``queue``'s dependencies (docs/concepts/workflows.md) could wait forever; [] when none.

    - a row that says waiting has its ``deps:<id>`` hash, whose ``waiting`` fields number its
      ``waits``; for each, the job is in ``waiters:<dep>``, and ``<dep>`` can still end (its
      row says pending, active or waiting) or its end is in ``resolve``;
    - every member of a ``waiters:<dep>`` set is a row that says waiting and waits on ``<dep>``.

    SCANs ``<base>job:*`` and ``<base>waiters:*``: a tool for tests, as ``queue_problems``.
    """
    keys = queue_keys(queue)
    escaped = "".join("\\" + c if c in "\\*?[]" else c for c in keys.base)
    problems: list[str] = []
    resolving: set[bytes] = set()
    if r.type(keys.base + "resolve") == b"list":
        for entry in r.lrange(keys.base + "resolve", 0, -1):
            resolving.add(_as_bytes(entry).partition(b":")[2])
    prefix = len(keys.base.encode()) + 4
    rows = list(r.scan_iter(match=escaped + "job:*", count=batch))
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        pipe = r.pipeline(transaction=False)
        for row in chunk:
            pipe.hmget(row, "state", "waits")
        for row, got in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(got, Exception) or got[0] != b"waiting":
                continue
            job = row[prefix:]
            deps_key = keys.base.encode() + b"deps:" + job
            deps = r.hgetall(deps_key) if r.type(deps_key) == b"hash" else {}
            unmet = sorted(_as_bytes(d) for d, v in deps.items() if v == b"waiting")
            if not deps:
                problems.append(f"row {row!r} says waiting but has no deps hash")
                continue
            if int(got[1] or 0) != len(unmet):
                problems.append(f"row {row!r} waits for {got[1]!r} but its deps hash has {len(unmet)} unmet")
            for dep in unmet:
                if r.zscore(keys.base.encode() + b"waiters:" + dep, job) is None:
                    problems.append(f"{job!r} waits on {dep!r} but is not in its waiter set")
                dstate = r.hget(keys.job(dep), "state")
                if dstate not in (b"pending", b"active", b"waiting") and dep not in resolving:
                    said = "has no row" if dstate is None else f"is {_as_bytes(dstate).decode()}"
                    problems.append(
                        f"{job!r} waits on {dep!r}, which {said} and is not in resolve: it waits forever"
                    )
    wprefix = len(keys.base.encode()) + 8
    for key in sorted(r.scan_iter(match=escaped + "waiters:*", count=batch)):
        dep = key[wprefix:]
        for member, _ in r.zscan_iter(key, count=batch):
            row_state = r.hget(keys.job(member), "state")
            mine = r.hget(keys.base.encode() + b"deps:" + member, dep)
            if row_state != b"waiting" or mine != b"waiting":
                problems.append(f"{member!r} is in the waiter set of {dep!r} but does not wait on it")
    return problems


def unique_problems(r: redis.Redis, queue: str, *, batch: int = 1000) -> list[str]:
    """The orphan unique keys of ``queue``: an UNTIL-done key (no expiry) whose job has no row,
    or a row that ended.  The verbs release a key when its job ends, so none should exist; an
    enqueue takes an orphan over (docs/concepts/unique.md).  SCANs ``<base>unique:*``."""
    keys = queue_keys(queue)
    pattern = "".join("\\" + c if c in "\\*?[]" else c for c in keys.base) + "unique:*"
    found = list(r.scan_iter(match=pattern, count=batch))
    problems: list[str] = []
    for i in range(0, len(found), batch):
        chunk = found[i : i + batch]
        pipe = r.pipeline(transaction=False)
        for key in chunk:
            pipe.get(key)
            pipe.pttl(key)
        got = pipe.execute(raise_on_error=False)
        held = [(key, got[2 * j], got[2 * j + 1]) for j, key in enumerate(chunk)]
        untils = [(key, holder) for key, holder, ttl in held if isinstance(holder, bytes) and ttl == -1]
        pipe = r.pipeline(transaction=False)
        for _, holder in untils:
            pipe.hget(keys.job(holder), "state")
        for (key, holder), state in zip(untils, pipe.execute(raise_on_error=False), strict=True):
            if state in (b"pending", b"active", b"waiting"):
                continue
            shown = state.decode() if isinstance(state, bytes) else state
            says = "has no row" if state is None else f"is {shown}"
            problems.append(f"orphan unique key {key!r}: its job {holder!r} {says}")
    return problems
