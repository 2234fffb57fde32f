"""The worker runtime's sans-I/O core, in-process: no server, no threads, no sleeping.

Time is whatever `now` the test passes; replies and exceptions are the
values the drivers would feed in.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from redis.exceptions import (
    BusyLoadingError,
    ConnectionError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
)

from echomq import (
    Cancellation,
    Cancelled,
    CancelToken,
    Job,
    JobGone,
    ModuleNotLoaded,
    StaleToken,
    SweepResult,
)
from echomq._runtime import (
    ATTEMPT_TIMEOUT_CAP_S,
    FORCE_AFTER_S,
    LOST_DEADLINE,
    LOST_GONE,
    LOST_STALE,
    MAX_SWEEPS_PER_TICK,
    SHUTDOWN,
    TRY_FLOOR_S,
    Action,
    Backoff,
    ClaimStep,
    HeldJob,
    LeaseEvent,
    Leases,
    ReaperCore,
    SweepTick,
    Trouble,
    WorkerCore,
    error_text,
    takes_context,
    trouble,
)

pytestmark = pytest.mark.once

JOB = Job("q", "j", "3-00000000000000aa", b"")


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
    h = held(lease_ms=30_000, claimed_at=100.0)  # interval 10 s
    assert h.failed(exc, now=110.0) is LeaseEvent.RETRY
    assert h.lost is None and h.cancel.check() is None
    assert h.next_checkpoint == 111.0 and h.confirmed_until == 130.0  # CHECKPOINT_RETRY_S; the deadline stays
    h = held(lease_ms=3000, claimed_at=100.0)
    assert h.failed(exc, now=101.0) is LeaseEvent.RETRY
    assert h.next_checkpoint == 102.0  # an interval: half-way to the deadline or sooner


def test_a_late_checkpoint_leaves_time_to_retry_before_the_deadline() -> None:
    # The asyncio keeper on a loaded machine (issue 39): a 1.5 s lease, its checkpoint sent at
    # 0.5 s and given up at the end of its timeout (an interval) at 1.0 s.  The retry came an
    # interval later, at the deadline itself: one slow answer lost the lease.
    h = held(lease_ms=1500, claimed_at=100.0)
    assert h.wait_before_checkpoint(100.5) == 0.0
    assert h.checkpoint_timeout(100.5) == pytest.approx(0.5)
    assert h.failed(TimeoutError("no reply to a try within 0.500 s"), now=101.0) is LeaseEvent.RETRY
    assert h.next_checkpoint == pytest.approx(101.25)  # half-way to the deadline (101.5)
    assert h.wait_before_checkpoint(101.25) == 0.0  # sent, not expired
    assert h.checkpoint_timeout(101.25) == pytest.approx(0.25)  # answered before the deadline, or lost
    assert h.confirmed(101.25, 101.3) is LeaseEvent.CONFIRMED and h.lost is None


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


def test_a_tick_keeps_what_the_sweep_cancelled_and_expired() -> None:
    seen: list[SweepResult] = []
    reaper: ReaperCore[None] = ReaperCore(None, "q", limit=5, on_sweep=seen.append)
    tick = reaper._tick()
    tick.add(SweepResult([], [], ["c"], 2))
    assert reaper._swept(tick) == SweepResult([], [], ["c"], 2)
    assert seen == [SweepResult([], [], ["c"], 2)]


# -- finishing a job -------------------------------------------------------------


def worker(**settings: object) -> WorkerCore[None, object]:
    return WorkerCore(None, "q", lambda ctx: None, **settings)  # type: ignore[arg-type]


def test_a_handler_that_returned_completes() -> None:
    w, h = worker(), held()
    finish = w._decide(h, None)
    assert finish.action is Action.COMPLETE and finish.job is JOB
    assert h.finishing  # a forced stop leaves a job being finished to its finish
    w._landed(finish)
    assert w.stats.completed == 1


def test_a_handler_that_raised_fails_with_the_error_text() -> None:
    w = worker()
    finish = w._decide(held(), ValueError("bad input"))
    assert finish.action is Action.FAIL and finish.error == "ValueError: bad input"
    w._landed(finish, "pending")
    w._landed(w._decide(held(), Cancelled("customer withdrew")), "cancelled")
    assert (w.stats.failed, w.stats.cancelled) == (1, 1)
    assert error_text(Cancelled("customer withdrew")) == "cancelled: customer withdrew"
    assert error_text(Cancelled()) == "cancelled"


def test_a_lost_lease_sends_nothing_whatever_the_handler_did() -> None:
    for error in (None, RuntimeError("boom"), KeyboardInterrupt()):
        w, h = worker(), held()
        h.failed(StaleToken("stale", "j"), 101.0)
        assert w._decide(h, error, isinstance(error, KeyboardInterrupt)).action is Action.DROP
        assert w.stats.leases_lost == 1 and w.stats.completed == w.stats.failed == 0


def test_a_refused_finish_is_counted() -> None:
    w = worker()
    w._refused(w._decide(held(), None), StaleToken("stale", "j"))
    assert w.stats.rejected == 1 and w.stats.completed == 0


def test_a_handlers_own_base_exception_fails_its_job_and_stops_the_worker() -> None:
    # Issue 29: a handler calling sys.exit() used to give its job back without
    # using a try, so the job crash-looped its workers forever.
    w, h = worker(), held()
    w._took(h)
    exit_ = SystemExit(3)
    finish = w._decide(h, exit_, interrupted=True)
    w._teach(finish, exit_)
    assert finish.action is Action.FAIL and finish.error == "SystemExit: 3"
    assert finish.trace is not None and "SystemExit: 3" in finish.trace
    w._interrupted(exit_, now=100.0)
    assert w._stop_requested and w._interrupt is exit_
    w._interrupted(KeyboardInterrupt(), now=100.1)
    assert w._interrupt is exit_  # the first is what run() raises
    w._landed(finish, "pending")
    assert w.stats.released == 0 and w.stats.failed == 1


def test_shutdown_grace_then_tokens_then_force() -> None:
    w = worker(grace=2.0)
    running, finishing = held(), held()
    w._took(running)
    w._took(finishing)
    assert w._shutdown_tick(100.0) is None  # no shutdown in progress
    assert w._request_stop(now=100.0) is True
    assert w._request_stop(now=100.5, grace=5.0) is False  # a second request never lengthens it
    assert w._shutdown_tick(101.0) == pytest.approx(1.0)
    assert running.cancel.check() is None  # the grace: handlers may finish
    assert w._shutdown_tick(102.0) == pytest.approx(FORCE_AFTER_S)
    assert running.cancel.check() == Cancellation(SHUTDOWN)
    # A handler that raises after "shutdown" has its job given back, not failed.
    assert w._decide(finishing, Cancelled(SHUTDOWN)).action is Action.RELEASE
    assert w._shutdown_tick(102.0 + FORCE_AFTER_S) == 0.0  # time to force
    assert w._force() == [running]  # the job being finished is left to its finish
    assert running.given_back and not finishing.given_back
    assert w._decide(running, None).action is Action.DROP  # its handler ended after all: nothing more


def test_a_claim_in_flight_when_stop_came_is_given_back_unrun() -> None:
    w = worker()
    w._request_stop(now=100.0, grace=0)
    late = held()
    assert w._took(late) is False and late.given_back
    assert len(w._held) == 0


def test_signals_first_graceful_second_forced() -> None:
    import signal

    w = worker(grace=30.0)
    assert w._on_signal(signal.SIGTERM, 100.0) is False and w._stop_requested
    assert w._interrupt is None  # a graceful stop: run() returns
    assert w._on_signal(signal.SIGTERM, 100.1) is True
    assert isinstance(w._interrupt, SystemExit) and w._interrupt.code == 128 + signal.SIGTERM
    w = worker()
    w._on_signal(signal.SIGINT, 1.0)
    w._on_signal(signal.SIGINT, 1.1)
    assert isinstance(w._interrupt, KeyboardInterrupt)


def test_worker_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        worker(concurrency=0)
    with pytest.raises(TypeError, match="concurrency"):
        worker(concurrency="4")
    with pytest.raises(ValueError, match="lease_ms"):
        worker(lease_ms=-1)
    with pytest.raises(TypeError, match="lease_ms"):
        worker(lease_ms=1.5)
    with pytest.raises(ValueError, match="grace"):
        worker(grace=-1)
    with pytest.raises(ValueError, match="extend_interval"):
        worker(lease_ms=1000, extend_interval=1.0)
    with pytest.raises(ValueError, match="poll_interval"):
        worker(poll_interval=float("nan"))
    with pytest.raises(ValueError, match="must not contain"):
        WorkerCore(None, "a{b}", lambda ctx: None)
    with pytest.raises(TypeError, match="handler"):
        WorkerCore(None, "q", "not a function")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="handler must take one argument"):
        WorkerCore(None, "q", lambda a, b, c: None)
    with pytest.raises(ValueError, match="max_stalled"):
        ReaperCore(None, "q", max_stalled=0)
    with pytest.raises(TypeError, match="on_sweep"):
        ReaperCore(None, "q", on_sweep=5)  # type: ignore[arg-type]


def test_the_handler_style_is_told_by_its_signature() -> None:
    def new(ctx: object) -> None: ...
    def old(job: object, cancel: object) -> None: ...

    class Callable_:
        def __call__(self, ctx: object) -> None: ...

    assert takes_context(new) and takes_context(Callable_()) and takes_context(lambda *a: None)
    assert not takes_context(old) and not takes_context(lambda job, tok: None)
    assert takes_context(print)  # no readable signature: the current style


# -- retrying and errors ---------------------------------------------------------


def test_backoff_waits_grow_and_stop_at_the_deadline() -> None:
    b = Backoff(until=10.0, jitter=lambda: 1.0)  # no jitter: the upper waits
    waits = [b.next_wait(0.0) for _ in range(7)]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    # A try waits a third of the time left at most (a lost one leaves room for another on a
    # fresh connection), not under TRY_FLOOR_S, never past the deadline.
    assert b.timeout(0.0) == pytest.approx(10.0 / 3) and b.timeout(9.5) == TRY_FLOOR_S == 0.25
    assert b.timeout(9.9) == pytest.approx(0.1)
    assert Backoff(until=None).timeout(0.0) == 2.0
    assert Backoff(until=1e6, jitter=lambda: 1.0).timeout(0.0) <= ATTEMPT_TIMEOUT_CAP_S
    assert b.next_wait(9.99) == pytest.approx(0.01)
    assert b.next_wait(10.0) is None
    assert Backoff(until=None).next_wait(1e9) is not None
    assert Backoff(until=5.0, jitter=lambda: 0.0).next_wait(0.0) == 0.025  # jitter halves at most


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ConnectionError("reset"), Trouble.TRANSIENT),
        (TimeoutError("slow"), Trouble.TRANSIENT),
        (BusyLoadingError("loading"), Trouble.TRANSIENT),
        (OutOfMemoryError("command not allowed"), Trouble.TRANSIENT),
        (NoPermissionError("this user has no permissions"), Trouble.PERMANENT),
        (ReadOnlyError("You can't write against a read only replica."), Trouble.PERMANENT),
        (
            ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
            Trouble.PERMANENT,
        ),
        (ModuleNotLoaded("no module"), Trouble.PERMANENT),
        (TypeError("a bug"), Trouble.PERMANENT),
    ],
)
def test_errors_are_told_apart(exc: BaseException, kind: Trouble) -> None:
    assert trouble(exc) is kind


def test_troubles_log_each_kind_once_and_count_every_one(caplog: pytest.LogCaptureFixture) -> None:
    w = worker()
    caplog.set_level(logging.DEBUG, logger="echomq.worker")
    for _ in range(3):
        w._trouble(NoPermissionError("this user has no permissions to run the 'emq.claim' command"), "claim")
        w._trouble(ConnectionError("Connection refused"), "claim")
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.levelname for r in errors] == ["ERROR", "WARNING"]
    assert "no permissions" in errors[0].getMessage() and "retrying will not fix" in errors[0].getMessage()
    assert (w.stats.permanent_errors, w.stats.connection_errors) == (3, 3)
    assert w.stats.last_permanent_error is not None and "NoPermissionError" in w.stats.last_permanent_error
    w._healed()  # the outage is over: the next connection error is news again
    w._trouble(ConnectionError("Connection refused"), "claim")
    assert [r.levelname for r in caplog.records if r.levelno >= logging.WARNING][-1] == "WARNING"
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 2


def test_a_claim_keeps_its_request_id_until_jobs_come_back() -> None:
    from echomq._protocol import claim

    step = ClaimStep()
    made: list[object] = []

    def make() -> Any:
        made.append(claim("q", 1000))
        return made[-1]

    first, since = step.next(make, 10.0)
    assert since == 10.0
    step.answered([])  # nothing claimable: the same REQ goes out again...
    again, since = step.next(make, 11.0)
    assert again is first and since == 11.0  # ...and, every send answered so far, the lease counts from now
    step.failed()  # an attempt got no answer: the server may have claimed for it at 11.0 or later
    step.answered([])
    retry, since = step.next(make, 15.0)
    assert retry is first and since == 11.0  # never later than the first send that may have claimed
    step.answered([JOB])  # jobs came back: the request is over
    fresh, since = step.next(make, 16.0)
    assert fresh is not first and since == 16.0 and len(made) == 2
    assert fresh.args[-1] != first.args[-1]  # a new REQ


# -- issue 27: settling claims, batched checkpoints, refused ends, the subscription ----------


def test_a_claim_whose_answer_was_lost_is_unresolved_until_an_answer_comes() -> None:
    from echomq._protocol import claim

    step = ClaimStep()
    call, _ = step.next(lambda: claim("q", 1000, 4, 200), 10.0)
    assert not step.unresolved and step.waiting  # a waiting claim (BLOCK)
    step.failed()  # no answer: the server may hold jobs for this REQ that nobody runs
    assert step.unresolved
    again = step.resolving()  # the same REQ, without BLOCK: answered at once from its record
    assert "BLOCK" not in again.args and again.args[-1] == call.args[-1] and "COUNT" in again.args
    step.answered([])
    assert not step.unresolved and step.troubled  # answered; the lease still counts from the first send
    step.adopt(claim("q", 1000, request_id=b"r1"), 20.0)  # a COMPLETECLAIM's claim half
    step.failed()
    assert step.unresolved and not step.waiting  # one that does not wait may well have taken a job


def test_an_error_reply_is_no_lost_reply() -> None:
    from echomq._runtime import reply_lost
    from echomq._runtime.tries import NotSent

    assert reply_lost(TimeoutError("no reply")) and reply_lost(ConnectionError("reset"))
    assert not reply_lost(NotSent("no free connection"))  # nothing left
    assert not reply_lost(OutOfMemoryError("OOM"))  # the server answered: nothing ran


def keepers_at(*due_in: float, interval: float = 1.0) -> list[Any]:
    """Stand-ins for the worker's keepers (their lock, their HeldJob, a clock at 100.0)."""
    import threading
    from types import SimpleNamespace

    out = []
    for n, left in enumerate(due_in):
        h = held(lease_ms=3000, claimed_at=100.0 - interval + left, interval=interval)
        h.confirmed_until = 103.0 + n * 0.001
        out.append(SimpleNamespace(_lock=threading.Lock(), _held=h, _clock=lambda: 100.0, name=n))
    return out


