"""What both drivers' bounded tries share: the numbers their connections keep to, and ``NotSent``.

The sync driver's connections are ``echomq._attempt``'s, the asyncio
driver's ``echomq.asyncio._attempt``'s; the rules they share live here,
below both, so that neither imports its twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ServerUnreachable

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # the fast extra is not installed
    _hiredis_pack = None

__all__ = ["SPARE", "SUBSCRIBER_TIMEOUT_S", "WORKER_CONNECT_S", "NotSent", "pack"]

# A worker's connections connect and shake hands within this (or the try's
# deadline, if sooner).
WORKER_CONNECT_S = 2.0
# Connections a client keeps beyond what its workers reserved: a lone
# LeaseKeeper's checkpoints, the backend probe.
SPARE = 4
# A pushed-cancel subscription connects, shakes hands and reads within this:
# a worker that stops never waits long for its listener.
SUBSCRIBER_TIMEOUT_S = 1.0


class NotSent(ServerUnreachable):
    """A try that never reached the wire: no connection was free, or none could be opened, in time.

    Nothing was sent, so nothing ran: a claim's REQ is no more in doubt than it was.  The
    clients' public calls raise it as a plain ``echomq.ServerUnreachable``.
    """


def pack(connection: Any, commands: list[tuple[Any, ...]]) -> Any:
    """The commands as RESP, for either driver's connection: hiredis's packer when installed (the
    ``fast`` extra) and the connection encodes as it does (UTF-8, strict), else redis-py's own (pure
    Python: an encoder call and five isinstance checks an argument, a busy worker's largest cost after
    the event loop)."""
    encoder = getattr(connection, "encoder", None)
    if (
        _hiredis_pack is not None
        and getattr(encoder, "encoding", None) == "utf-8"
        and getattr(encoder, "encoding_errors", None) == "strict"
    ):
        return [b"".join(_hiredis_pack(_split_name(command)) for command in commands)]
    return connection.pack_commands(commands)


def _split_name(command: tuple[Any, ...]) -> tuple[Any, ...]:
    """A command name with words in it ("COMMAND INFO") sent as separate arguments, as redis-py does."""
    name = command[0]
    if isinstance(name, str) and " " in name:
        return (*name.split(), *command[1:])
    return command
