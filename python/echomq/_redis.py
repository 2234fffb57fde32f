"""redis-py as both drivers use it: the clients ``from_url`` builds, their retries, and the errors
that say the server was never reached.

Below the drivers (``echomq.client``, ``echomq.asyncio.client``), so that
neither imports its twin for these.
"""

from __future__ import annotations

import copy
import inspect
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import redis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import AbstractBackoff, EqualJitterBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from ._protocol.calls import missing_code
from ._runtime.tries import NotSent
from .errors import ServerUnreachable

T = TypeVar("T")

# redis-py's settings for the clients ``from_url`` builds (both packages).
# Every EMQ.* command is safe to send twice: CLAIM and ENQUEUE carry a request
# id (REQ) whose retry is answered with the first call's result; COMPLETE,
# FAIL and RELEASE by a token that already ended the hold answer as the first
# call did; EXTEND and CHECKPOINT set an absolute deadline; SWEEP and CANCEL
# repeat as no-ops.  So a command whose reply was lost (a timeout, a dropped
# connection) is sent again, a few times, with backoff, on a fresh connection.
RETRIES = 10
RETRY_FIRST_S = 0.05
RETRY_CAP_S = 1.0
SOCKET_TIMEOUT_S = 5.0


def _missing(reply: object) -> bool:
    """A pipelined reply saying the node lacked the script: nothing ran."""
    return isinstance(reply, ResponseError) and missing_code(reply)


def jittered_backoff() -> AbstractBackoff:
    """Waits from ``RETRY_FIRST_S`` doubling to ``RETRY_CAP_S``, jittered, on every redis-py from 5.0.

    ``ExponentialWithJitterBackoff`` came in redis-py 5.3 (it is redis-py's
    default since 6); before it, ``EqualJitterBackoff`` draws the same kind
    of wait: half of the doubled one, plus a random part of the other half.
    """
    try:
        from redis.backoff import ExponentialWithJitterBackoff
    except ImportError:  # redis-py < 5.3
        return EqualJitterBackoff(base=RETRY_FIRST_S, cap=RETRY_CAP_S)
    return ExponentialWithJitterBackoff(base=RETRY_FIRST_S, cap=RETRY_CAP_S)


def _refused(error: BaseException) -> bool:
    """Was ``error`` an address nothing answers at: refused, or a host name that does not resolve?

    Nothing was sent either way.
    """
    seen: BaseException | None = error
    for _ in range(8):  # redis-py wraps the OSError once or twice; a cycle must not hang us
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError | socket.gaierror):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def unreachable(error: BaseException) -> ServerUnreachable:
    """The public error for a call that reached no server (``error``, redis-py's or ours, its cause)."""
    inner = unwrapped(error)
    return ServerUnreachable(f"cannot reach the server: {inner}")


def never_reached(redis_client: Any, error: BaseException, reached_here: bool) -> bool:
    """A refused connection to a server neither this client nor its redis-py client ever reached.

    Nothing listens there (a wrong URL, a server not started): resending the
    call only delays the error.  Once either has reached the server, a
    refusal is that server restarting, and a resend rides it out.
    """
    if reached_here or not _refused(error):
        return False
    get_retry = getattr(redis_client, "get_retry", None)
    retry = get_retry() if get_retry is not None else None
    reached = getattr(retry, "_reached", None)
    return not (isinstance(reached, _Reached) and reached.yes)


def unwrapped(error: BaseException) -> BaseException:
    """The connection error a ``NotSent`` carries (what the user's own redis-py call would raise)."""
    inner = error.__context__
    return inner if isinstance(error, NotSent) and isinstance(inner, redis.ConnectionError) else error


