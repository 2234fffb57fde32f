"""Outage chaos (issues 23, 27): worker processes (threads and asyncio) keep working while the server is
stalled (DEBUG SLEEP), frozen (SIGSTOP/SIGCONT), restarted with its data (AOF, SIGTERM, the same port and
directory) and reached through connections that go half-open, and while busy workers get a SIGTERM (a
deploy) and are replaced.

The workers run at 1, 100 and 500 slots: ``make test`` runs one layout
mixing them (a thread worker and an asyncio one of 1 slot, threads of 100,
tasks of 500); ``ECHOMQ_OUTAGE_SLOTS=1,100,500`` (``make outage``) runs the
whole scenario once per slot count, every worker at it.  A layout may also
name one driver and options: ``asyncio:500+prefetch+forced+short`` runs
asyncio workers of 500 slots each, with a prefetch of half their slots,
deploys that are forced stops (a second SIGTERM 0.05 s after the worker handled the first) and
a 1 s lease (``make outage`` runs such layouts too).  After each SIGTERM
no job may still be held with a token the exited worker was handed (it
records every claim's answer): a job a claim answered is run or given
back, a second signal or not.

Afterwards every job is done, dead (only the poison ones, after running) or
cancelled (only those the test asked to cancel), and no job was completed
by a holder that had lost its lease: the token that completed a job is the
last one any claim handed out for it, and its handler's own record says it
returned with its lease held.  The jobs run in steps, each stored with its
checkpoint (issue 16): every claim resumed from a state at or after the last
checkpoint confirmed before it, never from a stale holder's state, the states
surviving the restarts.  Run with ``-s`` for the figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys

from ..calibration import budget
from ..conftest import ServerFactory
from ..faults import AOF, Proxy, frozen, pythonpath, restart, stall, wait_until
from ..helpers import check_resumes, queued

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent.parent / "outage_worker.py"
Q = "outage"
K = queue_keys(Q)
LEASE_MS = 1500
PRODUCE_S = 16.0  # jobs arrive for this long, one every ENQUEUE_EVERY_S, and in bursts (BURST)
ENQUEUE_EVERY_S = 0.06
BURST = 250  # jobs at once (at most 10 per slot), just before each SIGTERM: the workers it hits are busy
POISON_EVERY = 25
CANCEL_EVERY = 40  # job i with i % CANCEL_EVERY == 7 gets a cancel request soon after it is enqueued
BUDGET_S = 45.0  # from the start to a drained queue, on an idle machine (scaled: calibration.budget)
# The workers' (mode, slots); a SIGTERM hits the third, then the fourth, each replaced at once.
MIXED = [("sync", 1), ("asyncio", 1), ("sync", 100), ("asyncio", 500)]


SHORT_LEASE_MS = 1000  # a layout's "+short"
PREFETCH_MAX_STALLED = 10  # a layout's "+prefetch" (Layout.max_stalled)
# The scenario's outages that lapse the leases they span: the short stall (on a busy machine),
# the freeze, the first restart, the long stall, the second restart.
STALLING_OUTAGES = 5
# A forced deploy's second SIGTERM, this soon after the worker handled the
# first: a busy worker is still stopping (its exit status, 128 + SIGTERM,
# says it was forced).
FORCE_AFTER_S = 0.05


def layouts() -> list[str]:
    """``ECHOMQ_OUTAGE_SLOTS``: "mixed" (the default), or layouts, one run each ("1,100,500",
    "asyncio:100+prefetch+forced")."""
    return [x.strip() for x in os.environ.get("ECHOMQ_OUTAGE_SLOTS", "mixed").split(",") if x.strip()]


@dataclass(frozen=True)
class Layout:
    """What one run's workers are: (mode, slots) each, their prefetch share, the deploys, the lease."""

    workers: list[tuple[str, int]]
    prefetch: bool = False  # each worker claims half its slots beyond them
    forced: bool = False  # each deploy is a forced stop (SIGTERM twice)
    lease_ms: int = LEASE_MS
    # The reaper's and the workers' max_stalled.  Each of the scenario's outages
    # (the freeze, the long stall, the restarts; the short stall too, on a busy
    # machine whose keepers run late) lapses every lease it spans: a stall by
    # design, STALLING_OUTAGES of them.  A job slowed down by a busy machine can
    # be held through every one (three stalls, at the old budget of 3, made a
    # job that is not poison dead: the suite failed on a loaded machine), so the
    # budget is one more than them: the test checks that nothing is lost, the
    # give-backs and the fencing, and that no job stalled more often than the
    # outages could make it, not the stall budget (tests/verbs/test_sweep.py).
    # A prefetched job is held through more of them than one that runs at once.
    max_stalled: int = 6


