"""Process isolation: a worker's handlers run in child processes, which can be stopped for real.

``Worker(..., isolation="process")`` runs each slot's handler in a child
process of its own (a fresh interpreter started with ``subprocess``, safe
beside the worker's threads, that never re-runs the worker's
``__main__``).  The worker itself is unchanged: it claims the job, keeps
the lease, sends the end; only the handler's call crosses to the child.
The pool's calls block: a thread worker's thread makes them, an asyncio
worker a thread of its own per job (``echomq.asyncio._isolation``, which
also runs an ``async def`` handler in the child's own loop).  What that buys:

- a hard timeout: at ``timeout_ms`` the handler's token is cancelled
  ("timeout", forwarded to the child); ``timeout_grace`` later a handler
  still running is abandoned, and with processes that means its child is
  killed (SIGKILL) and replaced.  A thread cannot be stopped by Python;
- a handler that crashes its interpreter (a segfault in an extension,
  ``os._exit``, the OOM killer) fails its job, a try used
  (``ChildCrashed``), instead of taking the worker down: a job that kills
  every child it runs in ends dead after its tries, never loops;
- ``max_jobs_per_child``: a child runs that many jobs, then is replaced
  (Celery's ``max_tasks_per_child``): leaks in a handler's libraries are
  given back to the system.

The handler must be importable by name (a module-level function or an
instance of a module-level class that pickles): the child imports it.  It
gets a real ``echomq.JobContext``: ``checkpoint(state)``,
``checkpoint_step()`` and ``progress(value)`` are forwarded to the worker,
which stores them (fenced by the claim's token, as always) and answers; the token is cancelled in the
child when the worker's is (a remote cancel, a lost lease, the shutdown's
grace, the timeout).  An exception the handler raises is the job's, as in a
thread: pickled back to the worker and raised there (one that cannot be
pickled becomes ``ChildError`` with its type and message).  The child's
traceback is kept in the exception's notes (``__notes__``).

Children ignore SIGINT and SIGTERM: the worker owns their lives (a
terminal's Ctrl-C or a process group's SIGTERM reaches the worker, whose
graceful stop tells the handlers through their tokens).  A child whose
worker dies (its pipe closes) exits at once.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from ._protocol import Job
from ._runtime.isolation import CHILD_TRACEBACK, ISOLATIONS
from .cancel import CancelToken
from .errors import Cancelled, EchoMQError

__all__ = ["ISOLATIONS", "ChildCrashed", "ChildError", "ProcessPool", "check_isolated_handler"]

# How often a worker's thread waiting on its child looks at the job's token (a cancel to forward).
POLL_S = 0.05
# How long a child told to exit (recycled, or the worker stopping) gets before it is killed.
EXIT_GRACE_S = 2.0
# What a child runs: it imports the package, never the worker's __main__.
CHILD_PROGRAM = "from echomq.isolation import _child_entry; _child_entry"
# How long a new child may take to import the package and the handler's module.
START_TIMEOUT_S = 60.0


class ChildCrashed(EchoMQError):
    """The child process running a handler died before the handler returned (killed, crashed, exited)."""


class ChildError(EchoMQError):
    """A handler's exception that could not be pickled back from its child: its type and message."""


def check_isolated_handler(handler: object) -> None:
    """``isolation="process"`` needs a handler the child can import: TypeError naming why not."""
    where = getattr(handler, "__module__", None) or type(handler).__module__
    if where == "__main__":
        raise TypeError(
            f"isolation='process' needs a handler the children can import: {handler!r} is defined in "
            f"__main__; put it in a module of its own (the children do not run your script)"
        )
    try:
        pickle.dumps(handler)
    except Exception as exc:
        raise TypeError(
            f"isolation='process' needs a handler importable by name (a module-level function, or an "
            f"instance of a module-level class that pickles), not {handler!r}: {exc}"
        ) from None


# -- the child ------------------------------------------------------------------------------------