def test_a_keeper_round_batches_the_jobs_due_and_those_due_soon() -> None:
    from echomq._runtime import CHECKPOINT_EARLY, checkpoint_round

    keepers = keepers_at(0.0, -0.5, 0.1, CHECKPOINT_EARLY + 0.1, 0.9)
    batch, wait = checkpoint_round(keepers)  # type: ignore[arg-type]
    assert [k.name for k in batch] == [0, 1, 2]  # due now, and within a quarter interval: one pipeline
    assert wait == pytest.approx(CHECKPOINT_EARLY + 0.1)  # the next one not taken
    none_due, wait = checkpoint_round(keepers_at(0.2, 0.6))  # type: ignore[arg-type]
    assert none_due == [] and wait == pytest.approx(0.2)  # nothing due: sleep until the first
    many, wait = checkpoint_round(keepers_at(*[0.0] * 7), limit=5)  # type: ignore[arg-type]
    assert len(many) == 5 and wait == 0.0  # a bounded batch; the rest at once
    assert checkpoint_round([]) == ([], None)


def test_a_checkpoint_waits_longer_after_each_one_without_an_answer() -> None:
    h = held(lease_ms=30_000)  # interval 10 s
    assert h.checkpoint_timeout(100.0) == pytest.approx(2.0)  # not a whole interval: a half-open connection
    h.failed(TimeoutError(), 100.0)
    assert h.checkpoint_timeout(101.0) == pytest.approx(4.0)
    h.confirmed(101.0, 101.5)
    assert h.checkpoint_timeout(102.0) == pytest.approx(2.0)


