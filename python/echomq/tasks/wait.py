"""The wait for a job's end, driven with threads and with asyncio (the rules: ``results.py``)."""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

from .. import _protocol as proto
from .results import ResultWait, is_announcement, is_confirmation
from .serializers import JSON, Serializer

if TYPE_CHECKING:
    from ..asyncio.client import Client as AsyncClient
    from ..client import Client

__all__ = ["await_result", "wait_result"]

# A wait looks up from its socket at least this often (no command is sent: it only reads).
LOOK_UP_S = 5.0

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


async def _anext_message(pubsub: Any, sharded: bool, timeout: float) -> Any:
    if sharded and hasattr(pubsub, "get_sharded_message"):
        return await pubsub.get_sharded_message(timeout=timeout)
    return await pubsub.get_message(timeout=timeout)


def wait_result(
    client: Client, queue: str, job_id: str, timeout: float | None, serializer: Serializer = JSON
) -> Any:
    """``client.result``'s body: subscribe, read the row, wait for the announcement (never a poll)."""
    wait = ResultWait(queue, job_id, timeout, time.monotonic(), serializer)
    redis_client: Any = client.redis
    sharded = _sharded(redis_client)
    pubsub = redis_client.pubsub()
    try:
        _subscribe(pubsub, wait, sharded)
        confirmed = False
        while not confirmed:  # the subscription holds before the row is read: no end slips between
            left = wait.remaining(time.monotonic())
            message = _next_message(pubsub, sharded, LOOK_UP_S if left is None else min(left, LOOK_UP_S))
            confirmed = is_confirmation(message)
        while True:
            settled = wait.settle(redis_client.execute_command(*wait.read()))
            if settled is not None:
                return settled.value
            while True:
                left = wait.remaining(time.monotonic())
                message = _next_message(pubsub, sharded, LOOK_UP_S if left is None else min(left, LOOK_UP_S))
                if is_announcement(message):
                    break
    finally:
        pubsub.close()


async def await_result(
    client: AsyncClient, queue: str, job_id: str, timeout: float | None, serializer: Serializer = JSON
) -> Any:
    """The asyncio twin of ``wait_result``."""
    wait = ResultWait(queue, job_id, timeout, time.monotonic(), serializer)
    redis_client: Any = client.redis
    sharded = _SHARDED.get(redis_client)
    if sharded is None:
        sharded = _SHARDED[redis_client] = proto.sharded_announcements(
            _server_info(await redis_client.info("server"))
        )
    pubsub = redis_client.pubsub()
    try:
        if sharded:
            await pubsub.ssubscribe(wait.channel())
        else:
            await pubsub.subscribe(wait.channel())
        confirmed = False
        while not confirmed:
            left = wait.remaining(time.monotonic())
            message = await _anext_message(
                pubsub, sharded, LOOK_UP_S if left is None else min(left, LOOK_UP_S)
            )
            confirmed = is_confirmation(message)
        while True:
            settled = wait.settle(await redis_client.execute_command(*wait.read()))
            if settled is not None:
                return settled.value
            while True:
                left = wait.remaining(time.monotonic())
                message = await _anext_message(
                    pubsub, sharded, LOOK_UP_S if left is None else min(left, LOOK_UP_S)
                )
                if is_announcement(message):
                    break
    finally:
        await pubsub.aclose()
