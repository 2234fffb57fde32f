"""The worker runtime's sans-I/O core, in-process: no server, no threads, no sleeping.

Time is whatever `now` the test passes; replies and exceptions are the
values the drivers would feed in.
"""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError, TimeoutError

from echomq import Cancellation, Cancelled, CancelToken, Job, JobGone, StaleToken, SweepResult
from echomq._runtime import (
    LOST_DEADLINE,
    LOST_GONE,
    LOST_STALE,
    MAX_SWEEPS_PER_TICK,
    SHUTDOWN,
    Action,
    HeldJob,
    LeaseEvent,
    Leases,
    ReaperCore,
    SweepTick,
    WorkerCore,
    error_text,
)

JOB = Job("q", "j", 3, b"")


def held(lease_ms: int = 3000, claimed_at: float = 100.0, interval: float | None = None) -> HeldJob:
    return HeldJob.claimed(JOB, CancelToken(), lease_ms, claimed_at=claimed_at, interval=interval)


# -- deadlines -------------------------------------------------------------------


def test_a_claim_is_confirmed_until_claimed_at_plus_the_lease() -> None:
    h = held(lease_ms=3000, claimed_at=100.0)
    assert h.confirmed_until == 103.0
    assert h.interval == 1.0  # a third of the lease by default
    assert h.time_left(101.5) == 1.5
    assert held(interval=0.25).interval == 0.25
    with pytest.raises(ValueError, match="lease_ms"):
        held(lease_ms=0)


def test_what_next_wait_then_checkpoint_then_lost_at_the_deadline() -> None:
    h = held(lease_ms=3000, claimed_at=100.0)
    assert h.wait_before_checkpoint(100.0) == 1.0
    assert not h.checkpoint_due(100.5)
    assert h.wait_before_checkpoint(101.0) == 0.0 and h.checkpoint_due(101.0)
    # Checkpoints kept failing: the wait ends at the deadline, not later.
    h.next_checkpoint = 110.0
    assert h.wait_before_checkpoint(102.0) == 1.0
    assert h.lost is None and h.cancel.check() is None
    assert h.wait_before_checkpoint(103.0) is None  # at the deadline: lost, nothing more to do
    assert h.lost == LOST_DEADLINE
    c = h.cancel.check()
    assert c is not None and c.reason == LOST_DEADLINE


def test_a_confirmed_checkpoint_counts_from_when_it_was_sent() -> None:
    h = held(lease_ms=3000, claimed_at=100.0)
    assert h.confirmed(sent_at=101.0, now=101.4) is LeaseEvent.CONFIRMED
    assert h.confirmed_until == 104.0  # sent + lease: never later than the server's deadline
    assert h.next_checkpoint == 102.4  # an interval after the answer came
    assert h.extends == 1
    assert not h.expire(103.9) and h.expire(104.0)


def test_after_let_go_no_checkpoint_starts_but_the_deadline_still_counts() -> None:
    h = held(lease_ms=3000, claimed_at=100.0)
    h.stop()
    assert not h.checkpoint_due(101.0)
    assert h.wait_before_checkpoint(101.0) is None and h.lost is None
    # The keeper looks a last time when it has stopped: past the deadline, the job is not ours.
    assert h.expire(103.0) and h.lost == LOST_DEADLINE


# -- outcomes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "reason"),
    [(StaleToken("EMQSTALE extend token mismatch", "j"), LOST_STALE), (JobGone("gone", "j"), LOST_GONE)],
)
def test_stale_and_gone_lose_the_lease(exc: Exception, reason: str) -> None:
    h = held()
    assert h.failed(exc, now=101.0) is LeaseEvent.LOST
    assert h.lost == reason and not h.active
    c = h.cancel.check()
    assert c is not None and c.reason == reason
    assert h.wait_before_checkpoint(101.0) is None


@pytest.mark.parametrize("exc", [ConnectionError("reset"), TimeoutError("slow"), OSError("unreachable")])
def test_connection_trouble_is_retried_an_interval_later(exc: Exception) -> None:
    h = held(lease_ms=3000, claimed_at=100.0)
    assert h.failed(exc, now=101.2) is LeaseEvent.RETRY
    assert h.lost is None and h.cancel.check() is None
    assert h.next_checkpoint == 102.2 and h.confirmed_until == 103.0  # the deadline did not move


def test_a_remote_cancel_is_delivered_and_the_lease_kept() -> None:
    h = held()
    assert h.confirmed(101.0, 101.0, Cancellation("customer withdrew")) is LeaseEvent.CANCEL_REQUESTED
    c = h.cancel.check()
    assert c is not None and c.reason == "customer withdrew"
    assert h.active and h.extends == 1  # the handler winds down under a live lease
    assert h.confirmed(102.0, 102.0, Cancellation("again")) is LeaseEvent.CANCEL_REQUESTED
    assert h.cancel.check() == c  # the first reason stays


def test_the_first_loss_wins_and_late_confirmations_change_nothing() -> None:
    h = held()
    h.failed(StaleToken("stale", "j"), 101.0)
    assert h.failed(JobGone("gone", "j"), 101.1) is LeaseEvent.IGNORED
    assert h.confirmed(101.0, 101.2) is LeaseEvent.IGNORED
    assert h.lost == LOST_STALE and h.extends == 0


def test_after_let_go_the_answer_to_a_checkpoint_in_flight_still_counts() -> None:
    h = held(lease_ms=3000, claimed_at=100.0)
    h.stop()
    assert h.confirmed(101.0, 102.5) is LeaseEvent.CONFIRMED
    assert h.confirmed_until == 104.0 and not h.expire(103.5)  # no false loss at the last look
    assert h.failed(ConnectionError("x"), 102.6) is LeaseEvent.IGNORED  # nothing is retried
    # The worker reads `lost` after its keeper stopped: it must not finish a job it lost.
    assert h.failed(StaleToken("stale", "j"), 102.7) is LeaseEvent.LOST and h.lost == LOST_STALE


