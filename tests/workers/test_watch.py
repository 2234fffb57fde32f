"""The deadline watch (one thread for every held job's deadline): no deadline is missed, none is early,
and the thread is gone when nothing is watched."""

from __future__ import annotations

import random
import threading
import time

from echomq import CancelToken, Job
from echomq._runtime import LOST_DEADLINE, HeldJob
from echomq._watch import DeadlineWatch

from ..calibration import budget

JOB = Job("q", "j", "1-00000000000000aa", b"")


def held(lease_ms: int) -> HeldJob:
    return HeldJob.claimed(JOB, CancelToken(), lease_ms, claimed_at=time.monotonic())


def test_every_deadline_is_seen_on_time_however_jobs_come_and_go() -> None:
    watch = DeadlineWatch()
    watch.retain()
    rng = random.Random(23)
    entries: list[tuple[HeldJob, float]] = []
    lock = threading.Lock()
    try:
        # Added from several threads while the watch is looking and sleeping,
        # with deadlines both before and after the ones it already sleeps for.
        def add_some() -> None:
            for _ in range(40):
                h = held(rng.randint(50, 400))
                with lock:
                    entries.append((h, h.confirmed_until))
                watch.add(h, threading.Lock())
                time.sleep(rng.random() * 0.01)

        lost_at: dict[int, float] = {}
        done = threading.Event()

        def monitor() -> None:  # when each token was cancelled, to 5 ms
            while not done.is_set():
                now = time.monotonic()
                with lock:
                    for h, _ in entries:
                        if h.cancel.cancelled and id(h) not in lost_at:
                            lost_at[id(h)] = now
                time.sleep(0.005)

        threads = [threading.Thread(target=add_some) for _ in range(4)]
        watcher = threading.Thread(target=monitor)
        for t in [*threads, watcher]:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.6)
        done.set()
        watcher.join()
        assert len(entries) == 160
        late = sorted(lost_at[id(h)] - deadline for h, deadline in entries)
        for h, _ in entries:
            assert h.lost == LOST_DEADLINE, "a deadline was missed"
        assert late[0] >= 0, "a lease was lost before its deadline"
        # On time: a watch asleep for the wrong deadline is late for most (by 100-350 ms); a busy
        # machine's scheduler makes a few late too (a fresh clone's CI saw one 364 ms late beside
        # four test processes on two cores), so the typical one is held tight, the worst loosely.
        assert late[len(late) // 2] < budget(0.05, under=0.1), f"typically late: {late[len(late) // 2]:.3f} s"
        assert late[-1] < budget(0.2, under=0.55), f"the latest: {late[-1]:.3f} s"
    finally:
        for h, _ in entries:
            watch.remove(h)
        watch.release()
    assert not watch.running


def test_a_deadline_is_never_lost_early_and_a_confirmed_one_moves() -> None:
    watch = DeadlineWatch()
    lock = threading.Lock()
    h = held(300)
    watch.add(h, lock)
    try:
        time.sleep(0.2)
        with lock:
            h.confirmed(time.monotonic(), time.monotonic())  # a checkpoint: 300 ms more
        time.sleep(0.2)
        assert h.lost is None  # the first deadline has passed, the confirmed one has not
        time.sleep(0.2)
        assert h.lost == LOST_DEADLINE
    finally:
        watch.remove(h)
    assert not watch.running  # nothing watched, nothing retained: the thread is gone