def test_a_job_given_back_loses_no_lease_to_its_own_release() -> None:
    w, h = worker(), held()
    w._took(h)
    assert w._force() == [h] and h.given_back
    assert not h.active  # no more checkpoints for it
    assert h.failed(StaleToken("stale", "j"), 101.0) is LeaseEvent.IGNORED  # its own RELEASE's doing
    assert h.lost is None and h.cancel.check() == Cancellation(SHUTDOWN)
    assert w._decide(h, Cancelled(SHUTDOWN)).action is Action.DROP and w.stats.leases_lost == 0


def test_a_refused_fail_is_tried_again_until_the_worker_stops_then_given_back() -> None:
    w, h = worker(), held()
    w._took(h)
    fail = w._decide(h, ValueError("boom"))
    assert fail.action is Action.FAIL
    again = w._fail_refused(fail, OutOfMemoryError("OOM"), 100.0, 100.0)
    assert again is fail  # the driver keeps the lease with EXTEND and sends it again
    assert w._fail_refused(fail, OutOfMemoryError("OOM"), 100.0, 160.0) is fail  # a minute: still
    w._request_stop(161.0)
    back = w._fail_refused(fail, OutOfMemoryError("OOM"), 100.0, 161.0)
    assert back.action is Action.RELEASE and back.error == "ValueError: boom"


