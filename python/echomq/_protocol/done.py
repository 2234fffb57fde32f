"""A job's end, announced: the channel a waiter for one job listens on (sans I/O).

Every verb that ends a job -- COMPLETE, COMPLETECLAIM, FAIL to dead or
cancelled, RELEASE or SWEEP to cancelled or dead, CANCEL of a waiting job --
and OBLITERATE, which deletes jobs that had not ended, publishes the job's id
on ``<base>done:<id>`` (module/emq_end.c; the scripts' ``emq.ended_apply``).
A waiter subscribes first, then reads the job's row, then waits for the
message: a job that ended before the subscription is seen in the row, one
that ends after it in the message.  A message published while nobody was
subscribed is gone, so the waiter reads the row again after every new
subscription, and every few seconds whatever it hears
(``echomq.tasks.results``).

The announcement is sharded pub/sub (SPUBLISH) where the server has it --
Redis 7.0 and later, every Valkey -- so that a cluster does not broadcast it
to every node: the waiter subscribes with SSUBSCRIBE, on the node that
serves the queue's slot.  Redis 6.2 has no sharded pub/sub: there the module
publishes with PUBLISH and the waiter subscribes with SUBSCRIBE.
"""

from __future__ import annotations

from typing import Any

from .calls import JobId, keys_of, wire


def done_channel(queue: str, job_id: JobId) -> bytes:
    """The channel a job's end is announced on: ``<base>done:<id>`` (the message is the id)."""
    return keys_of(queue).base.encode() + b"done:" + wire(job_id)


def sharded_announcements(server_info: dict[str, Any]) -> bool:
    """Whether the server announces ends with SPUBLISH (from INFO server): Redis 7.0+, any Valkey."""
    if "valkey_version" in server_info or server_info.get("server_name") == "valkey":
        return True
    major = str(server_info.get("redis_version", "0")).split(".", 1)[0]
    return major.isdigit() and int(major) >= 7


def done_subscription(queue: str, job_id: JobId, sharded: bool) -> tuple[Any, ...]:
    """The command that listens for a job's end: SSUBSCRIBE (sharded) or SUBSCRIBE <channel>."""
    return ("SSUBSCRIBE" if sharded else "SUBSCRIBE", done_channel(queue, job_id))
