"""Failover chaos (issue 20): workers follow the master through Sentinels while it is killed.

A master with one replica, watched by three Sentinels.  Worker processes
(threads and asyncio; the module backend and the scripts backend side by
side, on one queue) and a reaper follow the master through the Sentinels
(redis-py's ``Sentinel.master_for``).  Each round enqueues a wave of jobs
(acknowledged by the replica: ``WAIT 1``), lets the workers take them, then
drops the replication link (``CLIENT KILL TYPE replica``: the replica
reconnects within its next cron tick, so the claims of that short window
never reach it) and SIGKILLs the master at a random moment.  Right after
the kill, before any client can write to it, the replica's rows are read:
what the promoted master knows of each job (its ``attempts``: a claim whose
counter is above it was lost).  The Sentinels promote the replica; the
killed server comes back as the new master's replica for the next round.

Afterwards:

- every job is done, dead (poison only, after running) or cancelled (only
  those the test asked to cancel);
- every accepted COMPLETE/FAIL/RELEASE came from the server that was master
  then, with a token whose claim that server saw: claimed there, or claimed
  on an earlier master and present on every replica promoted since (the
  snapshots).  No holder whose claim was lost had a finish accepted after
  the kill;
- two runs of one job overlapped at most ``OVERLAP_BOUND_S`` (see below),
  measured from the handlers' own start and end records.

The overlap bound.  A holder A whose claim the new master never saw (or
whose lease the new master lets lapse) keeps running until its cancel token
is cancelled, and that happens at the latest at its lease deadline: the
last extension A saw confirmed was *sent* before the kill K (after K no
server accepts A's extensions: the old master is dead, the new one answers
EMQSTALE or gone), so A's deadline is at most K + lease.  A second holder B
can only start on the promoted master, and the Sentinels cannot promote
before the master has been silent for down-after-milliseconds: B starts
after K + down_after.  So the overlap is at most lease - down_after, plus
how long A's handler takes to notice its token (here: it looks every 10 ms)
-- and it usually ends sooner: A's next checkpoint on the new master (every
lease/3 once A reaches it) is refused and cancels A at once.  The bound uses
no clock of the servers for claims the new master never saw (B claims a
pending job); for a claim that was replicated, the new master lets its
lease lapse by its own clock, so a skew between the two servers' clocks
adds to the bound (zero here: one machine).

The run is seeded (``ECHOMQ_FAILOVER_SEED``) and bounded: ``ECHOMQ_FAILOVER_KILLS``
kills (3 in the suite; ``make chaos`` runs more).  Run with ``-s`` for the figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys

from ..conftest import ServerFactory
from ..faults import pythonpath, wait_until
from ..helpers import queued
from ..sentinels import MASTER, Failover, start_failover

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent.parent / "failover_worker.py"
Q = "failover"
K = queue_keys(Q)
LEASE_MS = 6000  # longer than a failover takes here: an old holder can outlive it
DOWN_AFTER_MS = 2000  # shorter ones fail over again right after a promotion (redis/redis#8607)
FAILOVER_TIMEOUT_MS = 2000
HANDLER_STEP_S = 0.01  # how often a handler looks at its cancel token (failover_worker.STEP_S)
# Scheduling slack on top of the handler's step: 9 processes share 2 cores.
SLACK_S = 0.25
OVERLAP_BOUND_S = (LEASE_MS - DOWN_AFTER_MS) / 1000 + HANDLER_STEP_S + SLACK_S
KILLS = int(os.environ.get("ECHOMQ_FAILOVER_KILLS", "3"))
SEED = int(os.environ.get("ECHOMQ_FAILOVER_SEED", "20"))
# The workers' replicas= (0: no wait).  With 1, a handler starts only once the replica has its
# claim, so no run can come from a claim the promoted replica never saw.
REPLICAS = int(os.environ.get("ECHOMQ_FAILOVER_REPLICAS", "0"))
WAVE = 30  # jobs per round
POISON_EVERY = 15
MAX_ATTEMPTS = 3  # failover_worker's
WORKERS = [("sync", "module"), ("asyncio", "module"), ("sync", "scripts"), ("asyncio", "scripts")]


def counter_of(token: str) -> int:
    return int(token.split("-")[0])


@dataclass
class Kill:
    """One round's kill: the master's port, when, and what the replica it left behind knew."""

    port: int
    epoch_start: float  # when this master became master (time.time())
    at: float = 0.0
    attempts: dict[str, int] = field(default_factory=dict)  # the replica's rows right after the kill
    promoted_port: int = 0
    promoted_at: float = 0.0


class Chaos:
    def __init__(self, failover: Failover, rng: random.Random) -> None:
        self.failover, self.rng = failover, rng
        self.ids: list[str] = []
        self.poison: set[str] = set()
        self.cancel_asked: set[str] = set()
        self.kills: list[Kill] = []
        self.producer_retries = 0
        self.producer_errors: list[str] = []

    def duration_ms(self) -> int:
        """Most jobs are short; one in three outlives a failover, so two holders can overlap."""
        return self.rng.randint(3000, 7000) if self.rng.random() < 1 / 3 else self.rng.randint(200, 2500)

    def wave(self, n: int) -> None:
        """Enqueue ``n`` jobs (one with a cancel request) and wait until the replica has them."""
        start = len(self.ids)
        wave = [f"job-{i:04}" for i in range(start, start + n)]
        for i, jid in enumerate(wave, start):
            if i % POISON_EVERY == 3:
                self.poison.add(jid)
        cancel = wave[self.rng.randrange(n)]
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, (
                f"the wave was never acknowledged: {self.producer_errors[-3:]}"
            )
            try:
                # One connection to the master the Sentinels name: WAIT covers its writes, and the
                # last one (a mark that always writes) comes after every job of the wave.
                port = self.failover.master_port()
                producer = echomq.Client(
                    redis.Redis(port=port, socket_timeout=2, single_connection_client=True)
                )
                for jid in wave:
                    spec = {"poison": True} if jid in self.poison else {"ms": self.duration_ms()}
                    with contextlib.suppress(echomq.JobExists):  # an earlier try wrote it, on this master
                        producer.enqueue(Q, json.dumps(spec), job_id=jid)
                producer.cancel(Q, cancel, "chaos cancel")
                producer.redis.incr("producer-mark")
                acked = int(producer.redis.execute_command("WAIT", 1, 2000))
                producer.redis.close()
                if acked >= 1:
                    break
            except redis.RedisError as exc:
                self.producer_errors.append(repr(exc))
            self.producer_retries += 1
            time.sleep(0.2)
        self.ids += wave
        self.cancel_asked.add(cancel)

    def kill(self, epoch_start: float) -> Kill:
        """Drop the replication link, SIGKILL the master a random moment later, read what the replica has."""
        master = self.failover.master_server()
        replica = next(s for s in self.failover.servers if s is not master)
        kill = Kill(master.port, epoch_start)
        # The partition of the reproduction: the replica cannot come back (it has no
        # password; connections already open, the workers' and the Sentinels', keep theirs).
        m = master.client()
        m.config_set("requirepass", "partitioned")
        m.execute_command("CLIENT", "KILL", "TYPE", "replica")
        time.sleep(self.rng.uniform(0.0, 0.4))  # claims in this window are lost to the replica
        assert master.process is not None
        master.process.kill()
        kill.at = time.time()
        master.process.wait()
        r = replica.client(socket_timeout=2)

        def settled() -> bool:  # the link is down and nothing more arrives
            before = r.info("replication")
            time.sleep(0.03)
            after = r.info("replication")
            assert after["role"] == "slave", f"the replica is a {after['role']} already: {after}"
            return bool(
                after["master_link_status"] == "down"
                and before.get("slave_repl_offset") == after.get("slave_repl_offset")
            )

        assert wait_until(settled, timeout=5), "the replica's link did not go down"
        pipe = r.pipeline(transaction=False)
        for jid in self.ids:
            pipe.hget(K.job(jid), "attempts")
        pipe.execute_command("ROLE")
        *rows, role = pipe.execute()
        assert role[0] == b"slave", "the replica was promoted before its rows were read: raise DOWN_AFTER_MS"
        kill.attempts = {jid: int(a or 0) for jid, a in zip(self.ids, rows, strict=True)}
        kill.promoted_port = self.failover.wait_for_new_master(master.port)
        kill.promoted_at = time.time()
        self.kills.append(kill)
        self.rejoin(master, kill.promoted_port)
        return kill

    def rejoin(self, server: Any, master_port: int) -> None:
        """Start the killed server again, empty, as the new master's replica (same port)."""
        args = list(server.args)
        if "--replicaof" in args:
            at = args.index("--replicaof")
            del args[at : at + 3]
        server.args = [*args, "--replicaof", "127.0.0.1", str(master_port)]
        server.process = None
        server._fixed_port = server.port
        server.start()
        m = redis.Redis(port=master_port, socket_timeout=2)

        def synced() -> bool:
            info = server.client(socket_timeout=2).info("replication")
            return bool(
                info.get("master_link_status") == "up" and m.info("replication")["connected_slaves"] == 1
            )

        assert wait_until(synced, timeout=20), "the killed server did not come back as a replica"

        why: list[object] = []

        def sentinels_agree() -> bool:
            for s in self.failover.sentinels:
                named = s.client().sentinel_get_master_addr_by_name(MASTER)
                if named is None or int(named[1]) != master_port:
                    log = (s.dir / "sentinel.log").read_text(errors="replace").splitlines()[-40:]
                    why[:] = [s.port, "names the master", named, *log]
                    return False
                replicas = s.client().sentinel_slaves(MASTER)
                mine = [x for x in replicas if int(x["port"]) == server.port]
                # A fresh view (the Sentinels ask a replica for INFO every 10 s): one that still
                # remembers it as the master it was would not promote it at the next kill.
                if (
                    not mine
                    or mine[0]["is_sdown"]
                    or mine[0]["is_disconnected"]
                    or mine[0]["role-reported"] != "slave"
                    or mine[0]["master-link-status"] != "ok"
                ):
                    why[:] = [s.port, mine]
                    return False
            return True

        def views() -> list[object]:
            keys = ("port", "flags", "role-reported", "master-link-status", "master-port", "info-refresh")
            out: list[object] = [server.port, master_port]
            for s in self.failover.sentinels:
                out.append([{k: x.get(k) for k in keys} for x in s.client().sentinel_slaves(MASTER)])
            return out

        assert wait_until(sentinels_agree, timeout=25, step=0.1), (
            f"the Sentinels do not see the replica back: {why} {views()}"
        )