class _Unreached(Exception):
    """Carries a refused connection past redis-py's retry loop, which would retry it."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Reached:
    """Whether a client has reached its server once: shared by every copy of its ``Retry``."""

    def __init__(self) -> None:
        self.yes = False


class _ReachedRetry(Retry):
    """redis-py's ``Retry``, except that a refused connection is retried only once the server was reached.

    A refusal before the client ever reached its server means nothing listens
    at that address (a wrong URL, a server not started): retrying it only
    delays the error (ten retries took 6.7 s).  Once the client has reached the
    server, a refusal is that server restarting, and the retries ride it out.
    redis-py copies the ``Retry`` into each connection: the copies share one
    ``_Reached``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reached = _Reached()

    def __deepcopy__(self, memo: dict[int, Any]) -> _ReachedRetry:
        twin = copy.copy(self)
        twin._backoff = copy.deepcopy(self._backoff, memo)
        return twin

    def call_with_retry(self, do: Callable[[], T], fail: Any, *args: Any, **kwargs: Any) -> T:
        reached = self._reached

        def once() -> T:
            try:
                result = do()
            except redis.ConnectionError as exc:
                if not reached.yes and _refused(exc):
                    raise _Unreached(exc) from exc
                raise
            reached.yes = True
            return result

        try:
            return super().call_with_retry(once, fail, *args, **kwargs)
        except _Unreached as stop:
            error = stop.error
        raise unreachable(error) from error


def default_retry() -> Retry:
    """The redis-py ``Retry`` that ``from_url`` gives its client (a fresh one each time).

    A reply lost to a timeout or a dropped connection is sent again, up to
    ``RETRIES`` times with backoff; a refused connection only once the client
    has reached its server (a restart), never before (nothing listens there).
    """
    return _ReachedRetry(
        jittered_backoff(),
        RETRIES,
        supported_errors=(redis.ConnectionError, redis.TimeoutError),
    )


class _ReachedAsyncRetry(AsyncRetry):
    """``_ReachedRetry`` for ``redis.asyncio``: refused connections retried once the server was reached."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reached = _Reached()

    def __deepcopy__(self, memo: dict[int, Any]) -> _ReachedAsyncRetry:
        twin = copy.copy(self)
        twin._backoff = copy.deepcopy(self._backoff, memo)
        return twin

    async def call_with_retry(
        self, do: Callable[[], Awaitable[T]], fail: Any, *args: Any, **kwargs: Any
    ) -> T:
        reached = self._reached

        async def once() -> T:
            try:
                result = await do()
            except redis.ConnectionError as exc:
                if not reached.yes and _refused(exc):
                    raise _Unreached(exc) from exc
                raise
            reached.yes = True
            return result

        try:
            return cast(T, await super().call_with_retry(once, fail, *args, **kwargs))
        except _Unreached as stop:
            error = stop.error
        raise unreachable(error) from error


def default_async_retry() -> AsyncRetry:
    """``default_retry`` for a ``redis.asyncio`` client."""
    return _ReachedAsyncRetry(
        jittered_backoff(),
        RETRIES,
        supported_errors=(redis.ConnectionError, redis.TimeoutError),
    )


def connection_defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for redis-py with echomq's deliberate defaults where the caller gave none."""
    out = dict(kwargs)
    out.setdefault("retry", default_retry())
    # redis-py before 6 retries only the errors named here too, whatever the Retry supports.
    out.setdefault("retry_on_error", [redis.ConnectionError, redis.TimeoutError])
    out.setdefault("socket_timeout", SOCKET_TIMEOUT_S)
    out.setdefault("socket_connect_timeout", SOCKET_TIMEOUT_S)
    out.setdefault("socket_keepalive", True)
    return out


def check_redis_client(redis_client: object, *, want_async: bool) -> None:
    """Refuse a redis client of the other kind (sync vs asyncio) at construction, not at first use."""
    execute = getattr(redis_client, "execute_command", None)
    if execute is None:
        raise TypeError(f"redis_client must be a redis-py client, not {type(redis_client).__name__}")
    is_async = inspect.iscoroutinefunction(execute)
    if is_async and not want_async:
        raise TypeError(
            f"redis_client is an asyncio client ({type(redis_client).__module__}."
            f"{type(redis_client).__name__}): use echomq.asyncio.Client with it"
        )
    if want_async and not is_async:
        raise TypeError(
            f"redis_client is a synchronous client ({type(redis_client).__module__}."
            f"{type(redis_client).__name__}): use echomq.Client with it, or redis.asyncio here"
        )
