"""How an asyncio worker sends what ends a job's hold, and settles what its claims answered.

The twin of ``echomq._finisher``: a job's end (a COMPLETE with the next
claim as one EMQ.COMPLETECLAIM), sent with the other runners' in one
pipeline (``_together.Coalescer``), again after a lost reply until it lands
or the job's lease ends and a forced stop's budget; a FAIL refused past
maxmemory keeps its lease with EXTEND.  And what the worker does as it ends
(``_settle``): a claim whose answer was lost is asked again by its REQ,
and every job a claim answered that no runner took (``_unowned``), or whose
caller was cancelled (``_orphaned``), is given back.

Jobs given back together (a forced stop's, the prefetched ones waiting for
a runner, the unowned ones at the end) go as one pipeline of RELEASEs per
try (``_give_back_batch``), on the connections the worker keeps for its
stop (``_attempt.STOP_LANE``): many RELEASEs at once, each waiting for a
connection of its own, do not fit a forced stop's budget on a busy machine.

Hand-written beside its twin ``_sync/_finisher.py``, not generated from it
(``tests/unasync.py``): a thread worker's ends ride its threads' turns (``_turns.py``), an
asyncio worker's are gathered from its runner tasks by the Coalescer (``_together.py``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
from redis.exceptions import ResponseError

from .. import _protocol as proto
from .._protocol import Job
from .._runtime import (
    ATTEMPT_TIMEOUT_S,
    FORCE_AFTER_S,
    FORCE_BUDGET_S,
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
from .._runtime.tries import NotSent
from ..cancel import CancelToken
from ..errors import JobGone, LeaseLost, NotReplicated
from ._together import Coalescer, Orphan
from ._waits import wait_event
from .client import Client

__all__ = ["Finisher"]

T = TypeVar("T")
HandlerT = TypeVar("HandlerT")

# A stopping worker asks a lost claim's answer again with tries of at most this long each.
SETTLE_TRY_S = 1.0


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
    """A claim not sent (again): the worker stops; ``_settle`` asks a lost answer again."""


class Finisher(WorkerCore[Client, HandlerT]):
    """The sending half of the asyncio ``Worker`` (see the module docstring)."""

    _coalescer: Coalescer
    _unowned: dict[str, tuple[Job, float]]
    _waiting: dict[str, Any]
    _claim_step: ClaimStep
    _doubts: set[ClaimStep]
    _settling: set[asyncio.Task[Any]]
    _claim_attempt: asyncio.Future[Any] | None
    _forced_event: asyncio.Event | None
    _stopping: asyncio.Event | None
    _complete_claim: bool
    _soon: list[HeldJob]  # jobs to give back in the next batch (``_give_back_soon``)
    _soon_task: asyncio.Task[None] | None

    async def _replicated(self, jobs: list[Job], claimed_at: float, *, loop: bool = True) -> list[Job]:
        """With ``replicas=``: the jobs once replicas have them (see ``echomq.Worker._replicated``)."""
        if self.replica_wait is None or not jobs:
            return jobs
        try:
            held = await self.client._wait_for_replicas(jobs, self.lease_ms, self.replica_wait)
        except Exception as exc:
            if not isinstance(exc, NotReplicated):  # a bug, not the replicas: logged, the jobs given back
                self._trouble(exc, "waiting for replicas")
                await self._give_back_these([(job, claimed_at) for job in jobs])
                return []
            for job in jobs:  # given back by the client (or left to their leases): not ours any more
                self._unowned.pop(job.token, None)
            self._not_replicated(exc)
            if not loop:
                raise
            assert self._stopping is not None
            await wait_event(self._stopping, self.poll_interval)
            return []
        for job in jobs:
            if job not in held:
                self._unowned.pop(job.token, None)
        return held

    def _hand(self, jobs: list[Job], claimed_at: float) -> list[tuple[Job, float]]:
        """Jobs a claim answered: nobody's until a runner takes them (``_process``), then its."""
        for job in jobs:
            self._unowned[job.token] = (job, claimed_at)
        return [(job, claimed_at) for job in jobs]

    def _orphaned(self, jobs: list[Job], claimed_at: float) -> None:
        """A claim's answer whose caller was cancelled: its jobs are given back, in a task of their own."""
        if not jobs:
            return
        task = asyncio.get_running_loop().create_task(
            self._give_back_these([(job, claimed_at) for job in jobs]), name="echomq-give-back"
        )
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self) -> None:
        """The worker ends: a lost claim answer is asked again, and every job nobody ran is given back.

        Bounded by the jobs' leases and by the stop (after a forced stop or a
        cancelled ``run()``, by its budget).
        """
        # No supervisor ticks any more: the stop's bound is where a forced stop would have ended.
        self._force_until = min(self._force_until, self._grace_until + FORCE_AFTER_S + FORCE_BUDGET_S)
        await self._coalescer.drain()  # answers whose callers were cancelled reach _orphaned first
        for step in [self._claim_step, *self._doubts]:
            if step.unresolved:
                await self._resolve(step)
        await self._give_back_unowned()
        while self._settling:  # a second signal meanwhile may add a give-back (Worker._force_late)
            await asyncio.wait(list(self._settling))

    async def _resolve(self, step: ClaimStep) -> None:
        call = step.resolving()
        now = time.monotonic()
        until = max(step.since + self.lease_ms / 1000, now + min(ATTEMPT_TIMEOUT_S, self.lease_ms / 3000))
        # A waiting claim is not waited for when the server cannot be reached at all (ClaimStep.waiting).
        unreachable = _cannot_tell if step.waiting else None
        try:
            jobs = await self._send_until(
                call, until, "claim", cap_s=SETTLE_TRY_S, refusal=unreachable, floor=now + SETTLE_TRY_S
            )
        except (_GaveUp, _Refused, LeaseLost) as exc:
            self._unresolved(exc.__cause__ or exc)
            return
        step.answered(jobs)
        step.call = None
        self._hand(jobs, step.since)

    async def _give_back_unowned(self) -> None:
        """Every job a claim answered that no runner took (the runners have ended), in one batch."""
        unowned, self._unowned = list(self._unowned.values()), {}
        if unowned:
            await self._give_back_these(unowned)

    async def _give_back_these(self, jobs: list[tuple[Job, float]]) -> None:
        """Give back ``jobs`` (each with when it was claimed) unrun, no try used; none is a runner's."""
        held: list[HeldJob] = []
        for job, claimed_at in jobs:
            self._unowned.pop(job.token, None)
            waited = self._waiting.pop(job.token, None)
            one = HeldJob.claimed(
                job, CancelToken(), self.lease_ms, claimed_at=claimed_at, interval=self.extend_interval
            )
            if waited is not None:  # prefetched: its keeper stops before the job goes back
                with waited._lock:  # a checkpoint answered stale after the RELEASE is not a lost lease
                    waited._held.given_back = True
                    one.confirmed_until = max(one.confirmed_until, waited._held.confirmed_until)
                await waited.stop()
            one.given_back = True
            self._settled_unrun(job)
            held.append(one)
        now = time.monotonic()
        await self._give_back_batch(held, floor=now + SETTLE_TRY_S)

    def _give_back_soon(self, held: HeldJob) -> asyncio.Task[None]:
        """Give back ``held`` (not to run) with the others given back this loop turn, in one batch.

        The batch is a task of its own, awaited by ``_settle``: a forced stop
        cancels the runners, not it, and its tries get one real try past the
        force's budget (``_give_back_batch``'s ``floor``).
        """
        self._soon.append(held)
        if self._soon_task is None or self._soon_task.done():
            task = asyncio.get_running_loop().create_task(self._give_back_gathered(), name="echomq-give-back")
            self._soon_task = task
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
        return self._soon_task

    async def _give_back_gathered(self) -> None:
        await asyncio.sleep(0)  # the runners handed jobs by the same claim add theirs
        while self._soon:
            batch, self._soon = self._soon, []
            await self._give_back_batch(batch, floor=time.monotonic() + SETTLE_TRY_S)

    async def _give_back_batch(self, held: list[HeldJob], *, floor: float | None = None) -> None:
        """RELEASE every job of ``held`` (not run, or not to be finished): one pipeline per try.

        Each job is tried until its lease ends (``confirmed_until``), and
        after a forced stop no later than its budget (``_bounded``) unless
        ``floor`` is later (one real try to give back what a claim answered).
        The tries take the connections kept for the stop (``lane``), each at
        most a share of the time left (``Backoff``): one lost on a half-open
        connection leaves room for the next on a fresh one.  RELEASE is safe
        to send again (a repeat answers its first reply).
        """
        pending: dict[str, tuple[Finish, proto.Call[Any], float]] = {}
        for one in held:
            job = one.job
            call = proto.release(job.queue, job.id, job.token)
            until = max(one.confirmed_until, one.give_back_until)  # (later: lost to its deadline)
            until = until if floor is None else max(until, floor)
            pending[job.token] = (Finish(one, Action.RELEASE), call, until)

        def deadline(until: float) -> float:
            bound = self._bounded(until)
            assert bound is not None
            return bound if floor is None else max(bound, floor)

        backoff = Backoff()
        while pending:
            now = time.monotonic()
            for token, (finish, _, until) in list(pending.items()):
                if deadline(until) <= now:  # its tries are over: by its lease, or by the stop's budget
                    del pending[token]
                    self._unfinished(finish, now if deadline(until) < until else None)
            if not pending:
                return
            backoff.until = max(deadline(until) for _, _, until in pending.values())
            entries = list(pending.items())
            doing = "release" if len(entries) == 1 else f"release of {len(entries)} jobs"
            try:
                replies = await self.client._attempt_many(
                    [call for _, (_, call, _) in entries], backoff.timeout(now), lane=True
                )
            except Exception as exc:
                kind = self._trouble(exc, doing)
                if kind is Trouble.PERMANENT and self._stop_requested:
                    for finish, _, _ in pending.values():
                        self._unfinished(finish)
                    return
            else:
                self._healed()
                for (token, (finish, call, _)), reply in zip(entries, replies, strict=True):
                    try:
                        if isinstance(reply, BaseException):
                            if isinstance(reply, ResponseError):
                                proto.raise_mapped(reply, call)
                            raise reply
                        where = call.read(reply)
                    except LeaseLost as exc:  # stale or gone: nothing written
                        del pending[token]
                        self._refused(finish, exc)
                    except Exception as exc:  # refused: tried again, unless it will not heal
                        kind = self._trouble(exc, "release", finish.job)
                        if kind is Trouble.PERMANENT and self._stop_requested:
                            del pending[token]
                            self._unfinished(finish)
                    else:
                        del pending[token]
                        self._landed(finish, where)
                if not pending:
                    return
            wait = backoff.next_wait(time.monotonic())
            if wait is None:
                continue  # the deadlines passed: given up above
            if self._forced or self._forced_event is None:
                await asyncio.sleep(wait)  # within the force's budget (backoff.until)
            else:
                await wait_event(self._forced_event, wait)

    async def _send_until(
        self,
        call: proto.Call[T],
        until: float | None,
        doing: str,
        job: Job | None = None,
        *,
        extra_s: float = 0.0,
        on_lost_reply: Callable[[], None] | None = None,
        cap_s: float | None = None,
        together: bool = False,
        orphan: Orphan | None = None,
        refusal: Callable[[BaseException], bool] | None = None,
        stop_ok: bool = False,
        floor: float | None = None,
    ) -> T:
        """Send ``call`` until answered, ``until`` passes or a forced stop's budget ends (``_GaveUp``).

        ``together``: in one pipeline with the other calls sent meanwhile
        (``Coalescer``), ``orphan`` taking its answer should this task be
        cancelled while it waits.  ``stop_ok``: the claimer's claim, whose
        waiting try a stop cuts.  ``floor``: tries go on until then even
        after a forced stop's budget (one real try to settle a claim's answer).
        """
        backoff = Backoff()
        while True:
            if floor is None and job is not None and self._forced:
                # A job's end (or give-back) gets one real try past a forced stop's budget, as
                # the thread worker's does: cut by it, its job was held by nobody until a sweep.
                floor = time.monotonic() + SETTLE_TRY_S
            bound = self._bounded(until)
            backoff.until = bound if floor is None or bound is None else max(bound, floor)
            if stop_ok and self._stop_requested:
                raise _Stopped(doing)
            try:
                timeout = backoff.timeout(time.monotonic())
                timeout = (timeout if cap_s is None else min(timeout, cap_s)) + extra_s
                if together:
                    reply = await self._coalescer.attempt(call, timeout, orphan)
                elif stop_ok:
                    reply = await self._cuttable(self.client._attempt(call, timeout))
                else:
                    reply = await self.client._attempt(call, timeout)
            except LeaseLost:
                raise
            except asyncio.CancelledError:
                if (
                    on_lost_reply is not None and not together
                ):  # a try cut off may have run (an orphan's tells)
                    on_lost_reply()
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
                if wait is None or (kind is Trouble.PERMANENT and self._stop_requested):
                    # the forced stop's budget, not ``until``, ended the tries: the log says so
                    ended = backoff.until
                    by_stop = wait is None and ended is not None and (until is None or ended < until)
                    raise _GaveUp(doing, now if by_stop and self._cut_by_stop(until) else None) from exc
                if self._forced:
                    await asyncio.sleep(wait)  # within the force's budget (backoff.until)
                elif stop_ok and self._stopping is not None:
                    await wait_event(self._stopping, wait)
                elif self._forced_event is not None:
                    await wait_event(self._forced_event, wait)
                else:
                    await asyncio.sleep(wait)
                continue
            self._healed()
            return reply

    async def _cuttable(self, attempt: Awaitable[T]) -> T:
        """The claimer's try, which a stop may cut (``_poke``): then a lost reply, not a cancelled claimer."""
        future = asyncio.ensure_future(attempt)
        self._claim_attempt = future
        try:
            return await future
        except asyncio.CancelledError:
            if future.cancelled() and self._stop_requested and not _cancelling():
                raise redis.ConnectionError("the waiting claim was cut by the stop") from None
            raise
        finally:
            self._claim_attempt = None
            if not future.done():
                future.cancel()

    async def _finish(self, finish: Finish) -> None:
        """Send the job's end, again after connection trouble, until it lands or its lease ends.

        A job whose lease this worker lost to its deadline (``Finish.lapsed``)
        is given back with the others given back this loop turn, with one
        real try past its lease: it is ours until a sweep takes it.
        """
        if finish.lapsed:
            await asyncio.shield(self._give_back_soon(finish.held))
        elif finish.action is not Action.DROP:
            await self._send_end(finish, self._end_call(finish), finish.held.confirmed_until, together=True)

    async def _complete_and_claim(self, finish: Finish) -> list[tuple[Job, float, bool]]:
        """COMPLETE the job and claim the next in one command, sent with the others' (``Coalescer``).

        Retry-safe as ``echomq.Worker._finish_and_claim``, and sent again as
        a pair after a lost reply, until the job's lease ends.  Without an
        answer, the claim is asked again by its REQ at once (and by
        ``_settle`` if that gets none either); an answer this task cannot
        read (it was cancelled) goes to ``_orphaned``.
        """
        job = finish.job
        sent = time.monotonic()
        call = proto.complete_claim(job.queue, job.id, job.token, self.lease_ms, result=finish.result)
        step = ClaimStep()
        step.adopt(proto.claim(self.queue, self.lease_ms, request_id=proto.request_id_of(call)), sent)
        self._doubts.add(step)  # until its answer is read: _settle asks again if this task is cancelled

        def orphan(outcome: Any) -> None:  # this task was cancelled: the answer is still someone's
            if isinstance(outcome, proto.CompletedAndClaimed):
                step.answered(outcome.jobs)
                step.call = None
                self._landed(finish)
                self._orphaned(outcome.jobs, sent)
            elif isinstance(outcome, BaseException) and reply_lost(outcome):
                step.failed()

        try:
            return await self._completed_and_claimed(finish, call, step, orphan)
        finally:
            if not step.unresolved:
                self._doubts.discard(step)

    async def _completed_and_claimed(
        self, finish: Finish, call: proto.Call[proto.CompletedAndClaimed], step: ClaimStep, orphan: Orphan
    ) -> list[tuple[Job, float, bool]]:
        job, sent = finish.job, step.since
        try:
            both = await self._send_until(
                call, finish.held.confirmed_until, finish.action.value, job, on_lost_reply=step.failed,
                cap_s=self.lease_ms / 3000, together=True, orphan=orphan, refusal=lambda exc: True,
            )  # fmt: skip
        except LeaseLost as exc:  # stale: nothing was written, nothing claimed
            self._refused(finish, exc)
            return []
        except _Refused as refused:  # COMPLETECLAIM refused (past maxmemory, an older module): COMPLETE
            cause = refused.__cause__
            if "unknown command" in str(cause).lower():
                self._complete_claim = False
            elif cause is not None and not result_refused(cause):  # that one: _finish fails the job
                self._trouble(cause, finish.action.value, job)
            await self._finish(finish)
            return await self._ask_again(step)
        except _GaveUp as gave_up:
            self._unfinished(finish, gave_up.budget_at)
            return await self._ask_again(step)
        step.answered(both.jobs)
        step.call = None
        if both.gone:
            self._refused(finish, JobGone("the job row is gone", job.id))
        else:
            self._landed(finish)
        self._hand(both.jobs, sent)
        return [(j, sent, False) for j in await self._replicated(both.jobs, sent)]

    async def _ask_again(self, step: ClaimStep) -> list[tuple[Job, float, bool]]:
        """A COMPLETECLAIM whose claim half got no answer: its REQ, sent again, answers what it took."""
        if not step.unresolved:
            return []
        call = step.resolving()
        try:
            jobs = await self._send_until(
                call, step.since + self.lease_ms / 1000, "claim", on_lost_reply=step.failed,
                cap_s=self.lease_ms / 3000,
            )  # fmt: skip
        except (_GaveUp, LeaseLost):
            return []  # still in doubt: asked once more as the worker ends (_settle)
        step.answered(jobs)
        step.call = None
        self._hand(jobs, step.since)
        return [(j, step.since, False) for j in await self._replicated(jobs, step.since)]

    async def _give_back(self, held: HeldJob, until: float, *, together: bool = False) -> None:
        """RELEASE a job this worker will not run: no attempt used (``together``: with the others' ends)."""
        job = held.job
        release = proto.release(job.queue, job.id, job.token)
        await self._send_end(Finish(held, Action.RELEASE), release, until, together=together)

    async def _send_end(
        self,
        finish: Finish,
        call: proto.Call[Any],
        until: float,
        *,
        together: bool = False,
    ) -> None:
        """Send ``call`` (the job's end) until it lands or ``until``; settle the job by how it went.

        A FAIL refused past maxmemory is tried again with the lease kept
        alive by EXTEND, then the job is given back (``_fail_refused``).
        """
        refused_since: float | None = None
        pause = Backoff()
        while True:

            def orphan(outcome: Any, finish: Finish = finish) -> None:  # this task was cancelled: count it
                if not isinstance(outcome, BaseException):
                    self._landed(finish, None if finish.action is Action.COMPLETE else outcome)

            try:
                where = await self._send_until(
                    call, until, finish.action.value, finish.job, together=together, orphan=orphan,
                    refusal=_refusal(finish),
                )  # fmt: skip
            except LeaseLost as exc:
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
                kept = await self._keep_lease(finish, until)
                if kept is None:
                    return
                until = kept
                wait = pause.next_wait(time.monotonic()) or 0.0
                if self._forced_event is not None:
                    await wait_event(self._forced_event, wait)
                else:
                    await asyncio.sleep(wait)
                continue
            except _GaveUp as gave_up:
                self._unfinished(finish, gave_up.budget_at)
                return
            self._landed(finish, None if finish.action is Action.COMPLETE else where)
            return

    async def _keep_lease(self, finish: Finish, until: float) -> float | None:
        """EXTEND a job whose end cannot land yet; its new deadline, or None once it is settled (lost)."""
        job = finish.job
        call = proto.extend(job.queue, job.id, job.token, self.lease_ms)
        sent = time.monotonic()
        try:
            await self._send_until(call, until, "extend", job)
        except LeaseLost as exc:
            self._refused(finish, exc)
            return None
        except _GaveUp as gave_up:
            self._unfinished(finish, gave_up.budget_at)
            return None
        return sent + self.lease_ms / 1000


def _cancelling() -> bool:
    """Whether the current task is being cancelled (Python 3.11+; before it, not known: False)."""
    task = asyncio.current_task()
    return task is not None and sys.version_info >= (3, 11) and task.cancelling() > 0


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
