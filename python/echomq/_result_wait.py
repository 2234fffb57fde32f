"""The wait for a job's end, driven with threads and with asyncio (the rules: ``_results.py``).

Both clients' ``result`` and the task handles call it; it uses no driver of
its own, only the client's redis-py client and its subscriber (``Client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import Any, Protocol

import redis

from . import _protocol as proto
from ._redis import never_reached, unreachable, unwrapped
from ._results import ResultWait
from ._serializers import JSON, Serializer
from .errors import ResultTimeout


class Client(Protocol):
    """What a wait uses of ``echomq.Client`` (a Protocol: the client imports this module)."""

    redis: Any

    def _subscriber(self, confirmations: bool = False) -> Any: ...


class AsyncClient(Protocol):
    """What a wait uses of ``echomq.asyncio.Client``."""

    redis: Any

    def _subscriber(self, confirmations: bool = False) -> Any: ...

__all__ = ["await_result", "wait_result"]

# What a wait takes for a lost connection (then it subscribes again): redis-py's, and the OS's.
_LOST = (redis.ConnectionError, redis.TimeoutError, OSError)

# Whether a server announces ends with SPUBLISH, per redis client: asked once (INFO server).
_SHARDED: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _server_info(info: Any) -> dict[str, Any]:
    if isinstance(info, dict) and info and all(isinstance(v, dict) for v in info.values()):
        return next(iter(info.values()))  # a cluster: every node runs the same server
    return info if isinstance(info, dict) else {}


def _sharded(redis_client: Any) -> bool:
    known = _SHARDED.get(redis_client)
    if known is None:
        known = _SHARDED[redis_client] = proto.sharded_announcements(
            _server_info(redis_client.info("server"))
        )
    return known


async def _asharded(redis_client: Any) -> bool:
    known = _SHARDED.get(redis_client)
    if known is None:
        known = _SHARDED[redis_client] = proto.sharded_announcements(
            _server_info(await redis_client.info("server"))
        )
    return known


def _subscribe(pubsub: Any, wait: ResultWait, sharded: bool) -> None:
    if sharded:
        pubsub.ssubscribe(wait.channel())
    else:
        pubsub.subscribe(wait.channel())


def _next_message(pubsub: Any, sharded: bool, timeout: float) -> Any:
    """The subscription's next message within ``timeout`` s: a cluster's sharded ones come per node."""
    if sharded and hasattr(pubsub, "get_sharded_message"):
        return pubsub.get_sharded_message(timeout=timeout)
    return pubsub.get_message(timeout=timeout)


async def _asubscribe(pubsub: Any, wait: ResultWait, sharded: bool) -> None:
    if sharded:
        await pubsub.ssubscribe(wait.channel())
    else:
        await pubsub.subscribe(wait.channel())


async def _anext_message(pubsub: Any, sharded: bool, timeout: float) -> Any:
    if sharded and hasattr(pubsub, "get_sharded_message"):
        return await pubsub.get_sharded_message(timeout=timeout)
    return await pubsub.get_message(timeout=timeout)


def wait_result(
    client: Client, queue: str, job_id: str, timeout: float | None, serializer: Serializer = JSON
) -> Any:
    """``client.result``'s body: subscribe, read the row on every confirmation, announcement, and
    ``READ_EVERY_S``; a lost connection is subscribed again (the rules: ``_results.py``)."""
    wait = ResultWait(queue, job_id, timeout, time.monotonic(), serializer)
    redis_client: Any = client.redis
    while True:
        pubsub = None
        try:
            sharded = _sharded(redis_client)
            pubsub = client._subscriber(confirmations=True)
            _subscribe(pubsub, wait, sharded)
            while True:  # the subscription holds before the row is read: no end slips between
                message = _next_message(pubsub, sharded, wait.listen(time.monotonic()))
                if wait.heard(message, time.monotonic()):
                    settled = wait.settle(redis_client.execute_command(*wait.read(time.monotonic())))
                    if settled is not None:
                        return settled.value
        except ResultTimeout:
            raise
        except _LOST as exc:
            if never_reached(redis_client, exc, wait.reached):
                # nothing listens there: waiting would only hide it (for ever, with no timeout); the
                # public error every call raises for it
                raise unreachable(exc) from unwrapped(exc)
            time.sleep(wait.lost(exc, time.monotonic()))
        finally:
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    pubsub.close()


async def await_result(
    client: AsyncClient, queue: str, job_id: str, timeout: float | None, serializer: Serializer = JSON
) -> Any:
    """The asyncio twin of ``wait_result``."""
    wait = ResultWait(queue, job_id, timeout, time.monotonic(), serializer)
    redis_client: Any = client.redis
    while True:
        pubsub = None
        try:
            sharded = await _asharded(redis_client)
            pubsub = client._subscriber(confirmations=True)
            await _asubscribe(pubsub, wait, sharded)
            while True:
                message = await _anext_message(pubsub, sharded, wait.listen(time.monotonic()))
                if wait.heard(message, time.monotonic()):
                    settled = wait.settle(await redis_client.execute_command(*wait.read(time.monotonic())))
                    if settled is not None:
                        return settled.value
        except ResultTimeout:
            raise
        except _LOST as exc:
            if never_reached(redis_client, exc, wait.reached):
                # nothing listens there: waiting would only hide it (for ever, with no timeout); the
                # public error every call raises for it
                raise unreachable(exc) from unwrapped(exc)
            await asyncio.sleep(wait.lost(exc, time.monotonic()))
        finally:
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    await _aclose(pubsub)


async def _aclose(pubsub: Any) -> None:
    closing = getattr(pubsub, "aclose", None) or pubsub.close  # aclose() from redis-py 5.0.1
    await closing()
