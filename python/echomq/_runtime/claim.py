"""Claiming: one REQ sent again until a claim brings jobs back (``ClaimStep``), how many jobs a
worker may claim now (``Slots``), and how its one idle claim waits (``IdleWait``)."""

from __future__ import annotations

import random
from collections.abc import Callable

from .._protocol import Call, Job
from .args import check_int

# An idle worker's claim waits on the server at most this long per command
# where a stop cannot cut the wait short (a cluster client, a client pinned to
# one connection: redis-py's own connections).
MAX_CLAIM_BLOCK_S = 1.0
# Where a stop can cut it (the worker's own connections), one waiting claim
# waits this long, at most IDLE_BLOCK_SHARE of the lease: a reply lost to a
# half-open connection is noticed (after the wait and a try's time) and the
# claim asked again by its REQ within half the lease of the jobs it may have
# taken, which count their lease from the claim's send.  At the default lease
# (30 s) an idle worker sends one command per 5 s.
IDLE_BLOCK_S = 5.0
IDLE_BLOCK_SHARE = 1 / 6
# Where a claim cannot wait on the server (the scripts backend), an idle
# worker polls every poll_interval, twice as long after each empty claim, up
# to this (or poll_interval, if longer): once the queue has stayed empty for a
# few seconds, an idle worker sends a claim per 3 s, and with its sweeps
# (0.1/s) under 0.5 commands/s.  A job enqueued then waits for the next poll.
IDLE_POLL_MAX_S = 3.0


class ClaimStep:
    """One claim loop's request: the same REQ until a claim brings jobs back.

    A claim whose reply was lost (the server served it, the connection died:
    a restart, a half-open connection, a waiting claim whose client the
    server had not yet seen go) is answered again by the next claim with its
    REQ, from the server's record of it, for as long as the lease it took
    runs.  So the REQ changes only once jobs came back; until then each
    claim, even after an empty answer, carries it.

    ``since`` is the earliest the server can have claimed for this REQ, the
    start of the lease the keeper counts (never late): the time of this
    send while every earlier send of the REQ got its answer; once one did
    not (``failed``), the time the REQ was first sent.
    """

    def __init__(self) -> None:
        self.call: Call[list[Job]] | None = None
        self.since = 0.0
        self.troubled = False
        self.doubt = False  # a try got no answer, and no answer came since

    def next(self, make: Callable[[], Call[list[Job]]], now: float) -> tuple[Call[list[Job]], float]:
        """The call to send now, and ``since``."""
        if self.call is None:
            self.call, self.since, self.troubled, self.doubt = make(), now, False, False
        elif not self.troubled:
            self.since = now  # every earlier send was answered: nothing was claimed for it yet
        return self.call, self.since

    def renew(self) -> None:
        """Let the next claim be a new one (another COUNT, a new REQ) unless a try is in doubt.

        A REQ every try of which was answered holds no job on the server:
        nothing is lost by dropping it.
        """
        if self.call is not None and not self.troubled:
            self.call = None

    def adopt(self, call: Call[list[Job]], sent: float) -> None:
        """``call`` is this step's request now (the claim half of a COMPLETECLAIM sent at ``sent``, say)."""
        self.call, self.since, self.troubled, self.doubt = call, sent, False, False

    def failed(self) -> None:
        """An attempt got no answer: the server may have claimed for it; keep counting from the first send."""
        self.troubled = self.doubt = True

    def answered(self, jobs: list[Job]) -> None:
        """A reply came: jobs end this request (the next claim is a new one); nothing keeps it.

        An answer to the REQ answers what every earlier try took (``doubt``
        ends; ``troubled`` stays: a try stuck in a dead connection's buffer
        on a stalled server may still run later, and its jobs would then be
        answered to this REQ).  An error reply is no answer (a claim refused
        past maxmemory never reads the record): callers do not call this
        for one.
        """
        self.doubt = False
        if jobs:
            self.call = None

    @property
    def unresolved(self) -> bool:
        """A try of this REQ got no answer since the last one: the server may hold jobs nobody runs yet.

        A worker that stops sends it again (``resolving``) and gives back
        what comes: a job a claim answered is run or released.
        """
        return self.call is not None and self.doubt

    @property
    def waiting(self) -> bool:
        """This step's claim waits on the server (BLOCK): one whose connection dropped claimed nothing.

        Only a claim served in the instant before its connection dropped is
        in doubt then; a stopping worker that cannot reach the server at all
        does not wait for it.  A claim that does not wait (a COMPLETECLAIM's,
        a pipelined one) may well have taken a job: that one is waited for,
        within the stop's bound.
        """
        return self.call is not None and "BLOCK" in self.call.args

    def resolving(self) -> Call[list[Job]]:
        """This step's claim without BLOCK: answered at once by the REQ's record (the jobs it took)."""
        assert self.call is not None
        args = self.call.args
        if "BLOCK" in args:
            at = args.index("BLOCK")
            args = args[:at] + args[at + 2 :]
        return Call(args, self.call.parse, self.call.queue)


