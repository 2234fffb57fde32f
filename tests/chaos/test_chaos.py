"""Chaos: worker processes SIGKILLed, frozen and restarted at random; poison jobs.

At the end every job is done exactly once or dead, none sits in two sets,
no completion was accepted from a stale token, and every poison job is dead
after exactly max-stalled stalls.

The jobs run in steps and store each with its checkpoint (issue 16): every
claim resumes from a state at or after the last checkpoint any earlier holder
had confirmed, and never from a stale holder's state (one written by an older
claim after a newer one had confirmed its own).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import echomq
from echomq.keyspace import queue_keys

from .. import chaos_worker
from ..calibration import budget, slowness
from ..conftest import ServerFactory
from ..helpers import check_resumes, queued

pytestmark = pytest.mark.backends

Q = "chaos"
K = queue_keys(Q)
JOBS = 300
POISON_EVERY = 25  # 12 poison jobs
MAX_STALLED = 3
LEASE_MS = 400
WORKERS = 3
# The chaos runs at most this long, and then stops (no more kills or freezes) while the
# queue drains, within DRAIN_BUDGET_S: what the test checks is what the chaos left, not how
# fast the workers get through it.  On a loaded machine (issue 39) the chaos came at its
# idle pace while a replaced worker took seconds to start: 146 processes started, 45 jobs
# done in 150 s.  So it comes as much slower as the machine is (calibration.slowness).
CHAOS_S = 150.0
DRAIN_BUDGET_S = budget(60.0)
WORKER_SCRIPT = Path(__file__).resolve().parent.parent / "chaos_worker.py"


class Pool:
    def __init__(self, url: str, backend: str, history: Path) -> None:
        self.url, self.backend, self.history = url, backend, history
        self.procs: list[subprocess.Popen[bytes]] = []
        self.frozen: dict[int, float] = {}  # pid -> when to resume
        self.started = 0

    def spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=str(WORKER_SCRIPT.parent.parent / "python"))
        proc = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT), self.url, Q, str(LEASE_MS), self.backend, str(self.history)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.started += 1
        return proc

    def replace_dead(self) -> int:
        died = 0
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                self.procs[i] = self.spawn()
                died += 1
        return died

    def resume_due(self) -> None:
        now = time.monotonic()
        for proc in self.procs:
            if proc.pid in self.frozen and self.frozen[proc.pid] <= now:
                os.kill(proc.pid, signal.SIGCONT)
                del self.frozen[proc.pid]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                if proc.pid in self.frozen:
                    os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def completions_in_the_aof(directory: Path) -> int:
    """Accepted COMPLETEs: the HSETs of `closed_by complete` written to the append-only file."""
    files = [p for p in Path(directory).rglob("*") if p.is_file() and ".aof" in p.name]
    assert files, f"no append-only file in {directory}"
    return sum(p.read_bytes().count(b"$9\r\nclosed_by\r\n$8\r\ncomplete\r\n") for p in files)


@pytest.mark.slow
@pytest.mark.timeout(CHAOS_S + DRAIN_BUDGET_S + 120)
def test_no_job_is_lost_under_chaos(server_factory: ServerFactory, backend: str) -> None:
    server = server_factory(
        ["--appendonly", "yes", "--auto-aof-rewrite-percentage", "0"], load_module=backend == "module"
    )
    r = server.client()
    client = echomq.Client(r)
    assert client.backend == backend
    poison = {f"job-{i:03}" for i in range(0, JOBS, POISON_EVERY)}
    for i in range(JOBS):
        job_id = f"job-{i:03}"
        client.enqueue(Q, b"poison" if job_id in poison else b"work", job_id=job_id)

    rng = random.Random(20261129)
    kills = freezes = crashes = 0
    history = server.dir / "history.jsonl"  # the workers' runs and confirmed checkpoints
    pool = Pool(server.url, backend, history)
    pool.procs = [pool.spawn() for _ in range(WORKERS)]
    reaper = echomq.Reaper(client, Q, interval=0.05, max_stalled=MAX_STALLED, limit=50)
    deadline = time.monotonic() + CHAOS_S
    pace = slowness()
    try:
        with reaper:
            while time.monotonic() < deadline:
                if queued(r, K) == 0 and r.zcard(K.active) == 0:
                    break
                crashes += pool.replace_dead()
                pool.resume_due()
                time.sleep(rng.uniform(0.05, 0.3) * pace)
                victim = rng.choice(pool.procs)
                roll = rng.random()
                if roll < 0.4 and victim.poll() is None and victim.pid not in pool.frozen:
                    victim.kill()  # SIGKILL mid-whatever
                    victim.wait()
                    kills += 1
                elif roll < 0.55 and victim.poll() is None and victim.pid not in pool.frozen:
                    # Frozen past its lease: its jobs get swept and reclaimed; when it
                    # wakes, the lease keeper must keep it from completing them.
                    os.kill(victim.pid, signal.SIGSTOP)
                    pool.frozen[victim.pid] = time.monotonic() + LEASE_MS * 2.5 / 1000
                    freezes += 1
            calm = time.monotonic() + DRAIN_BUDGET_S  # no more chaos: the workers finish what it left
            while time.monotonic() < calm and not (queued(r, K) == 0 and r.zcard(K.active) == 0):
                crashes += pool.replace_dead()  # a poison job still kills its worker
                pool.resume_due()
                time.sleep(0.05)
            finished = queued(r, K) == 0 and r.zcard(K.active) == 0
    finally:
        pool.stop_all()
    crashes -= kills  # replace_dead also restarted the ones we killed

    stats = r.info("commandstats")
    # Workers complete with EMQ.COMPLETECLAIM (a job's end and the next claim in one
    # command) and with EMQ.COMPLETE (after a lost reply, at shutdown): both count.
    verbs = [stats.get(f"cmdstat_emq.{v}", {}) for v in ("complete", "completeclaim")]
    calls = sum(int(v.get("calls", 0)) for v in verbs)
    failed = sum(int(v.get("failed_calls", 0)) for v in verbs)
    accepted = completions_in_the_aof(server.dir)
    if backend == "module":
        # Every accepted completion was a call the module did not refuse; a call may also be
        # a resend whose first reply was lost (answered from `closed_by`, writing nothing),
        # or a completion of a job gone meanwhile (:-1), so the calls may outnumber them.
        assert 0 < accepted <= calls - failed
    # Stale completions refused: counted by the module's command stats (a script's refusals are
    # EVALSHA calls like any other).
    rejected = failed if backend == "module" else "n/a"
    rows = {f"job-{i:03}": r.hgetall(K.job(f"job-{i:03}")) for i in range(JOBS)}
    done = {j for j, row in rows.items() if row[b"state"] == b"done"}
    dead = {j for j, row in rows.items() if row[b"state"] == b"dead"}
    events = [json.loads(line) for line in history.read_text().splitlines() if line.endswith("}")]
    resumed = check_resumes(events, rows, chaos_worker.STEPS)
    print(
        f"\nchaos: jobs={JOBS} poison={len(poison)} kills={kills} freezes={freezes} "
        f"poison-crashes={crashes} recoveries={reaper.recovered} dead-letters={reaper.dead} "
        f"done={len(done)} dead={len(dead)} accepted-completions={accepted} "
        f"rejected-stale-completions={rejected} worker-processes-started={pool.started} "
        f"runs={sum(e['event'] == 'start' for e in events)} resumed-mid-job={resumed} backend={backend}"
    )

    assert finished, "the queue did not drain within the time budget (the chaos's, then the calm's)"
    assert done | dead == set(rows), "every job is done or dead"
    assert not r.exists(K.pending) and not r.exists(K.active)
    assert {m.decode() for m in r.zrange(K.dead, 0, -1)} == dead
    # Done exactly once: each accepted completion moved one active job to done,
    # and a done job is in no set, so it can never be completed again.
    assert accepted == len(done)
    assert poison <= dead
    for job in poison:
        assert rows[job][b"stalled"] == str(MAX_STALLED).encode(), job
        assert rows[job][b"last_error"] == b"stalled"
    for job in dead - poison:  # killed by chaos MAX_STALLED times: dead-lettered legitimately
        assert rows[job][b"stalled"] == str(MAX_STALLED).encode(), job
    for job in done:
        assert int(rows[job].get(b"stalled", b"0")) < MAX_STALLED
    assert int(r.hget(K.metrics_failed, "count") or 0) == len(dead)
    assert kills > 0 and freezes > 0 and crashes >= len(poison)  # every fault fired
    assert resumed > 0, "no claim resumed from a checkpoint: the chaos did not test resuming"