# -- the book a single keeper would iterate --------------------------------------


def test_leases_due_wakeup_and_expiry_across_jobs() -> None:
    book = Leases()
    a, b, c = held(claimed_at=100.0), held(claimed_at=100.5), held(lease_ms=600, claimed_at=100.0)
    for h in (a, b, c):
        book.add(h)
    assert book.wakeup_in(100.0) == pytest.approx(0.2)  # c: a third of 600 ms
    assert book.due(101.0) == [a, c]
    assert book.expire(100.7) == [c] and c.lost == LOST_DEADLINE
    assert book.due(101.6) == [a, b]  # a lost job is not checkpointed
    book.discard(a)
    assert list(book) == [b, c] and len(book) == 2
    book.cancel_all(SHUTDOWN)
    assert b.cancel.check() == Cancellation(SHUTDOWN)
    assert Leases().wakeup_in(0.0) is None


# -- the sweep loop --------------------------------------------------------------


def test_a_full_batch_sweeps_again_a_short_one_ends_the_tick() -> None:
    tick = SweepTick(limit=2)
    assert tick.wants_more()
    tick.add(SweepResult(["a"], ["b"]))
    assert tick.wants_more()
    tick.add(SweepResult(["c"], []))
    assert not tick.wants_more()
    assert tick.total == SweepResult(["a", "c"], ["b"]) and tick.sweeps == 2


def test_a_tick_is_bounded() -> None:
    tick = SweepTick(limit=1)
    while tick.wants_more():
        tick.add(SweepResult(["x"], []))
    assert tick.sweeps == MAX_SWEEPS_PER_TICK


def test_the_reaper_counts_and_reports_only_ticks_that_did_something() -> None:
    seen: list[SweepResult] = []
    reaper: ReaperCore[None] = ReaperCore(None, "q", limit=5, on_sweep=seen.append)
    empty = reaper._tick()
    empty.add(SweepResult())
    assert reaper._swept(empty) == SweepResult() and seen == []
    busy = reaper._tick()
    busy.add(SweepResult(["a", "b"], ["c"]))
    assert reaper._swept(busy) == SweepResult(["a", "b"], ["c"])
    assert seen == [SweepResult(["a", "b"], ["c"])]
    assert (reaper.recovered, reaper.dead, reaper.errors) == (2, 1, 0)
    with pytest.raises(ValueError, match="interval"):
        ReaperCore(None, "q", interval=0)


@pytest.mark.xfail(
    strict=True,
    reason="v2 bug: SweepTick keeps only recovered and dead, so a reaper tick's result (and its "
    "on_sweep call) drops the ids SWEEP cancelled and the dead rows it expired; a tick that only "
    "cancelled jobs is reported as having done nothing",
)
def test_a_tick_keeps_what_the_sweep_cancelled_and_expired() -> None:
    seen: list[SweepResult] = []
    reaper: ReaperCore[None] = ReaperCore(None, "q", limit=5, on_sweep=seen.append)
    tick = reaper._tick()
    tick.add(SweepResult([], [], ["c"], 2))
    assert reaper._swept(tick) == SweepResult([], [], ["c"], 2)
    assert seen == [SweepResult([], [], ["c"], 2)]


# -- finishing a job -------------------------------------------------------------


def worker() -> WorkerCore[None, None]:
    return WorkerCore(None, "q", None)


def test_a_handler_that_returned_completes() -> None:
    w, h = worker(), held()
    finish = w._decide(h, None)
    assert finish.action is Action.COMPLETE and finish.job is JOB
    w._landed(finish)
    assert w.stats.completed == 1


def test_a_handler_that_raised_fails_with_the_error_text() -> None:
    w = worker()
    finish = w._decide(held(), ValueError("bad input"))
    assert finish.action is Action.FAIL and finish.error == "ValueError: bad input"
    w._landed(finish, "pending")
    w._landed(w._decide(held(), Cancelled("shutdown")), "cancelled")
    assert (w.stats.failed, w.stats.cancelled) == (1, 1)
    assert error_text(Cancelled("customer withdrew")) == "cancelled: customer withdrew"
    assert error_text(Cancelled()) == "cancelled"


def test_a_lost_lease_sends_nothing_whatever_the_handler_did() -> None:
    for error in (None, RuntimeError("boom")):
        w, h = worker(), held()
        h.failed(StaleToken("stale", "j"), 101.0)
        assert w._decide(h, error).action is Action.DROP
        assert w.stats.leases_lost == 1 and w.stats.completed == w.stats.failed == 0


def test_a_refused_finish_is_counted() -> None:
    w = worker()
    w._refused(w._decide(held(), None), StaleToken("stale", "j"))
    assert w.stats.rejected == 1 and w.stats.completed == 0


def test_stop_cancels_running_handlers_and_a_claim_after_stop_at_once() -> None:
    w, running = worker(), held()
    w._took(running)
    assert running.cancel.check() is None
    w._request_stop()
    assert running.cancel.check() == Cancellation(SHUTDOWN)
    late = held()
    w._took(late)  # a claim that was in flight when stop() came
    assert late.cancel.check() == Cancellation(SHUTDOWN)
    w._let_go(running)
    w._let_go(late)
    assert len(w._held) == 0
    w._begin()
    fresh = held()
    w._took(fresh)
    assert fresh.cancel.check() is None


def test_worker_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        WorkerCore(None, "q", None, concurrency=0)
