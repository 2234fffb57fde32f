"""What both drivers' bounded tries share: the numbers their connections keep to, and ``NotSent``.

The sync driver's connections are ``echomq._attempt``'s, the asyncio
driver's ``echomq.asyncio._attempt``'s; the rules they share live here,
below both, so that neither imports its twin.
"""

from __future__ import annotations

from ..errors import ServerUnreachable

__all__ = ["SPARE", "SUBSCRIBER_TIMEOUT_S", "WORKER_CONNECT_S", "NotSent"]

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
