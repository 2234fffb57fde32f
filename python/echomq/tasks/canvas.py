"""Chains, groups and chords: workflows of task calls built on ``after=`` (sans I/O).

``task.s(*args, **kwargs)`` is a **signature**: a call not yet enqueued.
Three shapes combine them, and ``app.enqueue_flow(shape)`` enqueues every job
of one at once (each waiting, in no lane, for what it follows), returning
a ``WorkflowHandle`` (``flows.py``)::

    chain(fetch.s(url), parse.s(), store.s())      # each step gets the previous step's result first
    group(resize.s(1), resize.s(2))                # side by side; the result: the list of theirs
    chord(group(resize.s(1), resize.s(2)), zip_all.s())   # the callback gets that list first

How a step receives what came before: it is enqueued with ``after=`` its
predecessor(s) and a header (``parents=first``: a chain's step, one parent;
``parents=list``: a chord's callback, every member); the worker reads those
results before the function runs (``parents.py``) and passes them as its
first argument.  Nothing is sent between steps by anyone: the server
releases each step as its parents end.

The policy: a chain's step that ends dead (or is cancelled) fails the rest
(``on_parent_failure="fail"``): each ends dead at once, ``last_error``
``dependency <id> dead``, so nothing waits for ever.  A chord's callback
has ``on_member_failure`` (``"fail"`` by default; ``"ignore"`` or
``"continue"``: it runs, a failed member's place in the list is None).

Every job of a workflow is on one queue (dependencies are within a queue):
its first task's, or ``queue=``; the worker of that queue must know every
task of the workflow (an app's worker knows all of the app's).  Its ids are
``<workflow id>.<index>``, in the order of the workflow (that order is the
order of a chord's list).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from .._protocol import new_id
from .._protocol.deps import OnParentFailure
from .core import EnqueueOptions

if TYPE_CHECKING:
    from .core import TaskCore

__all__ = ["Chain", "Chord", "Group", "Plan", "Signature", "chain", "chord", "group", "plan"]

R = TypeVar("R")
R1 = TypeVar("R1")
MAX_MEMBERS = 1000
"""The most members a group of a chord has (``AFTER`` takes at most 1,000 ids)."""
_POLICIES = ("fail", "ignore", "continue")


@dataclass(frozen=True)
class Signature(Generic[R]):
    """A call of a task not yet enqueued (``task.s(*args, **kwargs)``); ``R``: what it returns.

    In a chain (after the first step) or as a chord's callback, the
    function is given the previous result(s) as its first argument, before
    these ``args``.
    """

    task: TaskCore
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.task.name}.s({', '.join(shown)})"


@dataclass(frozen=True)
class Chain(Generic[R]):
    """Steps run one after another; each gets the previous one's result first; ``R``: the last's."""

    steps: tuple[Signature[Any], ...]


@dataclass(frozen=True)
class Group(Generic[R]):
    """Calls run side by side; its result is the list of theirs, in order (``list[R]``)."""

    members: tuple[Signature[R], ...]


@dataclass(frozen=True)
class Chord(Generic[R]):
    """A group, then a callback after every member, given the list of their results first."""

    header: Group[Any]
    callback: Signature[R]
    on_member_failure: OnParentFailure = "fail"


def _signature(item: object, what: str) -> Signature[Any]:
    if not isinstance(item, Signature):
        raise TypeError(f"{what} takes signatures (task.s(...)), not {type(item).__name__}")
    return item


@overload
def chain(a: Signature[R], /) -> Chain[R]: ...
@overload
def chain(a: Signature[Any], b: Signature[R], /) -> Chain[R]: ...
@overload
def chain(a: Signature[Any], b: Signature[Any], c: Signature[R], /) -> Chain[R]: ...
@overload
def chain(a: Signature[Any], b: Signature[Any], c: Signature[Any], d: Signature[R], /) -> Chain[R]: ...
@overload
def chain(
    a: Signature[Any], b: Signature[Any], c: Signature[Any], d: Signature[Any], e: Signature[R], /
) -> Chain[R]: ...
@overload
def chain(*steps: Signature[Any]) -> Chain[Any]: ...
def chain(*steps: Signature[Any]) -> Chain[Any]:
    """Steps one after another: ``chain(a.s(1), b.s(), c.s())`` runs ``c(b(a(1)))``.

    Each step after the first is given the previous step's result as its
    first argument (read by its worker as it starts); a step that ends dead
    fails the rest at once.  Its result (``handle.result()``) is the last
    step's, typed by it (up to five steps; more are ``Any``).
    """
    if not steps:
        raise ValueError("a chain needs at least one step")
    return Chain(tuple(_signature(s, "chain") for s in steps))


def group(*members: Signature[R]) -> Group[R]:
    """Calls side by side, none waiting for another; the result is the list of theirs, in order."""
    if not members:
        raise ValueError("a group needs at least one member")
    if len(members) > MAX_MEMBERS:
        raise ValueError(f"a group has at most {MAX_MEMBERS} members (a callback waits for each)")
    return Group(tuple(_signature(m, "group") for m in members))


def chord(
    header: Group[Any], callback: Signature[R], *, on_member_failure: OnParentFailure = "fail"
) -> Chord[R]:
    """Fan-out, fan-in: ``callback`` runs after every member of ``header``, given their results' list.

    ``on_member_failure``: ``"fail"`` (the default: a member that ends dead
    or cancelled makes the callback end dead, at once), ``"ignore"`` or
    ``"continue"`` (it runs; that member's place in the list is None, and
    ``ctx.parents()`` says how each ended).
    """
    if not isinstance(header, Group):
        raise TypeError(f"a chord's header is a group(...), not {type(header).__name__}")
    if on_member_failure not in _POLICIES:
        raise ValueError(
            f"on_member_failure must be one of {', '.join(_POLICIES)}, got {on_member_failure!r}"
        )
    return Chord(header, _signature(callback, "chord"), on_member_failure)


@dataclass(frozen=True)
class Plan:
    """A workflow's jobs, ready to enqueue: (task, options, args, kwargs) each, and what its result is.

    ``final`` is the index of the job whose result is the workflow's (None:
    a group's, the list of every job's).
    """

    workflow_id: str
    queue: str
    jobs: tuple[tuple[TaskCore, EnqueueOptions, tuple[Any, ...], Mapping[str, Any]], ...]
    final: int | None

    @property
    def job_ids(self) -> list[str]:
        return [str(options.job_id) for _, options, _, _ in self.jobs]

    def calls(self) -> list[dict[str, Any]]:
        """``client.enqueue``'s keyword arguments for each job, in order: checked before anything is sent."""
        return [task.enqueue_args(opts, args, kwargs, self.queue) for task, opts, args, kwargs in self.jobs]


