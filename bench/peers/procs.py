"""A contender subprocess and the server numbers a run is measured with (shared by harness and extras)."""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from bench.peers.contenders.protocol import TAG


def tail(text: str, lines: int = 6) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


class ContenderError(RuntimeError):
    pass


class Proc:
    """A contender subprocess: tagged JSON events from stdout, words to stdin."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.p = subprocess.Popen(
            argv,
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.untagged: collections.deque[str] = collections.deque(maxlen=20)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith(TAG):
                self.events.put(json.loads(line[len(TAG) :]))
            else:
                self.untagged.append(line.rstrip())
        self.events.put({"event": "eof"})

    def send(self, word: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(word + "\n")
        self.p.stdin.flush()

    def next_event(self, timeout: float) -> dict[str, Any]:
        try:
            ev = self.events.get(timeout=max(timeout, 0.001))
        except queue.Empty:
            raise ContenderError(f"no word from the contender in {timeout:.0f}s") from None
        if ev["event"] == "error":
            raise ContenderError(ev.get("message", "error"))
        if ev["event"] == "eof":
            self.p.wait(timeout=10)
            raise ContenderError(f"exited with {self.p.returncode}: {self.stderr_tail()}")
        return ev

    def expect(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next_event(deadline - time.monotonic())
            if ev["event"] == name:
                return ev

    def cpu_seconds(self) -> float:
        """utime + stime of the whole process (all threads), from /proc."""
        try:
            fields = Path(f"/proc/{self.p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stderr_tail(self, lines: int = 8) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace")
        return tail(text + "\n" + "\n".join(self.untagged), lines)

    def close(self) -> None:
        try:
            if self.p.stdin is not None:
                self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self._stderr.close()


def server_stats(r: Any) -> dict[str, float]:
    """One INFO (default sections include cpu and stats): the numbers a run is measured with."""
    info = r.info()
    return {
        "cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        "commands": float(info["total_commands_processed"]),
        "net_in": float(info["total_net_input_bytes"]),
        "net_out": float(info["total_net_output_bytes"]),
        "version": info["redis_version"],
    }


_MONITOR_LINE = re.compile(r'^[0-9.]+ \[\d+ ([^\]]*)\] "([^"]*)"')


class Census:
    """Counts, with MONITOR, the commands a server runs between start() and stop(), by origin.

    "sent": commands that came over a client connection (what a library's
    round trips carry); "inner": the rest (a Lua script's redis.call, a
    module's RedisModule_Call).  The harness's own connection (`own`, its
    INFO and the ECHO markers) is left out.  MONITOR slows the server down,
    so a census is a run of its own, never a timed one.
    """

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self.own = str(r.client_info()["addr"])
        self.token = uuid.uuid4().hex
        self.counts: collections.Counter[str] = collections.Counter()
        self.by_command: collections.Counter[str] = collections.Counter()
        self._started = threading.Event()
        self._ended = threading.Event()
        kw = r.connection_pool.connection_kwargs
        self._monitor = redis.Redis(host=kw["host"], port=kw["port"]).monitor()
        self._monitor.__enter__()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        counting = False
        try:
            while True:
                raw = self._monitor.connection.read_response()
                line = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                if self.token in line:
                    if "census-start" in line:
                        counting = True
                        self._started.set()
                        continue
                    self._ended.set()
                    return
                m = _MONITOR_LINE.match(line)
                if not counting or m is None or m.group(1) == self.own:
                    continue
                origin, command = m.group(1), m.group(2).lower()
                sent = origin.startswith("unix") or (":" in origin and origin != "lua")
                self.counts["sent" if sent else "inner"] += 1
                self.by_command[("" if sent else "inner ") + command] += 1
        except (redis.ConnectionError, OSError):
            self._ended.set()

    def start(self) -> None:
        self.r.echo(f"census-start-{self.token}")
        if not self._started.wait(10):
            raise ContenderError("MONITOR did not see the census start marker")

    def stop(self) -> dict[str, Any]:
        self.r.echo(f"census-end-{self.token}")
        complete = self._ended.wait(60)
        self._monitor.__exit__()
        return {
            "sent": self.counts["sent"],
            "inner": self.counts["inner"],
            "complete": complete,
            "by_command": dict(self.by_command.most_common()),
        }