def spawn(failover: Failover, mode: str, backend: str, history: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=pythonpath(ROOT / "python"))
    ports = ",".join(str(s.port) for s in failover.sentinels)
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), ports, MASTER, Q, str(LEASE_MS), mode, backend, str(history),
         str(REPLICAS)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def drain(admin: redis.Redis, stuck_s: float = 20.0, budget_s: float = 180.0) -> bool:
    """Wait until no job is pending or active; False once the count stops falling for ``stuck_s``.

    The workers may have a backlog after many rounds: as long as jobs keep finishing, wait.
    """
    deadline = time.monotonic() + budget_s
    best, since = None, time.monotonic()
    while time.monotonic() < deadline:
        left = int(queued(admin, K)) + int(admin.zcard(K.active))
        if left == 0:
            return True
        if best is None or left < best:
            best, since = left, time.monotonic()
        elif time.monotonic() - since > stuck_s:
            return False
        time.sleep(0.1)
    return False


def read_history(paths: list[Path]) -> list[dict[str, Any]]:
    events = []
    for path in paths:
        if path.exists():
            events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(events, key=lambda e: e["t"])


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


@pytest.mark.slow
def test_workers_follow_a_killed_master_and_no_lost_claim_finishes(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    failover = start_failover(
        server_factory, replicas=1, down_after_ms=DOWN_AFTER_MS, failover_timeout_ms=FAILOVER_TIMEOUT_MS
    )
    histories = [tmp_path / f"history-{n}.jsonl" for n in range(len(WORKERS))]
    procs: list[subprocess.Popen[str]] = []
    reaper_client = echomq.Client(failover.master_client(socket_timeout=1, socket_connect_timeout=1))
    reaper = echomq.Reaper(reaper_client, Q, interval=0.2, max_stalled=10, limit=100)
    chaos = Chaos(failover, rng)
    started = time.time()
    outputs: list[tuple[str, str]] = []
    left: dict[str, object] = {}
    try:
        procs = [spawn(failover, m, b, h) for (m, b), h in zip(WORKERS, histories, strict=True)]
        reaper.start()
        epoch = started
        admin = failover.master_client(socket_timeout=2)
        for _ in range(KILLS):
            chaos.wave(WAVE)
            assert wait_until(lambda: admin.zcard(K.active) > 0, timeout=20), "no worker took a job"
            time.sleep(rng.uniform(0.3, 1.5))  # the workers are busy with the wave
            epoch = chaos.kill(epoch).promoted_at
        chaos.wave(WAVE // 2)  # the last master serves a calm wave too
        drained = drain(admin)
        if not drained:  # what was left, and where, before the workers stop
            left = {
                "master": failover.master_port(),
                "time": admin.time(),
                "pending": admin.lrange(K.pending, 0, 20),
                "active": admin.zrange(K.active, 0, 20, withscores=True),
            }
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=30) for proc in procs]
        reaper.stop()
        for n, sp in enumerate(failover.sentinels):  # kept with the histories, for a failure's story
            log = sp.dir / "sentinel.log"
            if log.exists():
                (tmp_path / f"sentinel-{n}.log").write_text(log.read_text(errors="replace"))
        for server in failover.servers:
            if server.logfile.exists():
                (tmp_path / f"server-{server.port}.log").write_text(
                    server.logfile.read_text(errors="replace")
                )
        failover.stop()
    took = time.time() - started
    final_port = chaos.kills[-1].promoted_port if chaos.kills else 0
    final = next(s for s in failover.servers if s.port == final_port)
    r = final.client(decode_responses=True)
    switches = [
        line
        for n in range(len(failover.sentinels))
        if (tmp_path / f"sentinel-{n}.log").exists()
        for line in (tmp_path / f"sentinel-{n}.log").read_text().splitlines()
        if "+switch-master" in line
    ]
    assert len(switches) == KILLS * len(failover.sentinels), (
        f"the Sentinels failed over other than after the {KILLS} kills (a master that answered no "
        f"PING for down-after under load): {switches}"
    )
    assert drained, f"the queue did not drain: {left}; after the workers stopped: {queued(r, K)}"
    assert [p.returncode for p in procs] == [0] * len(WORKERS), [err[-3000:] for _, err in outputs]

    events = read_history(histories)
    claims = {e["token"]: e for e in events if e["event"] == "claim"}
    starts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["event"] == "start":
            starts[e["job"]].append(e)
        elif e["event"] == "end":
            ends[e["token"]] = e
    finishes = [e for e in events if e["event"] == "finish" and e["outcome"] == "accepted"]
    refused = [e for e in events if e["event"] == "finish" and e["outcome"] in ("stale", "gone")]
    unanswered = [e for e in events if e["event"] == "finish" and e["outcome"] == "unanswered"]

    # Which server was master when: [epoch_start, kill) for each kill, then the last one.
    epochs = [(k.epoch_start, k.at, k.port) for k in chaos.kills]
    epochs.append((chaos.kills[-1].promoted_at if chaos.kills else started, float("inf"), final_port))

    def masters(sent: float, answered: float) -> set[int]:
        """The servers that were master at some moment of [sent, answered]."""
        ports = {p for s, e, p in epochs if s <= answered and sent < e}
        ports |= {k.promoted_port for k in chaos.kills if k.at <= answered and sent < k.promoted_at}
        return ports

    lost: dict[str, Kill] = {}  # tokens whose claim the promoted replica never saw
    for token, c in claims.items():
        for k in chaos.kills:
            here = c["port"] == k.port and k.epoch_start <= c["t"] and c["sent"] < k.at
            if here and counter_of(token) > k.attempts.get(c["job"], 0):
                lost[token] = k

    # 1. Every accepted finish: from the master of its time, with a claim that server saw.
    for f in finishes:
        assert f["port"] in masters(f["sent"], f["t"]), (
            f"a finish was accepted by a server not master then: {f}; started {started}, "
            f"kills {[(k.port, k.epoch_start, k.at, k.promoted_port, k.promoted_at) for k in chaos.kills]}"
        )
        token = f["token"]
        claim = claims.get(token)
        assert claim is not None, f"an accepted finish of a token no claim handed out: {f}"
        for k in chaos.kills:
            if claim["t"] < k.at <= f["sent"]:  # a failover between the claim and the finish
                assert counter_of(token) <= k.attempts.get(f["job"], 0), (
                    f"{f['job']}: a finish was accepted after the kill at {k.at:.3f} from a holder whose "
                    f"claim the promoted master never saw: {f}"
                )
        if token in lost:
            assert f["port"] == lost[token].port and f["sent"] < lost[token].at, f

    # 2. Every job ended where it should.
    rows: dict[str, dict[str, str]] = {jid: r.hgetall(K.job(jid)) for jid in chaos.ids}
    states = Counter(row.get("state", "missing") for row in rows.values())
    assert set(states) <= {"done", "dead", "cancelled"}, states
    for jid, row in rows.items():
        if row["state"] == "dead":
            assert jid in chaos.poison and row["last_error"] == "RuntimeError: poison", (jid, row)
            assert starts[jid], f"{jid} was dead-lettered without having run"
        elif row["state"] == "cancelled":
            assert jid in chaos.cancel_asked, (jid, row)
        else:
            assert jid not in chaos.poison, (jid, row)
            # By a COMPLETE with its token: accepted, or sent and not answered (a master that died).
            done_by = [
                f for f in finishes + unanswered if f["token"] == row["token"] and f["verb"] == "complete"
            ]
            assert done_by, f"{jid} is done, but no holder sent a COMPLETE with its token: {row}"
            end = ends.get(row["token"])
            assert end is not None and end["outcome"] == "returned", (jid, row, end)

    # 3. The overlap of two runs of one job, against the bound.
    runs: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    stopped_at = time.time()
    for jid, ss in starts.items():
        for s in ss:
            end = ends.get(s["token"])
            runs[jid].append((s["t"], end["t"] if end else stopped_at, s["token"]))
    worst, worst_pair = 0.0, None
    overlaps = 0
    for jid, rs in runs.items():
        for i, a in enumerate(rs):
            for b in rs[i + 1 :]:
                o = overlap(a[:2], b[:2])
                if o > 0:
                    overlaps += 1
                    if o > worst:
                        worst, worst_pair = o, (jid, a[2], b[2])

    # Re-runs: runs beyond what a calm run has (1 per job; MAX_ATTEMPTS per poison job).
    reruns = Counter[str]()
    for jid, ss in starts.items():
        expected = MAX_ATTEMPTS if jid in chaos.poison else 1
        extra = len(ss) - expected
        if extra <= 0:
            continue
        earlier = sorted(ss, key=lambda e: e["t"])[:-1]
        for e in earlier[-extra:] if extra <= len(earlier) else earlier:
            end = ends.get(e["token"])
            if e["token"] in lost:
                reruns["claim lost"] += 1
            elif any(f["token"] == e["token"] for f in finishes):
                reruns["finish lost"] += 1  # accepted by a master that died before its replica had it
            elif end is not None and end["lost"]:
                reruns["lease lost"] += 1  # its holder learnt it (deadline passed, stale or gone)
            elif any(f["token"] == e["token"] for f in refused):
                reruns["finish refused"] += 1  # it ended before learning, its finish came too late
            else:
                reruns["finish unanswered"] += 1  # its holder gave up sending its finish in the outage
    stats = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs if out.strip()]
    totals = Counter[str]()
    for s in stats:
        totals.update({k: v for k, v in s.items() if isinstance(v, int) and k != "pid"})
    per_kill = [
        {
            "lost claims": sum(1 for k in lost.values() if k is kill),
            "promoted after (s)": round(kill.promoted_at - kill.at, 2),
        }
        for kill in chaos.kills
    ]
    print(
        f"\nfailover chaos (seed {SEED}, workers' replicas={REPLICAS}): {took:.1f} s, "
        f"{len(chaos.kills)} kills {per_kill}; "
        f"jobs {len(chaos.ids)} (poison {len(chaos.poison)}, cancel asked {len(chaos.cancel_asked)}); "
        f"final states {dict(states)}; claims {len(claims)}, runs {sum(len(v) for v in starts.values())}; "
        f"re-runs caused by the failovers {sum(reruns.values())} {dict(reruns)} "
        f"({sum(reruns.values()) / max(1, len(chaos.kills)):.1f} per failover); "
        f"accepted finishes {len(finishes)}; overlapping pairs {overlaps}, max overlap {worst * 1000:.0f} ms "
        f"{worst_pair} (bound {OVERLAP_BOUND_S * 1000:.0f} ms = lease {LEASE_MS} "
        f"- down-after {DOWN_AFTER_MS} + step {HANDLER_STEP_S * 1000:.0f} + slack {SLACK_S * 1000:.0f}); "
        f"producer retries {chaos.producer_retries}; worker totals {dict(totals)}"
    )
    assert len(chaos.kills) == KILLS
    if REPLICAS:
        ran_lost = [e for ss in starts.values() for e in ss if e["token"] in lost]
        assert not ran_lost, (
            f"with replicas={REPLICAS}, a handler ran a claim the replica never had: {ran_lost}"
        )
    assert worst <= OVERLAP_BOUND_S, (
        f"two runs of {worst_pair} overlapped {worst:.3f} s > {OVERLAP_BOUND_S:.3f} s"
    )