def test_a_forced_stop_bounds_every_command() -> None:
    w = worker()
    assert w._bounded(None) is None and w._bounded(200.0) == 200.0
    w._force(now=100.0)
    assert w._bounded(None) == pytest.approx(100.4) and w._bounded(200.0) == pytest.approx(100.4)
    assert w._bounded(100.1) == 100.1


def test_a_subscription_is_pinged_only_while_jobs_are_held() -> None:
    from echomq._runtime import HEALTH_EVERY_S, PONG_WITHIN_S, SubscriptionHealth

    health = SubscriptionHealth(100.0)
    assert health.next(100.0 + 10 * HEALTH_EVERY_S, holding=False) == "ok"  # idle: no pings
    assert health.next(101.0 + HEALTH_EVERY_S, holding=True) == "ping"
    assert health.next(101.0 + HEALTH_EVERY_S, holding=True) == "ok"  # waiting for the pong
    health.heard_from(101.5 + HEALTH_EVERY_S)  # it came
    later = 101.5 + 2 * HEALTH_EVERY_S
    assert health.next(later, holding=True) == "ping"
    assert health.next(later + PONG_WITHIN_S, holding=True) == "dead"  # half-open: subscribe again


def test_a_subscription_confirmed_again_was_made_again() -> None:
    from echomq._runtime import SubscriptionHealth

    health = SubscriptionHealth(100.0)
    assert not health.confirmed()  # its own subscription
    assert health.confirmed() and health.confirmed()  # redis-py's, after a dropped connection: ask now


