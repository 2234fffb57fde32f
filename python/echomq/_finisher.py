"""How a thread worker sends what ends a job's hold, and settles what its claims answered.

A job's end (COMPLETE, FAIL, RELEASE; a COMPLETE with the next claim as one
EMQ.COMPLETECLAIM, a FAIL or RELEASE pipelined with it), sent again after a
lost reply until it lands or the job's lease ends, and a forced stop's
budget (``WorkerCore._bounded``); a FAIL refused past maxmemory keeps its
lease with EXTEND (``WorkerCore._fail_refused``).  And what a thread does
as it ends (``_settle``): the jobs its last end claimed are given back, and
a claim whose answer was lost is asked again by its REQ, its jobs given
back.  ``worker.py`` runs the threads; this is the part of its loop that
sends, the "finisher".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from . import _protocol as proto
from ._attempt import NotSent
from ._runtime import (
    ATTEMPT_TIMEOUT_S,
    Action,
    Backoff,
    ClaimStep,
    Finish,
    HeldJob,
    Trouble,
    WorkerCore,
    reply_lost,
    state_refused,
)
from .cancel import CancelToken
from .client import Client, Job
from .errors import JobGone, LeaseLost

__all__ = ["Finisher"]

T = TypeVar("T")
HandlerT = TypeVar("HandlerT")

# A stopping thread asks a lost claim's answer again with tries of at most
# this long each (a server that does not answer does not hold the stop long).
SETTLE_TRY_S = 1.0


class _GaveUp(Exception):
    """No answer before the deadline (or a forced stop's budget); the cause is the last error."""


class _Refused(Exception):
    """The server refused a command with an error that ends its tries (the cause); nothing was written."""


class _Stopped(Exception):
    """A claim not sent (again): the worker stops; its thread's ``_settle`` asks a lost answer again."""


class Finisher(WorkerCore[Client, HandlerT]):
    """The sending half of the thread ``Worker`` (see the module docstring)."""

    _lock: threading.Lock
    _wake: threading.Event
    _forced_event: threading.Event
    _complete_claim: bool

    def _settle(self, step: ClaimStep, ready: tuple[list[Job], float] | None) -> None:
        """The thread ends: give back what a claim answered and nobody ran; ask a lost answer again.

        ``ready``: the jobs the last job's end brought (the worker stopped
        before they ran).  ``step``: a claim whose try got no answer may have
        taken jobs; its REQ, sent again (without BLOCK), answers them, and
        they are given back.  Both bounded by the jobs' leases and by stop.
        """
        if ready is not None:
            for job in ready[0]:
                self._give_back_unrun(job, ready[1])
        if not step.unresolved:
            return
        call = step.resolving()
        now = time.monotonic()
        until = max(step.since + self.lease_ms / 1000, now + min(ATTEMPT_TIMEOUT_S, self.lease_ms / 3000))
        # A waiting claim is not waited for when the server cannot be reached at all (ClaimStep.waiting).
        unreachable = (lambda exc: isinstance(exc, NotSent)) if step.waiting else None
        try:
            jobs = self._send_until(
                partial(self.client._attempt, call), until, "claim", cap_s=SETTLE_TRY_S,
                refusal=unreachable, floor=now + SETTLE_TRY_S,
            )  # fmt: skip
        except (_GaveUp, _Refused, LeaseLost) as exc:
            self._unresolved(exc.__cause__ or exc)
            return
        step.answered(jobs)
        step.call = None
        for job in jobs:
            self._give_back_unrun(job, step.since)

    def _give_back_unrun(self, job: Job, claimed_at: float) -> None:
        held = HeldJob.claimed(
            job, CancelToken(), self.lease_ms, claimed_at=claimed_at, interval=self.extend_interval
        )
        self._settled_unrun(job)
        with self._lock:
            held.given_back = True
        now = time.monotonic()
        self._give_back(held, max(held.confirmed_until, now + SETTLE_TRY_S), floor=now + SETTLE_TRY_S)

    def _finish_and_claim(self, finish: Finish, step: ClaimStep) -> tuple[list[Job], float] | None:
        """Send a job's end and the next claim in one round trip; the jobs claimed, if any.

        A COMPLETE goes as one EMQ.COMPLETECLAIM; a FAIL or RELEASE and the
        claim go pipelined.  Each half keeps its own safety (the end is
        fenced by the job's token: a repeat answers its first reply; the
        claim carries its REQ: a repeat answers the jobs it took), so the
        pair is sent again as a pair after a lost reply, until the job's
        lease ends: the claim is asked again while its REQ's record lives.
        An error reply means nothing ran: the end then goes the ordinary
        way (``_send_end``); the claim is no longer in doubt.
        """
        job = finish.job
        sent = time.monotonic()
        until = finish.held.confirmed_until
        cap = self.lease_ms / 3000
        if finish.action is Action.COMPLETE and self._complete_claim:
            call = proto.complete_claim(job.queue, job.id, job.token, self.lease_ms)
            step.adopt(proto.claim(self.queue, self.lease_ms, request_id=proto.request_id_of(call)), sent)
            try:
                both = self._send_until(
                    partial(self.client._attempt, call), until, finish.action.value, job,
                    on_lost_reply=step.failed, cap_s=cap, refusal=lambda exc: True,
                )  # fmt: skip
            except LeaseLost as exc:  # stale: nothing was written, nothing claimed
                with self._lock:
                    self._refused(finish, exc)
                return None
            except _Refused as refused:  # COMPLETECLAIM refused (past maxmemory, an older module): COMPLETE
                cause = refused.__cause__
                if "unknown command" in str(cause).lower():
                    self._complete_claim = False
                elif cause is not None:
                    self._trouble(cause, finish.action.value, job)
                self._finish(finish)
                return None
            except _GaveUp:
                with self._lock:
                    self._unfinished(finish)
                return None
            with self._lock:
                if both.gone:
                    self._refused(finish, JobGone("the job row is gone", job.id))
                else:
                    self._landed(finish)
            return self._claimed(step, both.jobs, sent)
        end = self._end_call(finish)
        claim, claimed_at = step.next(lambda: self._claim_call(False), sent)
        try:
            end_reply, claim_reply = self._send_until(
                partial(self.client._attempt_many, [end, claim]), until, finish.action.value, job,
                on_lost_reply=step.failed, cap_s=cap,
            )  # fmt: skip
        except _GaveUp:
            with self._lock:
                self._unfinished(finish)
            return None
        claimed = None
        try:
            jobs = proto.read_reply(claim, claim_reply)
        except Exception as exc:  # refused: nothing claimed by this try (an earlier one is still in doubt)
            self._trouble(exc, "claim")
        else:
            claimed = self._claimed(step, jobs, claimed_at)
        try:
            where = proto.read_reply(end, end_reply)
        except LeaseLost as exc:
            with self._lock:
                self._refused(finish, exc)
        except Exception:  # refused (past maxmemory, say): the ordinary way, with its rules
            self._send_end(finish, end, until)
        else:
            with self._lock:
                self._landed(finish, where)  # type: ignore[arg-type]
        return claimed

    @staticmethod
    def _claimed(step: ClaimStep, jobs: list[Job], claimed_at: float) -> tuple[list[Job], float] | None:
        step.answered(jobs)
        if not jobs:
            step.call = None  # answered: nothing claimed for this REQ, and the next claim may wait
            return None
        return jobs, claimed_at

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
        try to settle what a claim answered).
        """
        backoff = Backoff()
        while True:
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
                wait = backoff.next_wait(time.monotonic())
                permanent = kind is Trouble.PERMANENT and self._stop_requested
                if wait is None or permanent:
                    raise _GaveUp(doing) from exc
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
        """Send the job's end, again after connection trouble, until it lands or its lease ends."""
        if finish.action is not Action.DROP:
            self._send_end(finish, self._end_call(finish), finish.held.confirmed_until)

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
                    refusal=state_refused if finish.action is Action.FAIL else None, floor=floor,
                )  # fmt: skip
            except LeaseLost as exc:
                with self._lock:
                    self._refused(finish, exc)
                return
            except _Refused as refused:
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
            except _GaveUp:
                with self._lock:
                    self._unfinished(finish)
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
        except _GaveUp:
            with self._lock:
                self._unfinished(finish)
            return None
        return sent + self.lease_ms / 1000
