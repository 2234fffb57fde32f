"""How a thread worker sends what ends a job's hold, and settles what its claims answered.

The ends of the jobs its threads finished meanwhile go in one pipeline with
the claim of as many jobs as its threads are free (``_send_batch``: the
claim rides in the last COMPLETE, as EMQ.COMPLETECLAIM ... COUNT).  That is
one try; an end it could not settle is sent the ordinary way (``_finish``:
again after a lost reply until it lands or the job's lease ends, and a
forced stop's budget, ``WorkerCore._bounded``; a FAIL refused past
maxmemory keeps its lease with EXTEND, ``WorkerCore._fail_refused``), and a
claim whose answer was lost is asked again by its REQ (``_ask_again``; as
the worker ends, ``_resolve``), its jobs run or given back.  ``worker.py``
runs the threads; this is the part of its loop that sends, the "finisher".

Hand-written beside its twin ``asyncio/_finisher.py``, not generated from it
(``tests/unasync.py``): a thread worker's ends ride its threads' turns (``_turns.py``), an
asyncio worker's are gathered from its runner tasks by the Coalescer (``_together.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from .. import _protocol as proto
from .._runtime import (
    ATTEMPT_TIMEOUT_S,
    Action,
    Backoff,
    ClaimStep,
    Finish,
    HeldJob,
    Trouble,
    WorkerCore,
    reply_lost,
    result_refused,
    state_refused,
)
from ..cancel import CancelToken
from ..errors import JobGone, LeaseLost
from ._attempt import NotSent
from .client import Client, Job

__all__ = ["Finisher"]

T = TypeVar("T")
HandlerT = TypeVar("HandlerT")

# A stopping thread asks a lost claim's answer again with tries of at most
# this long each (a server that does not answer does not hold the stop long).
SETTLE_TRY_S = 1.0
# Jobs given back together go as pipelines of at most this many RELEASEs.
GIVE_BACK_BATCH = 500


class _GaveUp(Exception):
    """No answer before the deadline (or a forced stop's budget); the cause is the last error.

    ``budget_at``: when the forced stop's budget, not the deadline, ended the tries (for the log).
    """

    def __init__(self, doing: str, budget_at: float | None = None) -> None:
        super().__init__(doing)
        self.budget_at = budget_at


class _Refused(Exception):
    """The server refused a command with an error that ends its tries (the cause); nothing was written."""


class _Stopped(Exception):
    """A claim not sent (again): the worker stops; its thread's ``_settle`` asks a lost answer again."""


@dataclass(slots=True)
class Sent:
    """What one batch's round trip left to do (``Finisher._send_batch``)."""

    claimed_at: float
    jobs: list[Job] = field(default_factory=list)  # claimed: to run
    slow: list[Finish] = field(default_factory=list)  # ends to send the ordinary way
    doubt: ClaimStep | None = None  # a claim whose answer was lost: ask again by its REQ


class Finisher(WorkerCore[Client, HandlerT]):
    """The sending half of the thread ``Worker`` (see the module docstring)."""

    _lock: threading.Lock
    _wake: threading.Event
    _forced_event: threading.Event
    _complete_claim: bool
    _doubts: set[ClaimStep]

    def _resolve(self, step: ClaimStep) -> list[Job]:
        """A stopping worker asks a claim whose answer was lost again (its REQ, without BLOCK).

        The jobs it took are returned, for the caller to give back: a job a
        claim answered is run or released.  Bounded by the jobs' lease and
        by stop; a server that cannot be reached at all is not waited for
        when the claim was only waiting on it (``ClaimStep.waiting``).
        """
        if not step.unresolved:
            return []
        call = step.resolving()
        now = time.monotonic()
        until = max(step.since + self.lease_ms / 1000, now + min(ATTEMPT_TIMEOUT_S, self.lease_ms / 3000))
        unreachable = _cannot_tell if step.waiting else None
        try:
            jobs = self._send_until(
                partial(self.client._attempt, call), until, "claim", cap_s=SETTLE_TRY_S,
                refusal=unreachable, floor=now + SETTLE_TRY_S,
            )  # fmt: skip
        except (_GaveUp, _Refused, LeaseLost) as exc:
            self._unresolved(exc.__cause__ or exc)
            return []
        step.answered(jobs)
        step.call = None
        return jobs

    def _give_back_unrun(self, jobs: list[Job], claimed_at: float) -> None:
        """Jobs a claim answered that no keeper holds: given back together, one real try at least."""
        helds = [
            HeldJob.claimed(
                job, CancelToken(), self.lease_ms, claimed_at=claimed_at, interval=self.extend_interval
            )
            for job in jobs
        ]
        for held in helds:
            self._settled_unrun(held.job)
        with self._lock:
            for held in helds:
                held.given_back = True
        now = time.monotonic()
        until = max(claimed_at + self.lease_ms / 1000, now + SETTLE_TRY_S)
        self._give_back_all(helds, until, floor=now + SETTLE_TRY_S)

    def _give_back_all(self, helds: list[HeldJob], until: float, floor: float | None = None) -> None:
        """RELEASE jobs this worker will not run (or not finish), a pipeline per ``GIVE_BACK_BATCH``.

        One round trip gives back what one claim brought: a claim of a hundred
        jobs answered as the worker stops was given back one RELEASE after
        another, and on a short lease the last went out after the jobs'
        leases had lapsed and a sweep had counted each a stall (a try
        charged for a job that never ran), or after a forced stop's budget
        (held by nobody).  Sent again after a lost reply (each RELEASE is
        fenced by its token, and a repeat answers its first reply) until
        ``until``, with one real try at least until ``floor``; an end the
        batch could not settle (refused other than stale) goes the ordinary
        way (``_give_back``).
        """
        for first in range(0, len(helds), GIVE_BACK_BATCH):
            chunk = helds[first : first + GIVE_BACK_BATCH]
            if len(chunk) == 1:
                self._give_back(chunk[0], until, floor)
                continue
            finishes = [Finish(held, Action.RELEASE) for held in chunk]
            calls: list[proto.Call[Any]] = [
                proto.release(held.job.queue, held.job.id, held.job.token) for held in chunk
            ]
            try:
                replies = self._send_until(
                    partial(self.client._attempt_many, calls), until, "release",
                    cap_s=min(SETTLE_TRY_S, max(0.2, self.lease_ms / 3000)), floor=floor,
                )  # fmt: skip
            except _GaveUp as gave_up:
                with self._lock:
                    for finish in finishes:
                        self._unfinished(finish, gave_up.budget_at)
                continue
            for finish, call, reply in zip(finishes, calls, replies, strict=True):
                try:
                    if isinstance(reply, BaseException):
                        if isinstance(reply, ResponseError):
                            proto.raise_mapped(reply, call)
                        raise reply
                    where = call.read(reply)
                except LeaseLost as exc:
                    with self._lock:
                        self._refused(finish, exc)
                    continue
                except Exception:  # refused (loading, say): this one the ordinary way
                    self._give_back(finish.held, until, floor)
                    continue
                with self._lock:
                    self._landed(finish, where)

    def _send_batch(self, batch: list[Finish], count: int) -> Sent:
        """One round trip: every end in ``batch`` and a claim of ``count`` jobs, pipelined.

        The claim rides in the last COMPLETE (EMQ.COMPLETECLAIM ... COUNT),
        or goes as an EMQ.CLAIM of its own when the batch has none.  Each
        end keeps its own safety (fenced by its job's token: a repeat
        answers its first reply) and the claim its own (its REQ).  This is
        the one try of the fast path: an end that the server refused other
        than as stale (past maxmemory, say), and every end of a batch whose
        try failed, are returned in ``Sent.slow`` for the ordinary way
        (``_finish``: again until it lands or its lease ends); a claim whose
        answer was lost is ``Sent.doubt``, to ask again by its REQ
        (``_ask_again``).
        """
        sent = time.monotonic()
        at = -1  # the call that carries the claim
        if count > 0 and self._complete_claim:
            at = next((i for i in range(len(batch) - 1, -1, -1) if batch[i].action is Action.COMPLETE), -1)
        calls: list[proto.Call[Any]] = [
            self._end_call(finish) for finish in (batch if at < 0 else batch[:at] + batch[at + 1 :])
        ]
        claim: proto.Call[list[Job]] | None = None  # the claim half, as a CLAIM with its REQ
        if at >= 0:
            job = batch[at].job
            carrier = proto.complete_claim(
                job.queue, job.id, job.token, self.lease_ms, count, batch[at].result
            )
            calls.insert(at, carrier)
        elif count > 0:
            claim = self._claim_call(None, count)
            calls.append(claim)
            at = len(calls) - 1

        def in_doubt() -> ClaimStep:
            """The claim whose answer was lost, as a step to ask again (built only then: a rare path)."""
            step = ClaimStep()
            rid = proto.request_id_of(calls[at])
            step.adopt(claim or proto.claim(self.queue, self.lease_ms, count, request_id=rid), sent)
            step.failed()
            return step

        until = self._bounded(min(finish.held.confirmed_until for finish in batch)) if batch else None
        timeout = min(ATTEMPT_TIMEOUT_S, self.lease_ms / 3000)
        if until is not None:
            timeout = min(timeout, until - sent)
        out = Sent(claimed_at=sent)
        try:
            if timeout <= 0:
                raise _GaveUp("the batch's first deadline passed")
            replies = self.client._attempt_many(calls, timeout)
        except Exception as exc:
            if at >= 0 and reply_lost(exc):
                out.doubt = in_doubt()
            if not isinstance(exc, _GaveUp):
                self._trouble(exc, "sending ends" if batch else "claim")
            out.slow = list(batch)
            return out
        self._healed()
        for i, (call, reply) in enumerate(zip(calls, replies, strict=True)):
            finish = batch[i] if i < len(batch) else None
            try:
                if isinstance(reply, BaseException):
                    if isinstance(reply, ResponseError):
                        proto.raise_mapped(reply, call)
                    raise reply
                value = call.read(reply)
            except LeaseLost as exc:  # stale or gone: nothing written (a COMPLETECLAIM claimed nothing)
                if finish is not None:
                    with self._lock:
                        self._refused(finish, exc)
                continue
            except Exception as exc:  # refused: nothing written, nothing claimed by this call
                if i == at and finish is not None and "unknown command" in str(exc).lower():
                    self._complete_claim = False  # an older module: COMPLETE, then CLAIM
                elif finish is not None and finish.action is Action.COMPLETE and result_refused(exc):
                    pass  # _finish fails the job instead (_send_end)
                elif i == at or finish is None or finish.action is not Action.FAIL or not state_refused(exc):
                    self._trouble(exc, finish.action.value if finish is not None else "claim")
                if finish is not None:
                    out.slow.append(finish)
                continue
            if i == at:
                out.jobs = value.jobs if finish is not None else value
                if finish is not None:
                    with self._lock:
                        if value.gone:
                            self._refused(finish, JobGone("the job row is gone", finish.job.id))
                        else:
                            self._landed(finish)
                continue
            assert finish is not None
            with self._lock:
                self._landed(finish, None if finish.action is Action.COMPLETE else value)
        return out

    def _ask_again(self, step: ClaimStep) -> list[Job]:
        """A claim whose answer was lost: its REQ, sent again (no BLOCK), answers what it took.

        Within the lease that claim would have given its jobs, and the stop;
        still without an answer, it is asked once more as the worker ends
        (``_doubts``).
        """
        call = step.resolving()
        try:
            jobs = self._send_until(
                partial(self.client._attempt, call), step.since + self.lease_ms / 1000, "claim",
                on_lost_reply=step.failed, cap_s=self.lease_ms / 3000,
            )  # fmt: skip
        except (_GaveUp, _Refused, LeaseLost):
            with self._lock:
                self._doubts.add(step)
            return []
        step.answered(jobs)
        step.call = None
        return jobs

    def _send_until(
        self,
        send: Callable[[float], T],
        until: float | None,
        doing: str,
        job: Job | None = None,
        *,
        extra_s: float = 0.0,
        on_lost_reply: Callable[[], None] | None = None,
        cap_s: float | None = None,
        refusal: Callable[[BaseException], bool] | None = None,
        stop_ok: bool = False,
        floor: float | None = None,
    ) -> T:
        """``send(timeout)`` until answered, ``until`` passes or a forced stop's budget ends (``_GaveUp``).

        ``LeaseLost`` is an answer: it is raised as is.  So is a permanent
        error while the worker is stopping (nothing to wait for), and an
        error ``refusal`` picks (``_Refused``).  ``on_lost_reply`` hears of
        each try whose reply was lost (it may have run).  With ``stop_ok``
        (a loop's claim), a stop ends the tries (``_Stopped``).  ``floor``:
        tries go on until then even after a forced stop's budget (one real
        try to settle what a claim answered).  A job's end (``job``) gets
        such a try from the moment a forced stop is seen: an end cut by the
        budget left its job held by nobody until a sweep counted a stall.
        """
        backoff = Backoff()
        while True:
            if floor is None and job is not None and self._forced:
                floor = time.monotonic() + SETTLE_TRY_S
            bound = self._bounded(until)
            backoff.until = bound if floor is None or bound is None else max(bound, floor)
            if stop_ok and self._stop_requested:
                raise _Stopped(doing)
            try:
                timeout = backoff.timeout(time.monotonic())
                timeout = (timeout if cap_s is None else min(timeout, cap_s)) + extra_s
                reply = send(timeout)
            except LeaseLost:
                raise
            except Exception as exc:
                if on_lost_reply is not None and reply_lost(exc):
                    on_lost_reply()
                if stop_ok and self._stop_requested:  # the stop cut the waiting claim: no trouble
                    raise _Stopped(doing) from exc
                if refusal is not None and not reply_lost(exc) and refusal(exc):
                    raise _Refused(doing) from exc
                kind = self._trouble(exc, doing, job)
                now = time.monotonic()
                wait = backoff.next_wait(now)
                permanent = kind is Trouble.PERMANENT and self._stop_requested
                if wait is None or permanent:
                    # the forced stop's budget, not ``until``, ended the tries: the log says so
                    ended = backoff.until
                    by_stop = wait is None and ended is not None and (until is None or ended < until)
                    raise _GaveUp(doing, now if by_stop and self._cut_by_stop(until) else None) from exc
                if self._forced:
                    time.sleep(wait)  # within the force's budget (backoff.until)
                elif stop_ok:
                    self._wake.wait(wait)  # a stop wakes an idle claim's pause
                else:
                    self._forced_event.wait(wait)
                continue
            self._healed()
            return reply

    def _finish(self, finish: Finish) -> None:
        """Send the job's end, again after connection trouble, until it lands or its lease ends.

        A stop's give-back (RELEASE after "shutdown"), and that of a job whose
        lease this worker lost to its deadline (``Finish.lapsed``), gets one
        real try past the lease if need be: a job whose lease lapsed is still ours until a
        sweep takes it (RELEASE is fenced by its token: a swept one answers
        stale), and given back then it costs no stall and no try.
        """
        if finish.action is Action.DROP:
            return
        until, floor = finish.held.confirmed_until, None
        if finish.action is Action.RELEASE and (self._stop_requested or finish.lapsed):
            now = time.monotonic()
            until = max(until, now + SETTLE_TRY_S, finish.held.give_back_until)
            floor = now + SETTLE_TRY_S
        self._send_end(finish, self._end_call(finish), until, floor)

    def _give_back(self, held: HeldJob, until: float, floor: float | None = None) -> None:
        """RELEASE a job this worker will not run (or not finish): no attempt used."""
        job = held.job
        release = proto.release(job.queue, job.id, job.token)
        self._send_end(Finish(held, Action.RELEASE), release, until, floor)

    def _send_end(
        self, finish: Finish, call: proto.Call[Any], until: float, floor: float | None = None
    ) -> None:
        """Send ``call`` (the job's end) until it lands or ``until``; settle the job by how it went.

        A FAIL refused past maxmemory is tried again with the lease kept
        alive by EXTEND, then the job is given back (``_fail_refused``).
        """
        refused_since: float | None = None
        pause = Backoff()
        while True:
            try:
                where = self._send_until(
                    partial(self.client._attempt, call), until, finish.action.value, finish.job,
                    refusal=_refusal(finish), floor=floor,
                )  # fmt: skip
            except LeaseLost as exc:
                with self._lock:
                    self._refused(finish, exc)
                return
            except _Refused as refused:
                if finish.action is Action.COMPLETE:  # its result is over the ceiling: failed instead
                    finish = self._result_refused(finish, refused.__cause__ or refused)
                    call = self._end_call(finish)
                    continue
                now = time.monotonic()
                refused_since = now if refused_since is None else refused_since
                finish = self._fail_refused(finish, refused.__cause__ or refused, refused_since, now)
                if finish.action is Action.RELEASE:
                    job = finish.job
                    call = proto.release(job.queue, job.id, job.token)
                    continue
                kept = self._keep_lease(finish, until)
                if kept is None:
                    return
                until = kept
                self._forced_event.wait(pause.next_wait(time.monotonic()) or 0.0)
                continue
            except _GaveUp as gave_up:
                with self._lock:
                    self._unfinished(finish, gave_up.budget_at)
                return
            with self._lock:
                self._landed(finish, None if finish.action is Action.COMPLETE else where)
            return

    def _keep_lease(self, finish: Finish, until: float) -> float | None:
        """EXTEND a job whose end cannot land yet; its new deadline, or None once it is settled (lost)."""
        job = finish.job
        call = proto.extend(job.queue, job.id, job.token, self.lease_ms)
        sent = time.monotonic()
        try:
            self._send_until(partial(self.client._attempt, call), until, "extend", job)
        except LeaseLost as exc:
            with self._lock:
                self._refused(finish, exc)
            return None
        except _GaveUp as gave_up:
            with self._lock:
                self._unfinished(finish, gave_up.budget_at)
            return None
        return sent + self.lease_ms / 1000


def _refusal(finish: Finish) -> Callable[[BaseException], bool] | None:
    """The refusals ``_send_end`` settles itself: a FAIL past maxmemory, a COMPLETE's result too large."""
    if finish.action is Action.FAIL:
        return state_refused
    if finish.action is Action.COMPLETE and finish.result is not None:
        return result_refused
    return None


def _cannot_tell(exc: BaseException) -> bool:
    """A waiting claim's REQ, asked again, that the server cannot answer now: not waited for.

    Unreachable (nothing sent), or refused (past maxmemory, loading: CLAIM
    reads no record then).  A claim that was only waiting took nothing
    unless a job came in the instant its connection dropped; the job's
    lease then lapses and a sweep recovers it.
    """
    return isinstance(exc, (NotSent, ResponseError))