class _ChildKeeper:
    """In the child: what ``JobContext.checkpoint`` and ``progress`` call, forwarded to the worker."""

    def __init__(self, link: _ChildLink) -> None:
        self._link = link

    def _store(self, state: bytes | None) -> bool:
        return bool(self._link.ask("checkpoint", state))

    def _progress(self, data: bytes) -> None:
        self._link.ask("progress", data)


class _ChildLink:
    """The child's end of the pipe: a reader thread routes the worker's messages, sends are locked."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()
        self._jobs: list[tuple[Job, bool]] = []
        self._replies: list[tuple[Any, ...]] = []
        self._arrived = threading.Condition()
        self.token: CancelToken | None = None
        self._closing = False
        threading.Thread(target=self._read, name="echomq-child-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the worker is gone: nothing of ours may run on
                os._exit(1)
            except Exception as exc:  # an answer's error of a class this child cannot rebuild
                message = ("answered", None, ChildError(f"the worker's answer could not be read: {exc}"))
            kind = message[0]
            with self._arrived:
                if kind == "job":
                    self._jobs.append((message[1], message[2]))
                elif kind == "cancel":
                    if self.token is not None:
                        self.token.cancel(message[1])
                elif kind == "answered":
                    self._replies.append(message)
                elif kind == "exit":
                    self._closing = True
                self._arrived.notify_all()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self.conn.send(message)

    def next_job(self) -> tuple[Job, bool] | None:
        with self._arrived:
            while not self._jobs and not self._closing:
                self._arrived.wait()
            if self._jobs:
                return self._jobs.pop(0)
            return None

    def ask(self, what: str, arg: object) -> object:
        """The worker does ``what`` (a checkpoint, a progress) for the handler: its answer, or its error."""
        self.send((what, arg))
        with self._arrived:
            while not self._replies:
                self._arrived.wait()
            _, answer, error = self._replies.pop(0)
        if error is not None:
            raise error
        return answer


def _child_entry(fd: int) -> None:
    """A child's program (``python -c``): its pipe is ``fd``; the worker sends its setup first."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        _, path, handler_bytes = conn.recv()
        sys.path[:] = path  # the worker's: the handler's module is found as it was there
        handler = pickle.loads(handler_bytes)
    except BaseException as exc:  # said to the worker, which refuses to start (or fails the job)
        with contextlib.suppress(OSError):
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    _child_main(conn, handler)


def _child_main(conn: Connection, handler: Callable[..., object]) -> None:
    """A child's life: run the jobs the worker sends, one at a time, until told to exit."""
    from ._sync.context import JobContext  # the child's own import of the package

    link = _ChildLink(conn)
    link.send(("ready",))  # imported and listening: the worker may send it a job
    while True:
        item = link.next_job()
        if item is None:
            return
        job, context_style = item
        token = CancelToken()
        with link._arrived:
            link.token = token
        try:
            if context_style:
                value = handler(JobContext(job, token, _ChildKeeper(link)))  # type: ignore[arg-type]
            else:
                value = handler(job, token)
        except Cancelled as exc:  # at a safe point: the worker's token says why (its args do not pickle)
            link.send(("cancelled", exc.reason))
        except BaseException as exc:  # every end of the handler is the job's: sent back as it is
            link.send(("raised", *_portable(exc)))
        else:
            link.send(("returned", _portable_value(value)))
        finally:
            with link._arrived:
                link.token = None


def _portable_value(value: object) -> object:
    """What a handler returned, as the worker gets it: itself when it pickles, else None.

    A worker uses a handler's value only when it is a result to store
    (``StoredResult``, bytes inside); anything else is dropped, as in a thread.
    """
    try:
        pickle.loads(pickle.dumps(value))
    except Exception:
        return None
    return value