# -- issue 34 and 30: slots, the idle claim, the worker's sweep, timeouts -------------------------


def test_a_worker_never_claims_past_its_slots_and_prefetch() -> None:
    from echomq._runtime import Slots

    slots = Slots(3, prefetch=2)
    assert slots.free() == 5
    slots.reserve(5)  # a claim in flight for every slot
    assert slots.free() == 0
    slots.answered(5, 2)  # it brought two
    assert slots.free() == 3 and slots.owned == 2
    slots.ended()  # a handler ended: its slot is free
    assert slots.free() == 4
    slots.ended(9)  # never below nothing
    assert slots.owned == 0 and slots.free() == 5
    with pytest.raises(ValueError, match="prefetch"):
        Slots(1, prefetch=-1)


def test_an_idle_claim_waits_on_the_server_where_a_stop_can_cut_it_else_polls_with_a_backoff() -> None:
    from echomq._runtime import IDLE_BLOCK_S, IDLE_POLL_MAX_S, MAX_CLAIM_BLOCK_S, IdleWait

    idle = IdleWait(0.2, 30_000, jitter=lambda: 0.5)  # jitter at its middle: the pause itself
    assert idle.block_ms(cuttable=True) == IDLE_BLOCK_S * 1000  # one command per 5 s
    assert IdleWait(0.2, 3_000).block_ms(cuttable=True) == 500  # at most a sixth of the lease
    assert idle.block_ms(cuttable=True, read_limit_ms=4_000) == 4_000  # a cluster client's reads
    assert IdleWait(0.2, 3_000).block_ms(cuttable=True, read_limit_ms=4_000) == 500
    assert idle.block_ms(cuttable=False) == 200  # a single connection: poll_interval, at most a second
    assert IdleWait(5.0, 30_000).block_ms(cuttable=False) == MAX_CLAIM_BLOCK_S * 1000
    assert idle.after(0, 5.0, blocks=True, cuttable=True) == 0.0  # the module waited: claim again now
    assert idle.after(0, 0.15, blocks=True, cuttable=False) == pytest.approx(0.05)  # the rest of the poll
    # The scripts backend cannot wait: 0.2, 0.4, 0.8, 1.6, then IDLE_POLL_MAX_S between polls ...
    pauses = [idle.after(0, 0.0, blocks=False, cuttable=True) for _ in range(7)]
    assert pauses == pytest.approx([0.2, 0.4, 0.8, 1.6, IDLE_POLL_MAX_S, IDLE_POLL_MAX_S, IDLE_POLL_MAX_S])
    # ... and a claim that brings a job starts over.
    assert idle.after(1, 0.0, blocks=False, cuttable=True) == 0.0
    assert idle.after(0, 0.0, blocks=False, cuttable=True) == pytest.approx(0.2)


