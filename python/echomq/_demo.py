"""The demo: the whole lifecycle on a server of its own, as a timeline.

Run with ``echomq demo`` (or ``python -m echomq demo``).  It starts
redis-server with emq.so on a free loopback port, runs three worker
*processes* and a reaper against it, and plays the story with real signals
and real commands; every line is stamped with the server's clock:

- workers checkpoint their leases while their handlers run, and each step
  of a job stores where it got to (``ctx.checkpoint_step``);
- a worker is killed (SIGKILL) mid-export: the reaper recovers the job and
  another worker resumes it from the step of its last checkpoint, not from
  step 1 (the state's server-clock time and attempt are printed);
- a poison job crashes every worker that takes it: dead-lettered after
  max-stalled stalls;
- a running job is cancelled from outside: its handler stops at its next
  check;
- a worker is frozen (SIGSTOP) past its lease: when it wakes, its lease keeper
  has cancelled its handler, which stops instead of racing the worker that
  now owns the job (its stale checkpoints are refused: never stored).

It ends with the queue's counts.  Nothing is simulated: these are the module
and the package the tests use.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

import redis

from ._protocol import server_ms, text
from ._sync.client import Client
from ._sync.context import JobContext, Progress
from ._sync.reaper import Reaper
from ._sync.worker import Worker
from .errors import Cancelled
from .keyspace import queue_keys
from .testing import EmbeddedServer

QUEUE = "demo"
EVENTS = "demo:events"  # a plain list beside the queue: workers report here
LEASE_MS = 600
STEP_S = 0.15
MAX_STALLED = 2
KILL_AT_STEP = 6  # the export's holder is killed once it has reported this step
JOBS = {  # id -> payload: steps of work, or poison
    "report": "steps:3",
    "resize": "steps:12",
    "poison": "poison",
    "export": "steps:40",
    "upload": "steps:30",
    "thumbs": "steps:3",
}


def _report(r: redis.Redis, who: str, kind: str, job: str, what: str, step: int | None = None) -> None:
    event = {"t": server_ms(r.time()), "who": who, "kind": kind, "job": job, "what": what, "step": step}
    r.rpush(EVENTS, json.dumps(event))


def stamp(t: int) -> str:
    """A server-clock time in ms as HH:MM:SS.mmm (UTC)."""
    return time.strftime("%H:%M:%S", time.gmtime(t / 1000)) + f".{t % 1000:03d}"


# -- the worker process ------------------------------------------------------------


def worker_main(name: str, url: str) -> None:
    """One demo worker process: ``python -m echomq._demo worker NAME URL``."""
    r = redis.Redis.from_url(url)
    client = Client(r)

    def handler(ctx: JobContext) -> None:
        job = ctx.job
        payload = job.payload.decode()
        _report(r, name, "start", job.id, f"claimed {job.id} (token {job.token})")
        if payload == "poison":
            _report(r, name, "crash", job.id, f"{job.id} crashes the whole process")
            os.kill(os.getpid(), signal.SIGKILL)
        steps = int(payload.split(":")[1])
        done = ctx.resume_point  # Progress(0, {}) on a first attempt
        if ctx.resume_state is not None:
            info = client.job(QUEUE, job.id)  # when and by which attempt the state was stored
            when = stamp(info.checkpoint_at) if info and info.checkpoint_at else "?"
            by = info.checkpoint_attempt if info else "?"
            _report(
                r, name, "resume", job.id,
                f"{job.id} resumes at step {done.step + 1}/{steps}: its last checkpoint "
                f"(step {done.step} done, stored {when} server time by attempt {by})",
                done.step + 1,
            )  # fmt: skip
        for step in range(done.step + 1, steps + 1):
            stop = ctx.cancel.sleep(STEP_S)
            if stop:
                _report(r, name, "stopped", job.id, f"{job.id} stopped at step {step}/{steps}: {stop.reason}")
                ctx.raise_if_cancelled()
            _report(r, name, "step", job.id, f"{job.id} step {step}/{steps}", step)
            try:
                ctx.checkpoint_step(step, {"of": steps})  # the lease, and where this job got to
            except Cancelled as exc:
                why = f"{job.id} stopped after step {step}/{steps}: {exc.reason}"
                _report(r, name, "stopped", job.id, why)
                raise
        _report(r, name, "finished", job.id, f"{job.id} finished its work")

    # run() stops on SIGTERM by itself; a short grace keeps the demo's end quick.  The demo's
    # reaper sweeps (and tells each recovery), so its workers do not (reap=False).
    worker = Worker(client, QUEUE, handler, lease_ms=LEASE_MS, poll_interval=0.05, grace=0.5, reap=False)
    worker.run()


# -- the story ---------------------------------------------------------------------


@dataclass
class Story:
    """What the demo saw; the smoke test asserts on it."""

    events: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    checkpoints: int = 0
    killed_at_step: int = 0  # the step of the export's last checkpoint when its holder was killed

    def steps(self, job: str) -> list[tuple[str, int]]:
        """(who, step) of every step of ``job`` in order."""
        return [(e["who"], e["step"]) for e in self.events if e["job"] == job and e["kind"] == "step"]

    def kinds(self, job: str) -> list[str]:
        return [e["kind"] for e in self.events if e["job"] == job]

    def who(self, job: str, kind: str) -> list[str]:
        return [e["who"] for e in self.events if e["job"] == job and e["kind"] == kind]


class Director:
    def __init__(self, server: EmbeddedServer, out: TextIO) -> None:
        self.server, self.out = server, out
        self.r = server.client()
        self.client = Client(self.r)
        self.keys = queue_keys(QUEUE)
        self.start_ms = server_ms(self.r.time())
        self.story = Story()
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.frozen: set[str] = set()
        self.next_worker = 1
        self._seen_events = 0
        self._leases: dict[str, float] = {}
        self._states: dict[str, str] = {}

    # -- printing ----------------------------------------------------------------

    def say(self, who: str, what: str, t: int | None = None) -> None:
        t = server_ms(self.r.time()) if t is None else t
        self.out.write(f"  {stamp(t)}  +{t - self.start_ms:>5} ms  {who:<10} {what}\n")
        self.out.flush()

    def record(self, who: str, kind: str, job: str, what: str) -> None:
        _report(self.r, who, kind, job, what)

    # -- workers -----------------------------------------------------------------

    def spawn(self) -> str:
        name = f"worker-{self.next_worker}"
        self.next_worker += 1
        self.workers[name] = subprocess.Popen(
            [sys.executable, "-m", "echomq._demo", "worker", name, self.server.url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.record("supervisor", "spawn", "", f"started {name} (pid {self.workers[name].pid})")
        return name

    def supervise(self) -> None:
        for name, proc in list(self.workers.items()):
            if proc.poll() is not None:
                del self.workers[name]
                self.record("supervisor", "died", "", f"{name} died (exit {proc.returncode})")
                self.spawn()

    def stop_workers(self) -> None:
        for name, proc in self.workers.items():
            if name in self.frozen:
                os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
        for proc in self.workers.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- watching ----------------------------------------------------------------

    def poll(self) -> None:
        """Print what happened since the last poll: events, leases, row states."""
        for raw in self.r.lrange(EVENTS, self._seen_events, -1):
            self._seen_events += 1
            event = json.loads(raw)
            self.story.events.append(event)
            self.say(event["who"], event["what"], event["t"])
        now = server_ms(self.r.time())
        leases = cast("list[tuple[bytes, float]]", self.r.zrange(self.keys.active, 0, -1, withscores=True))
        for member, deadline in leases:
            job = text(member)
            previous = self._leases.get(job)
            if previous is not None and deadline > previous:
                self.story.checkpoints += 1
                if self.story.checkpoints <= 3 or self.story.checkpoints % 10 == 0:
                    self.say("lease", f"{job}: checkpoint, lease now ends at +{int(deadline) - now} ms")
            self._leases[job] = deadline
        for job in JOBS:
            state = text(self.r.hget(self.keys.job(job), "state") or b"")
            if state != self._states.get(job) and state in ("done", "dead", "cancelled"):
                row = self.r.hgetall(self.keys.job(job))
                detail = {text(k): text(v) for k, v in row.items() if k != b"payload"}
                self.say("queue", f"{job} is {state}  {detail}")
            self._states[job] = state

    def wait_for(self, what: str, predicate: Any, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            self.supervise()
            found = predicate()
            if found:
                return found
            time.sleep(0.03)
        raise RuntimeError(f"demo: timed out waiting for {what}")

    def holder_at_step(self, job: str, step: int) -> str | None:
        for e in reversed(self.story.events):
            if e["job"] == job and e["kind"] == "step" and e["what"].startswith(f"{job} step {step}/"):
                return str(e["who"])
        return None

    def state(self, job: str) -> str:
        return self._states.get(job, "")

    # -- the acts ------------------------------------------------------------------

    def play(self) -> Story:
        for job, payload in JOBS.items():
            self.client.enqueue(QUEUE, payload, job_id=job)
        self.say("producer", f"enqueued {', '.join(JOBS)}")

        def on_sweep(result: Any) -> None:
            self.record("reaper", "sweep", "", f"recovered {result.recovered}, dead-lettered {result.dead}")

        with Reaper(self.client, QUEUE, interval=0.1, max_stalled=MAX_STALLED, on_sweep=on_sweep):
            for _ in range(3):
                self.spawn()

            # Cancel from outside: the handler stops at its next check.
            self.wait_for("resize to run", lambda: self.holder_at_step("resize", 3))
            outcome = self.client.cancel(QUEUE, "resize", "the customer withdrew the resize")
            self.say("operator", f"echomq cancel demo resize -> {outcome}")
            self.wait_for("resize to be cancelled", lambda: self.state("resize") == "cancelled")

            # A worker killed mid-export: the reaper recovers the job, another worker
            # resumes it from the step of its last checkpoint.
            victim = self.wait_for("export to run", lambda: self.holder_at_step("export", KILL_AT_STEP))
            self.say("operator", f"kill -9 {victim} while it holds export")
            self.workers[victim].kill()
            self.workers[victim].wait()
            info = self.client.job(QUEUE, "export")
            if info is not None and info.checkpoint_at is not None:
                done = Progress.decode(cast("bytes", self.r.hget(self.keys.job("export"), "checkpoint")))
                self.story.killed_at_step = done.step
                self.say(
                    "queue",
                    f"export's last checkpoint: step {done.step} done, stored {stamp(info.checkpoint_at)} "
                    f"server time by attempt {info.checkpoint_attempt}",
                )
            self.wait_for("export to be resumed", lambda: self.story.who("export", "resume"))

            # Frozen past its lease: the lease keeper stops the handler when it wakes.
            sleeper = self.wait_for("upload to run", lambda: self.holder_at_step("upload", 2))
            self.say("operator", f"kill -STOP {sleeper} (frozen for {3 * LEASE_MS} ms, past its lease)")
            os.kill(self.workers[sleeper].pid, signal.SIGSTOP)
            self.frozen.add(sleeper)
            self.wait_for("upload to be reclaimed", lambda: len(self.story.who("upload", "start")) >= 2)
            thaw_at = time.monotonic() + 3 * LEASE_MS / 1000
            self.wait_for("the freeze to last", lambda: time.monotonic() >= thaw_at)
            self.say("operator", f"kill -CONT {sleeper}")
            os.kill(self.workers[sleeper].pid, signal.SIGCONT)
            self.frozen.discard(sleeper)
            self.wait_for("the frozen handler to stop", lambda: self.story.who("upload", "stopped"))

            self.wait_for(
                "every job to finish",
                lambda: all(self.state(j) in ("done", "dead", "cancelled") for j in JOBS),
                timeout=30,
            )
            self.poll()
        self.stop_workers()
        self.poll()
        for job in JOBS:
            self.story.states[job] = self.state(job)
        counts = self.client.counts(QUEUE)
        self.story.counts = {
            "pending": counts.pending + counts.delayed,
            "active": counts.active,
            "dead": counts.dead,
            "failed": counts.failed,
            "done": sum(s == "done" for s in self.story.states.values()),
            "cancelled": sum(s == "cancelled" for s in self.story.states.values()),
        }
        return self.story


def run(out: TextIO = sys.stdout) -> Story:
    """Play the demo on a server of its own; returns what happened."""
    with EmbeddedServer() as server:
        out.write(f"EchoMQ demo: redis-server {server.url} --loadmodule {server.module}\n")
        out.write(f"lease {LEASE_MS} ms, checkpoints every {LEASE_MS // 3} ms, max-stalled {MAX_STALLED}\n\n")
        director = Director(server, out)
        try:
            story = director.play()
        finally:
            director.stop_workers()
        counts = ", ".join(f"{k} {v}" for k, v in story.counts.items())
        out.write(f"\nqueue {QUEUE}: {counts}\n")
        return story


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        worker_main(sys.argv[2], sys.argv[3])
    else:
        run()