def count_of(call: Call[list[Job]]) -> int:
    """The COUNT a claim's command line asks for."""
    args = call.args
    return int(args[args.index("COUNT") + 1]) if "COUNT" in args else 1


class Slots:
    """How many jobs a worker may claim now: its runners and its prefetch, less what it owns and
    what its claims in flight may bring.

    ``capacity`` is ``concurrency + prefetch``.  A job is *owned* from the
    claim that brought it until its handler ends (or it is given back
    unrun); a claim in flight *reserves* its COUNT until it is answered.  A
    claim is never for more than ``free()``, so the worker never holds
    more than ``capacity`` jobs (a claim asked again by its REQ after a lost
    reply keeps the COUNT it was sent with).  Not thread-safe: the driver's lock.
    """

    def __init__(self, concurrency: int, prefetch: int = 0) -> None:
        self.capacity = check_int("concurrency", concurrency) + check_int("prefetch", prefetch, 0)
        self.owned = 0
        self.reserved = 0

    def free(self) -> int:
        return max(0, self.capacity - self.owned - self.reserved)

    def reserve(self, count: int) -> None:
        self.reserved += count

    def answered(self, count: int, jobs: int) -> None:
        """A claim that reserved ``count`` was answered with ``jobs`` jobs (or gave up: 0)."""
        self.reserved = max(0, self.reserved - count)
        self.owned += jobs

    def ended(self, jobs: int = 1) -> None:
        """Handlers ended, or jobs were given back unrun: their slots are free."""
        self.owned = max(0, self.owned - jobs)


class IdleWait:
    """How a worker's one idle claim waits for work, as its backend and client allow.

    - The module, on the worker's own connections (a stop cuts the wait):
      ``EMQ.CLAIM ... BLOCK`` for ``IDLE_BLOCK_S`` (at most a sixth of the
      lease), and again at once: one command per wait, a job enqueued
      meanwhile claimed at once.
    - On Redis Cluster the same, on the node serving the queue (the sync
      worker's own bounded connection there, the asyncio worker's cancel of
      its try): a stop cuts it too; a wait ends before the socket timeout of
      redis-py's cluster client (4 s of its default 5), whose own routing
      sends a claim after a redirect or a lost node.
    - The module where a wait cannot be cut (a single-connection client):
      BLOCK for ``poll_interval`` (at most ``MAX_CLAIM_BLOCK_S``), then the
      rest of ``poll_interval``: a stop waits for a wait no longer than that.
    - The scripts backend (a script cannot wait): a claim, then a pause of
      ``poll_interval``, doubling after each empty claim up to
      ``IDLE_POLL_MAX_S``; a claim that brings a job starts over.  A job
      enqueued into an idle queue waits up to that pause.
    """

    def __init__(self, poll_interval: float, lease_ms: int, *, jitter: Callable[[], float] = random.random):
        self.poll_interval = poll_interval
        self.lease_ms = lease_ms
        self.pause = poll_interval
        self._jitter = jitter

    def block_ms(self, cuttable: bool, read_limit_ms: int | None = None) -> int:
        """The BLOCK of the next waiting claim (a script ignores it).

        ``read_limit_ms``: the longest wait the client's reads allow (a cluster
        client reads with redis-py's socket timeout: ``proto.BlockingClaim``).
        """
        if cuttable:
            block = min(IDLE_BLOCK_S * 1000, self.lease_ms * IDLE_BLOCK_SHARE)
            return max(1, round(block if read_limit_ms is None else min(block, read_limit_ms)))
        return max(1, round(min(self.poll_interval, MAX_CLAIM_BLOCK_S) * 1000))

    def after(self, jobs: int, waited: float, blocks: bool, cuttable: bool) -> float:
        """Seconds to wait before the next idle claim, after one that brought ``jobs`` in ``waited`` s.

        ``blocks``: the backend waits on the server (the module).
        """
        if jobs:
            self.pause = self.poll_interval
            return 0.0
        if blocks:
            return 0.0 if cuttable else max(0.0, self.poll_interval - waited)
        pause = self.pause
        self.pause = min(max(self.poll_interval, IDLE_POLL_MAX_S), self.pause * 2)
        # Workers that went idle together do not poll in step (the mean stays the pause).
        return pause * (0.875 + self._jitter() / 4)
