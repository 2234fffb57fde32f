"""The claim step: one REQ, sent again until a claim brings jobs back."""

from __future__ import annotations

from collections.abc import Callable

from .._protocol import Call, Job

# An idle worker's claim waits on the server at most this long per command.
MAX_CLAIM_BLOCK_S = 1.0


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