def layout_of(name: str) -> Layout:
    """``mixed``, ``N`` (threads and tasks of N slots) or ``MODE:N[+prefetch][+forced][+short]``."""
    if name == "mixed":
        return Layout(MIXED)
    spec, *options = name.split("+")
    unknown = set(options) - {"prefetch", "forced", "short"}
    assert not unknown, f"unknown layout options {unknown} in {name!r}"
    mode, _, slots = spec.rpartition(":")
    modes = [mode] if mode else ["sync", "asyncio"]
    assert set(modes) <= {"sync", "asyncio"}, name
    workers = [(m, int(slots)) for m in modes] * (4 // len(modes))
    lease_ms = SHORT_LEASE_MS if "short" in options else LEASE_MS
    prefetch = "prefetch" in options
    # the default layout's stall budget (one more than the outages that lapse leases) unless prefetched
    stall_budget = PREFETCH_MAX_STALLED if prefetch else Layout.max_stalled
    return Layout(workers, prefetch, "forced" in options, lease_ms, stall_budget)


def job_id(i: int) -> str:
    return f"job-{i:04}"


class Producer(threading.Thread):
    """Enqueues jobs through a client of its own (its retries ride out the restarts) and cancels a few."""

    def __init__(self, url: str) -> None:
        super().__init__(name="test-producer", daemon=True)
        self.client = echomq.Client.from_url(url)
        self.enqueued: list[str] = []
        self.poison: set[str] = set()
        self.cancel_asked: set[str] = set()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._next = 0

    def _take(self, n: int) -> list[int]:
        with self._lock:
            first, self._next = self._next, self._next + n
        return list(range(first, first + n))

    def burst(self, n: int = BURST) -> None:
        """``n`` jobs in one ENQUEUEMANY (a poison one among them as in the trickle)."""
        numbers = self._take(n)
        items = [(job_id(i), b"poison" if i % POISON_EVERY == 3 else b"work") for i in numbers]
        try:
            self.client.enqueue_many(Q, items)
        except Exception as exc:  # counted, shown; the jobs were not enqueued
            self.errors.append(f"burst {items[0][0]}: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            self.enqueued += [jid for jid, _ in items]
            self.poison |= {jid for jid, payload in items if payload == b"poison"}

    def run(self) -> None:
        started = time.monotonic()
        while time.monotonic() - started < PRODUCE_S:
            (i,) = self._take(1)
            jid = job_id(i)
            poison = i % POISON_EVERY == 3
            try:
                self.client.enqueue(Q, b"poison" if poison else b"work", job_id=jid)
                self.enqueued.append(jid)
                if poison:
                    self.poison.add(jid)
                if i % CANCEL_EVERY == 7:
                    time.sleep(0.1)
                    self.client.cancel(Q, jid, "chaos cancel")
                    self.cancel_asked.add(jid)
            except echomq.JobExists:  # a retry the client could not tell from a duplicate: it is there
                self.enqueued.append(jid)
            except Exception as exc:  # counted, shown; the job was not enqueued
                self.errors.append(f"{jid}: {type(exc).__name__}: {exc}")
            time.sleep(ENQUEUE_EVERY_S)


def spawn(
    url: str, mode: str, slots: int, history: Path, lease_ms: int = LEASE_MS, prefetch: int = 0,
    max_stalled: int = 3,
) -> subprocess.Popen[str]:  # fmt: skip
    env = dict(os.environ, PYTHONPATH=pythonpath(ROOT / "python"))
    args = [url, Q, str(lease_ms), mode, str(history), str(slots), str(prefetch), str(max_stalled)]
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


class Workers:
    """The worker processes, each with its history; ``deploy(n)`` SIGTERMs one and starts its replacement."""

    def __init__(self, url: str, layout: Layout, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.spec = layout
        self.layout = list(layout.workers)
        self.histories: list[Path] = []
        self.procs: list[subprocess.Popen[str]] = []
        self.paths: list[Path] = []  # the history of each process in procs
        for mode, slots in self.layout:
            proc, path = self._spawn(mode, slots)
            self.procs.append(proc)
            self.paths.append(path)
        self.outputs: list[tuple[str, str]] = []
        self.codes: list[int] = []
        self.expected_codes: list[int] = []  # 0 after one SIGTERM; 128 + SIGTERM after a forced stop
        self.held_by_nobody: list[tuple[str, str, str]] = []
        self.deploys: list[str] = []

    def _spawn(self, mode: str, slots: int) -> tuple[subprocess.Popen[str], Path]:
        path = self.tmp / f"history-{len(self.histories)}.jsonl"
        self.histories.append(path)
        prefetch = slots // 2 if self.spec.prefetch else 0
        return spawn(self.url, mode, slots, path, self.spec.lease_ms, prefetch, self.spec.max_stalled), path

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Every running worker handles SIGTERM (its history says ``ready``): a deploy tests a stop."""
        return wait_until(
            lambda: all(any(e["event"] == "ready" for e in read_history([p])) for p in self.paths),
            timeout, step=0.05,
        )  # fmt: skip

    def deploy(self, n: int, admin: redis.Redis) -> float:
        """SIGTERM worker ``n`` (busy), wait for it to exit, then check what it held; returns the seconds."""
        proc, path = self.procs[n], self.paths[n]
        mode, slots = self.layout[n]
        self.procs[n], self.paths[n] = self._spawn(mode, slots)  # the replacement starts at once
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        handled = Path(f"{path}.signals")  # outage_worker.count_signals: the first one was handled
        second = False
        if self.spec.forced:  # a second signal: stop at once, the jobs still held given back
            wait_until(lambda: handled.exists() and handled.stat().st_size >= 1, timeout=10)
            time.sleep(FORCE_AFTER_S)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                second = True
        out, err = exited(proc, path, f"{mode}@{slots}")
        took = time.monotonic() - started
        self.outputs.append((out, err))
        path.with_suffix(".err").write_text(err)
        self.codes.append(proc.returncode)
        # A second signal that came after run() had returned (outage_worker.late_signal: an idle
        # worker stops at once), or none since the process had gone, found the stop done: exit 0.
        late = not second or b"L" in handled.read_bytes()
        self.expected_codes.append(128 + signal.SIGTERM if self.spec.forced and not late else 0)
        claimed = {e["token"] for e in read_history([path]) if e["event"] == "claim"}
        for raw in admin.zrange(K.active, 0, -1):
            token = (admin.hget(K.job(raw.decode()), "token") or b"").decode()
            if token in claimed:  # still held with a token only the exited worker had
                self.held_by_nobody.append((f"{mode}@{slots}", raw.decode(), token))
        forced = " (forced)" if self.spec.forced else ""
        self.deploys.append(f"{mode}@{slots} stopped{forced} in {took:.2f} s ({len(claimed)} claims)")
        return took

    def stop_all(self) -> float:
        self.wait_ready(30)  # a replacement still starting ignores SIGTERM (outage_worker.late_signal)
        started = time.monotonic()
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc, path, (mode, slots) in zip(self.procs, self.paths, self.layout, strict=True):
            self.outputs.append(exited(proc, path, f"{mode}@{slots}"))
            self.codes.append(proc.returncode)
            self.expected_codes.append(0)
            path.with_suffix(".err").write_text(self.outputs[-1][1])
        return time.monotonic() - started


def exited(proc: subprocess.Popen[str], path: Path, name: str) -> tuple[str, str]:
    """A SIGTERMed worker's (stdout, stderr) once it exits; one still running 30 s later is asked
    where it hangs (outage_worker.dump_tasks), killed, and fails the test with that dump."""
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        proc.kill()
        _, err = proc.communicate(timeout=10)
        path.with_suffix(".err").write_text(err)
        dumped = max(0, err.find("Thread 0x"))  # the dump, whole, and what the log said just before it
        raise AssertionError(
            f"{name} did not exit 30 s after its SIGTERM: {err[max(0, dumped - 2000):dumped + 12000]}"
        ) from None


def read_history(paths: list[Path]) -> list[dict[str, Any]]:
    events = []
    for path in paths:
        if path.exists():
            events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return events


@pytest.mark.slow
@pytest.mark.parametrize("layout", layouts())
def test_no_job_is_lost_through_stalls_freezes_restarts_half_open_connections_and_deploys(
    server_factory: ServerFactory, tmp_path: Path, layout: str
) -> None:
    (tmp_path / "data").mkdir()
    server = server_factory(AOF, dir=tmp_path / "data")
    proxy = Proxy(server.port)  # the workers' only way to the server
    worker_url = f"redis://127.0.0.1:{proxy.port}/0"
    faults: Counter[str] = Counter()
    spec = layout_of(layout)
    workers = Workers(worker_url, spec, tmp_path)
    burst = min(BURST, 10 * sum(slots for _, slots in spec.workers))
    producer = Producer(server.url)
    reaper = echomq.Reaper(
        echomq.Client.from_url(server.url), Q, interval=0.2, max_stalled=spec.max_stalled, limit=100
    )
    started = time.monotonic()

    def at(second: float) -> None:
        time.sleep(max(0.0, started + second - time.monotonic()))

    admin = echomq.Client.from_url(server.url)
    r = admin.redis
    try:
        assert workers.wait_ready(), "a worker did not start"
        started = time.monotonic()
        producer.start()
        reaper.start()
        at(1.5)
        short = round(spec.lease_ms * 2 / 3000, 2)
        stall(server, short).join()  # shorter than a lease
        faults[f"DEBUG SLEEP {short} s"] += 1
        at(2.8)
        producer.burst(burst)
        proxy.blackhole()  # every worker connection open now goes half-open; new ones work
        faults["half-open (all connections)"] += 1
        at(3.2)
        workers.deploy(2, r)  # a SIGTERM to a busy worker whose connections are half-open
        faults["SIGTERM to a busy worker (half-open), replaced"] += 1
        at(5.0)
        with frozen(server):  # as long as a lease: some holders cannot show theirs
            time.sleep(spec.lease_ms / 1000)
        faults[f"SIGSTOP {spec.lease_ms / 1000} s"] += 1
        at(7.5)
        restart(server, down_for=1.0)  # SIGTERM: the AOF is flushed; the same port and directory
        faults["restart (SIGTERM, down 1.0 s)"] += 1
        at(9.6)
        producer.burst(burst)
        at(9.8)
        workers.deploy(3, r)  # a SIGTERM to a busy worker
        faults["SIGTERM to a busy worker, replaced"] += 1
        at(10.5)
        proxy.blackhole()
        faults["half-open (all connections)"] += 1
        at(12.0)
        stall(server, 2.5).join()  # longer than a lease
        faults["DEBUG SLEEP 2.5 s"] += 1
        at(14.5)
        proxy.blackhole()
        faults["half-open (all connections)"] += 1
        at(15.0)
        restart(server, down_for=0.5)
        faults["restart (SIGTERM, down 0.5 s)"] += 1
        producer.join()
        drained = wait_until(
            lambda: queued(r, K) == 0 and r.zcard(K.active) == 0,
            timeout=budget(BUDGET_S) - (time.monotonic() - started),
        )
    finally:
        stop_took = workers.stop_all()
        reaper.stop()
        proxy.close()
    took = time.monotonic() - started
    outputs = workers.outputs
    histories = workers.histories

    r = admin.redis
    stats = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs if out.strip()]
    events = read_history(histories)
    starts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[tuple[str, str], dict[str, Any]] = {}
    for e in events:
        if e["event"] == "start":
            starts[e["job"]].append(e)
        elif e["event"] == "end":
            ends[(e["job"], e["token"])] = e
    rows = {
        jid: {k.decode(): v.decode() for k, v in r.hgetall(K.job(jid)).items()} for jid in producer.enqueued
    }
    states = Counter(row.get("state", "missing") for row in rows.values())
    runs = sum(len(v) for v in starts.values())
    stalls = sum(int(row.get("stalled", "0")) for row in rows.values())
    by_stalls = Counter(row.get("stalled", "0") for row in rows.values())
    raw_rows = {jid: r.hgetall(K.job(jid)) for jid in producer.enqueued}
    resumed = check_resumes(events, raw_rows)  # a lost reply may leave the last step unstored
    claims = sum(int(row.get("attempts", "0")) for row in rows.values())  # every claim of every job
    never_ran = {
        jid: (int(row.get("attempts", "0")), len(starts[jid]), row.get("stalled", "0"))
        for jid, row in rows.items()
        if int(row.get("attempts", "0")) > len(starts[jid])
    }
    total = Counter[str]()
    for s in stats:
        total.update({k: v for k, v in s.items() if isinstance(v, int) and k != "pid"})
    print(
        f"\noutage chaos: {took:.1f} s; faults: {dict(faults)}; jobs {len(producer.enqueued)} "
        f"(poison {len(producer.poison)}, cancel asked {len(producer.cancel_asked)}); "
        f"final states {dict(states)}; claims {claims}, handler runs {runs} (re-runs {runs - len(starts)}, "
        f"claims that never ran {claims - runs}: {never_ran}); "
        f"stalls counted {stalls} (jobs by stalls {dict(by_stalls)}); "
        f"claims resumed mid-job {resumed}; "
        f"worker totals {dict(total)}; producer errors {len(producer.errors)}; "
        f"deploys: {workers.deploys}; workers stopped (SIGTERM) in {stop_took:.2f} s, "
        f"exit statuses {workers.codes}"
    )

    held = {jid for _, jid, _ in workers.held_by_nobody}
    for jid, row in rows.items():  # what a job that ended wrongly went through (the logs: history-*.err)
        if (row.get("state") == "dead" and jid not in producer.poison) or jid in held:
            print(f"{jid}: {row}; events {[e for e in events if e.get('job') == jid]}")
    assert drained, f"the queue did not drain: pending {queued(r, K)}, active {r.zcard(K.active)}"
    assert not producer.errors, producer.errors
    assert workers.held_by_nobody == [], "jobs a SIGTERMed worker was handed and neither ran nor gave back"
    assert workers.codes == workers.expected_codes, [err[-2000:] for _, err in outputs]
    assert len(stats) == len(workers.codes) == 6
    assert set(states) <= {"done", "dead", "cancelled"}, states
    for jid, row in rows.items():
        state = row["state"]
        if state == "dead":  # only poison, and only after running
            assert jid in producer.poison, (jid, row)
            assert row["last_error"] == "RuntimeError: poison", (jid, row)
            assert starts[jid], f"{jid} was dead-lettered without having run"
        elif state == "cancelled":
            assert jid in producer.cancel_asked, (jid, row)
        else:  # done: by the last holder, which returned with its lease held
            assert jid not in producer.poison, (jid, row)
            last = max(starts[jid], key=lambda e: int(e["token"].split("-")[0]))
            assert row["token"] == last["token"], (jid, row, starts[jid])
            end = ends.get((jid, row["token"]))
            assert end is not None and end["outcome"] == "returned", (jid, end)
            assert not end["lost"], f"{jid} was completed by a holder that had lost its lease: {end}"
    worst = max((int(row.get("stalled", "0")) for row in rows.values()), default=0)
    assert worst <= STALLING_OUTAGES, f"a job stalled {worst} times in {STALLING_OUTAGES} outages"
    for jid in producer.poison - producer.cancel_asked:
        assert rows[jid]["state"] == "dead"
    assert all(s["rejected"] == 0 or s["leases_lost"] >= 0 for s in stats)
    assert sum(faults.values()) == 10