def test_a_claims_count_is_read_back_from_its_command() -> None:
    from echomq._protocol import claim
    from echomq._runtime import count_of

    assert count_of(claim("q", 1000)) == 1 and count_of(claim("q", 1000, 7, 5000)) == 7


def test_a_claim_step_renews_only_a_request_that_no_lost_reply_put_in_doubt() -> None:
    from echomq._protocol import claim

    step = ClaimStep()
    step.next(lambda: claim("q", 1000, 4, 200), 10.0)
    step.answered([])
    step.renew()  # every try answered: nothing held for its REQ, a new one may ask for another count
    assert step.call is None
    call, _ = step.next(lambda: claim("q", 1000, 2, 200), 11.0)
    step.failed()
    step.renew()  # in doubt: the same REQ until an answer comes
    assert step.call is call


def test_workers_sweep_at_jittered_times_and_boundedly() -> None:
    from echomq._runtime import REAP_LIMIT, REAP_SWEEPS_PER_TURN, ReapSchedule

    draws = iter([0.0, 1.0, 0.5])
    schedule = ReapSchedule(10.0, 100.0, jitter=lambda: next(draws))
    assert schedule.wait(100.0) == pytest.approx(5.0)  # the first turn after half an interval ...
    schedule.swept(105.0)
    assert schedule.wait(105.0) == pytest.approx(15.0)  # ... the next after one and a half ...
    schedule.swept(120.0)
    assert schedule.wait(120.0) == pytest.approx(10.0)  # ... on average one interval
    w = worker(max_stalled=2)
    call = w._reap_call()
    assert call.args[0] == "EMQ.SWEEP" and call.args[-2:] == (2, REAP_LIMIT)
    tick = w._reap_tick()
    full = SweepResult([f"j{n}" for n in range(REAP_LIMIT)], [], [], 0)
    while tick.wants_more():
        tick.add(full)  # a full batch each time: sweep again, but not for ever
    assert tick.sweeps == REAP_SWEEPS_PER_TURN
    w._reaped(tick)
    assert w.stats.reaped == REAP_LIMIT * REAP_SWEEPS_PER_TURN