def _portable(exc: BaseException) -> tuple[bytes, str]:
    """``exc`` pickled (or a ``ChildError`` naming it when it will not), and the child's traceback.

    The traceback is the one a thread would store (from the handler's own
    frames: ``traceback_text``); the worker stores it as the job's.
    """
    from ._runtime import traceback_text  # not at the top: _runtime imports this module

    text = traceback_text(exc)
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)  # an exception whose __init__ does not take its args fails here, not later
    except Exception:
        data = pickle.dumps(ChildError(f"{type(exc).__name__}: {exc}"))
    return data, text


# -- the worker's side ----------------------------------------------------------------------------


class _Process:
    """A child's process: ``subprocess.Popen`` seen as the pool uses it."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen

    def is_alive(self) -> bool:
        return self.popen.poll() is None  # poll() reaps an ended child

    def join(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)

    @property
    def exitcode(self) -> int | None:
        return self.popen.returncode

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.popen.kill()


class _Child:
    """One child process and the worker's end of its pipe."""

    def __init__(self, process: _Process, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.jobs = 0
        self.spent = False  # it ran as many jobs of one kind as that kind allows (``limit_of``)
        self._kinds: dict[str, int] = {}  # jobs run, by kind (``limit_of``'s)
        self.ready = False  # it said so: imported, listening
        self.busy = False  # a handler runs in it now
        self.failure = ""  # what it said when it could not start

    def await_ready(self, timeout: float) -> None:
        """Wait for the child's "ready"; ChildCrashed if it dies or stays silent."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise ChildCrashed(f"the handler's process did not start within {timeout:.0f} s")
            if not wait([self.conn], left):
                continue
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "failed":
                self.failure = message[1]
                break
            self.ready = message[0] == "ready"
        if not self.ready:
            self.process.join(1.0)
            why = f": {self.failure}" if self.failure else ""
            raise ChildCrashed(
                f"the handler's process could not start ({_how(self.process.exitcode)}){why}"
            )

    def kill(self) -> None:
        self.process.kill()


def _how(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


class ProcessPool:
    """The children that run a worker's handlers, one job at a time each (see the module docstring).

    ``prestart(n)`` starts ``n`` children and waits until they can take a
    job (the worker does this before it claims: a child's start, an
    interpreter's imports, is not a job's time).  ``call(job, cancel,
    keeper, context_style)`` runs the handler for one job in an idle child
    and returns when it has ended: it returns if the handler returned,
    raises what the handler raised, or raises ``ChildCrashed`` if the child
    died.  A child that dies, or has run ``max_jobs_per_child`` jobs, is
    replaced at once (the new one starts while the worker goes on).
    ``kill(thread)`` kills the child running ``thread``'s handler (abandoned
    past its timeout); ``close()`` stops them all.
    """

    def __init__(
        self,
        handler: Callable[..., object],
        *,
        max_jobs_per_child: int | None = None,
        limit_of: Callable[[Job], tuple[str, int] | None] | None = None,
    ) -> None:
        check_isolated_handler(handler)
        self.handler = handler
        self.max_jobs_per_child = max_jobs_per_child
        # A job's own limit, by its kind: an app's task with its own ``max_jobs_per_child`` in a
        # worker whose children run every task (``DispatchCore.child_limit``).  A child that has
        # run that many jobs of one kind is replaced, as one at the worker's limit is.
        self.limit_of = limit_of
        self._handler_bytes = pickle.dumps(handler)
        self._idle: list[_Child] = []
        self._busy: dict[threading.Thread, _Child] = {}
        self._retired: list[_Child] = []  # told to exit: joined at close
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0  # children started, ever (replacements included)

    def _start_child(self) -> _Child:
        ours, theirs = socket.socketpair()
        with theirs:
            popen = subprocess.Popen(
                [sys.executable, "-c", f"{CHILD_PROGRAM}({theirs.fileno()})"],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        conn = Connection(ours.detach())
        with contextlib.suppress(OSError):  # a child that died at once says so in await_ready
            conn.send(("setup", list(sys.path), self._handler_bytes))
        with self._lock:
            self.started += 1
        return _Child(_Process(popen), conn)

    def prestart(self, n: int, timeout: float = START_TIMEOUT_S) -> None:
        """Start ``n`` children and wait until each is ready; ChildCrashed if one cannot start."""
        children = [self._start_child() for _ in range(n)]
        with self._lock:
            self._idle += children
        for child in children:
            child.await_ready(timeout)

    def _take(self) -> _Child:
        with self._lock:
            if self._closed:
                raise ChildCrashed("the worker's process pool is closed")
            child = self._idle.pop(0) if self._idle else None
            me = threading.current_thread()
        if child is None:
            child = self._start_child()
        child.busy = True
        with self._lock:
            self._busy[me] = child
        return child

    def _give(self, child: _Child) -> None:
        """``child`` ran a job: back to the idle ones, or retired (its jobs done) and replaced."""
        with self._lock:
            for thread, c in list(self._busy.items()):
                if c is child:
                    del self._busy[thread]
            child.busy = False
            limit = self.max_jobs_per_child
            keep = not self._closed and child.process.is_alive() and (limit is None or child.jobs < limit)
            keep = keep and not child.spent
            if keep:
                self._idle.append(child)
                return
            if child.process.is_alive():
                self._retired.append(child)
        with contextlib.suppress(OSError, ValueError):
            child.conn.send(("exit",))
        self._replace()

    def _replace(self) -> None:
        with self._lock:
            if self._closed:
                return
            gone = [c for c in self._retired if not c.process.is_alive()]  # is_alive() reaps them
            self._retired = [c for c in self._retired if c not in gone]
        for child in gone:
            with contextlib.suppress(OSError):
                child.conn.close()
        child = self._start_child()
        with self._lock:
            if not self._closed:
                self._idle.append(child)
                return
        child.kill()

    def take(self) -> _Child:
        """An idle child, ready for a job (waiting for a replacement's start if need be).

        ChildCrashed if none can start.  Give it to ``run``, which hands it back.
        """
        child = self._take()
        try:
            child.await_ready(START_TIMEOUT_S)
        except BaseException:
            self._give(child)
            raise
        return child

    def run(
        self,
        child: _Child,
        job: Job,
        cancel: CancelToken,
        keeper: Any,
        context_style: bool,
        kill_when: Callable[[], bool] | None = None,
    ) -> object:
        """Run the handler for ``job`` in ``child`` (from ``take``); its value or its exception, as here.

        ``kill_when``, looked at as the token is: once it says so the child
        is killed (``ChildCrashed``).  The task layer's own children use it
        (``echomq.tasks.isolated``): the worker that abandons their job
        knows nothing of them.
        """
        child.jobs += 1
        own = self.limit_of(job) if self.limit_of is not None else None
        if own is not None:
            kind, most = own
            child._kinds[kind] = ran = child._kinds.get(kind, 0) + 1
            child.spent = child.spent or ran >= most
        try:
            return self._run_in(child, job, cancel, keeper, context_style, kill_when)
        finally:
            self._give(child)

    def call(self, job: Job, cancel: CancelToken, keeper: Any, context_style: bool) -> object:
        """``run`` in the child ``take`` gives."""
        return self.run(self.take(), job, cancel, keeper, context_style)

    def _run_in(
        self,
        child: _Child,
        job: Job,
        cancel: CancelToken,
        keeper: Any,
        context_style: bool,
        kill_when: Callable[[], bool] | None,
    ) -> object:
        try:
            child.conn.send(("job", job, context_style))
        except (OSError, ValueError) as exc:
            raise ChildCrashed(f"the handler's process could not be given the job: {exc}") from None
        forwarded = killed = False
        while True:
            reason = cancel.check()
            if reason is not None and not forwarded:
                forwarded = True
                with contextlib.suppress(OSError, ValueError):
                    child.conn.send(("cancel", reason.reason))
            if kill_when is not None and not killed and kill_when():
                killed = True  # its end is the pipe's: ChildCrashed below
                child.kill()
            if wait([child.conn], POLL_S):  # a message, or the end of the pipe: the child died
                try:
                    message = child.conn.recv()
                except (EOFError, OSError):
                    raise self._crashed(child) from None
                if message[0] == "returned":
                    return message[1]
                if message[0] == "raised":
                    raise self._raised(message[1], message[2])
                if message[0] == "cancelled":
                    raise Cancelled(message[1])
                if message[0] == "checkpoint":
                    self._answer(child, lambda state: bool(keeper._store(state)), message[1])
                elif message[0] == "progress":
                    self._answer(child, keeper._progress, message[1])
            elif not child.process.is_alive() and not child.conn.poll(0):
                # Ended with its pipe still open: a process it left behind holds the pipe (a fork,
                # a daemon), so the end of the pipe would never come.  The process's end is its end.
                raise self._crashed(child)

    @staticmethod
    def _answer(child: _Child, do: Callable[[Any], object], arg: object) -> None:
        """Do what the handler asked of its context here, where the lease is; the child gets the answer."""
        error: BaseException | None = None
        answer: object = None
        try:
            answer = do(arg)
        except Exception as exc:  # a state over the ceiling (BadArgument), a lost lease: the handler's
            error = exc
        try:
            child.conn.send(("answered", answer, error))
        except (OSError, ValueError):
            pass  # the child is gone: its end is read as such
        except Exception:  # an error that will not pickle: named, so that the handler's wait ends
            text = f"{type(error).__name__}: {error}"
            with contextlib.suppress(OSError, ValueError):
                child.conn.send(("answered", None, ChildError(text)))

    @staticmethod
    def _crashed(child: _Child) -> ChildCrashed:
        child.process.join(1.0)
        child.conn.close()
        return ChildCrashed(f"the handler's process died before it returned ({_how(child.process.exitcode)})")

    @staticmethod
    def _raised(data: bytes, text: str) -> BaseException:
        try:
            loaded: object = pickle.loads(data)
        except Exception as why:  # a class the worker cannot import
            loaded = ChildError(f"the handler raised an exception the worker cannot read: {why}")
        exc = (
            loaded
            if isinstance(loaded, BaseException)
            else ChildError(f"the handler's process sent {type(loaded).__name__}, not an exception")
        )
        if hasattr(exc, "add_note"):  # Python 3.11+: the child's traceback goes with it
            exc.add_note("in the handler's process:\n" + text.rstrip())
        with contextlib.suppress(AttributeError):  # the job's traceback is the child's (traceback_text)
            exc.__dict__[CHILD_TRACEBACK] = text
        return exc

    def kill(self, thread: threading.Thread) -> bool:
        """Kill the child running ``thread``'s handler (abandoned past its timeout); True if there was one."""
        with self._lock:
            child = self._busy.get(thread)
        if child is None:
            return False
        child.kill()
        return True

    def close(self) -> None:
        """Stop every child: an idle one is told to exit; one still running a handler is killed.

        A handler still running when the worker closes its pool belongs to a
        job the worker gave back (a forced stop): killing it is what stops
        it, so that it cannot overlap with the job's next run.
        """
        with self._lock:
            self._closed = True
            busy = list(self._busy.values())
            children = [*self._idle, *busy, *self._retired]
            self._idle.clear()
            self._retired.clear()
        for child in children:
            if child in busy:
                child.kill()
            else:
                with contextlib.suppress(OSError, ValueError):
                    child.conn.send(("exit",))
        deadline = time.monotonic() + EXIT_GRACE_S
        for child in children:
            child.process.join(max(0.0, deadline - time.monotonic()))
        for child in children:
            if child.process.is_alive():
                child.kill()
            child.process.join(1.0)
            with contextlib.suppress(OSError):
                child.conn.close()
