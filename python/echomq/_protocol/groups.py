"""Groups (issue 45): ENQUEUE's and ENQUEUEMANY's ``GROUP <g>``.

``group_args`` checks ``group=`` before anything is sent, with the server's
rule (module/emq_core.c, ``emq_parse_group``): 1 to 128 bytes of letters,
digits and ``-_.:@`` -- the name is part of a key and of what operators
read.  The server counts each group's active jobs exactly
(docs/concepts/flow-control.md, "Groups").
"""

from __future__ import annotations

import re
from typing import Any

GROUP_MAX = 128
"""The longest group name, in bytes (the server's ceiling)."""

_GROUP = re.compile(rb"[A-Za-z0-9_.:@-]{1,128}")


def group_args(group: str | None) -> tuple[Any, ...]:
    """``GROUP <g>`` (nothing for None); ``ValueError``/``TypeError`` naming ``group``."""
    if group is None:
        return ()
    if not isinstance(group, str):
        raise TypeError(f"group must be a str, not {type(group).__name__}")
    name = group.encode("utf-8", "surrogateescape")
    if not _GROUP.fullmatch(name):
        raise ValueError(f"group must be 1 to {GROUP_MAX} bytes of letters, digits and -_.:@, got {group!r}")
    return ("GROUP", name)