def plan(flow: Chain[Any] | Group[Any] | Chord[Any], queue: str | None = None) -> Plan:
    """The jobs of ``flow`` with their ids (``<workflow id>.<index>``), parents and policies."""
    if isinstance(flow, Chain):
        signatures = list(flow.steps)
    elif isinstance(flow, Group):
        signatures = list(flow.members)
    elif isinstance(flow, Chord):
        signatures = [*flow.header.members, flow.callback]
    else:
        raise TypeError(f"a workflow is a chain(...), group(...) or chord(...), not {type(flow).__name__}")
    apps = {id(s.task.app) for s in signatures}
    if len(apps) > 1:
        raise ValueError("every task of a workflow must be of one app (its worker runs them all)")
    queue = signatures[0].task.queue if queue is None else queue
    workflow_id = "wf-" + new_id().decode()
    ids = [f"{workflow_id}.{i}" for i in range(len(signatures))]
    jobs: list[tuple[TaskCore, EnqueueOptions, tuple[Any, ...], Mapping[str, Any]]] = []
    for i, sig in enumerate(signatures):
        options = EnqueueOptions(job_id=ids[i])
        if isinstance(flow, Chain) and i > 0:
            options = EnqueueOptions(
                job_id=ids[i], after=(ids[i - 1],), on_parent_failure="fail", feed="first"
            )
        elif isinstance(flow, Chord) and i == len(signatures) - 1:
            options = EnqueueOptions(
                job_id=ids[i], after=tuple(ids[:-1]), on_parent_failure=flow.on_member_failure, feed="list"
            )
        jobs.append((sig.task, options, tuple(sig.args), dict(sig.kwargs)))
    return Plan(workflow_id, queue, tuple(jobs), None if isinstance(flow, Group) else len(jobs) - 1)