def test_a_handler_past_its_timeout_is_told_then_abandoned_and_its_job_failed() -> None:
    import math

    from echomq._runtime import TIMEOUT

    w, h = worker(timeout_ms=1000, timeout_grace=2.0), held()
    w._took(h)
    assert w._time_handler(h, 100.0) == pytest.approx(101.0)
    assert (h.timeout_at, h.abandon_at) == pytest.approx((101.0, 103.0))
    assert not h.time_out(100.9) and h.cancel.check() is None
    assert h.time_out(101.0) and h.cancel.check() == Cancellation(TIMEOUT)  # the deadline watch's call
    assert h.next_deadline() == h.confirmed_until  # told once
    assert w._abandon_due(102.9) == [] and w._next_abandon(102.0) == pytest.approx(1.0)
    assert w._abandon_due(103.0) == [h]
    finish = w._abandon(h)
    assert finish.action is Action.FAIL and finish.error == (
        "TimeoutError: the handler ran longer than its timeout (1000 ms)"
    )
    assert w.stats.abandoned == 1 and not h.active and w._abandon_due(104.0) == []
    assert w._decide(h, None).action is Action.DROP  # it returned later: its job was failed already
    assert w.stats.timed_out == 1  # an abandoned handler timed out too (it stayed 0: issue 39)
    assert h.lose("stale") is LeaseEvent.IGNORED  # its FAIL's doing, no lost lease
    plain = worker()
    assert plain._time_handler(held(), 100.0) == math.inf  # no timeout_ms: no limit


def test_a_timed_out_handler_that_raises_fails_with_the_timeouts_error_and_one_that_returns_completes() -> (
    None
):
    from echomq._runtime import TIMEOUT

    w = worker(timeout_ms=300)
    raised, returned = held(), held()
    for h in (raised, returned):
        w._took(h)
        w._time_handler(h, 100.0)
        h.cancel.cancel(TIMEOUT)
    fail = w._decide(raised, Cancelled(TIMEOUT))
    assert fail.action is Action.FAIL and fail.error.startswith("TimeoutError: the handler ran longer")
    assert w._decide(returned, None).action is Action.COMPLETE
    assert w.stats.timed_out == 2
    with pytest.raises(ValueError, match="timeout_ms"):
        worker(timeout_ms=0)


# -- per-job settings and the handler's say in a failure (issue 29) ---------------------


class Settled:
    """A handler that gives every job its own settings (the task layer's dispatcher does)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def __call__(self, ctx: object) -> None: ...

    def job_settings(self, job: Job) -> Any:
        return self.settings


def test_a_job_fails_with_its_own_tries_and_the_handlers_say() -> None:
    from echomq import NonRetryable, RetryLater, RetryPolicy
    from echomq._runtime import JobSettings, StoredResult

    policy = RetryPolicy(max_attempts=3, backoff="fixed", base_ms=500)
    w = WorkerCore(
        None, "q", Settled(JobSettings(max_attempts=7, timeout_ms=250, lease_ms=60_000)), retry=policy
    )  # type: ignore[arg-type,var-annotated]
    failed = w._decide(held(), RuntimeError("upstream 500"))
    w._teach(failed, RuntimeError("upstream 500"))
    args = w._end_call(failed).args
    assert args[7] == 7 and args[args.index("DELAY") + 1] == 500  # its own tries, the worker's delays
    assert "TRACE" in args and "DEAD" not in args
    later = w._decide(held(), RetryLater("busy", delay_ms=9000))
    assert w._end_call(later).args[w._end_call(later).args.index("DELAY") + 1] == 9000
    dead = w._end_call(w._decide(held(), NonRetryable("declined"))).args
    assert dead[-1] == "DEAD"
    assert w._timeout_for(JOB) is not None and w._timeout_for(JOB).timeout_ms == 250  # type: ignore[union-attr]
    assert w._lease_for(JOB) == (60_000, 10.0)  # the first checkpoint within a third of the claim's lease
    done = w._decide(held(), None, value=StoredResult(b"json\n1"))
    assert w._end_call(done).args[-2:] == ("RESULT", b"json\n1")
    assert w._decide(held(), None, value=b"raw bytes").result is None  # only a StoredResult is stored
