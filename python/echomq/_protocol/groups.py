"""Groups (issue 45): ENQUEUE's and ENQUEUEMANY's ``GROUP <g>``, and one group's cap and pause.

``group_args`` checks ``group=`` before anything is sent, with the server's
rule (module/emq_core.c, ``emq_parse_group``): 1 to 128 bytes of letters,
digits and ``-_.:@`` -- the name is part of a key and of what operators
read.  The server counts each group's active jobs exactly
(docs/concepts/flow-control.md, "Groups").  ``set_group_limit``,
``pause_group`` and ``resume_group`` are EMQ.GROUPLIMIT; ``group_names`` and
``group_rows`` read what ``client.groups`` lists.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .calls import Call, keys_of, text
from .views import Read, group_names, group_names_commands

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


GROUP_CAP_MAX = 1_000_000_000
"""The largest ``max_active`` a group takes (the server's ceiling)."""


def group_name(group: object) -> bytes:
    """The wire form of a group's name; ``ValueError``/``TypeError`` naming ``group``."""
    if not isinstance(group, str):
        raise TypeError(f"group must be a str, not {type(group).__name__}")
    name = group.encode("utf-8", "surrogateescape")
    if not _GROUP.fullmatch(name):
        raise ValueError(f"group must be 1 to {GROUP_MAX} bytes of letters, digits and -_.:@, got {group!r}")
    return name


@dataclass(frozen=True)
class GroupInfo:
    """One group as the server saw it.

    ``waiting``: its due jobs in its lane (a delayed job counts once due);
    ``active``: its jobs running now; ``max_active``: its cap (None: none);
    ``paused``: its waiting jobs are held back (its active ones run on).
    """

    name: str
    waiting: int
    active: int
    max_active: int | None
    paused: bool


@dataclass(frozen=True)
class GroupDefault:
    """The queue's default group cap (``set_group_limit(queue, None, ...)``): ``max_active`` caps
    every group without its own (None: none); ``groups``: the groups the queue holds now."""

    max_active: int | None
    groups: int


def _group_default(call: Call[GroupDefault], reply: Any) -> GroupDefault:
    cap, groups = reply
    return GroupDefault(None if cap is None else int(cap), int(groups))


def set_group_default(queue: str, max_active: int | None) -> Call[GroupDefault]:
    """Cap every group without its own cap at ``max_active`` (None: no default): EMQ.GROUPLIMIT
    with ``*`` for the group."""
    keys = keys_of(queue)
    options: tuple[Any, ...] = ("NOMAX",) if max_active is None else ("MAX", _cap(max_active))
    return Call(("EMQ.GROUPLIMIT", keys.pending, keys.base, "*", *options), _group_default, queue)


def _cap(max_active: object) -> int:
    if isinstance(max_active, bool) or not isinstance(max_active, int):
        raise TypeError(f"max_active must be an int or None, not {type(max_active).__name__}")
    if not 1 <= max_active <= GROUP_CAP_MAX:
        raise ValueError(f"max_active must be from 1 to {GROUP_CAP_MAX} (None: no cap), got {max_active}")
    return max_active


def _group_info(call: Call[GroupInfo], reply: Any) -> GroupInfo:
    cap, active, waiting, paused = reply
    max_active = None if cap is None else int(cap)
    return GroupInfo(text(call.wire_id), int(waiting), int(active), max_active, paused == 1)


def _group_call(queue: str, group: str, *options: Any) -> Call[GroupInfo]:
    keys, name = keys_of(queue), group_name(group)
    return Call(("EMQ.GROUPLIMIT", keys.pending, keys.base, name, *options), _group_info, queue, name)


def group_limit(queue: str, group: str) -> Call[GroupInfo]:
    """Read one group's cap, counts and pause."""
    return _group_call(queue, group)


def set_group_limit(queue: str, group: str, max_active: int | None) -> Call[GroupInfo]:
    """Cap the group at ``max_active`` jobs active at once, or remove its cap (None)."""
    if max_active is None:
        return _group_call(queue, group, "NOMAX")
    if isinstance(max_active, bool) or not isinstance(max_active, int):
        raise TypeError(f"max_active must be an int or None, not {type(max_active).__name__}")
    if not 1 <= max_active <= GROUP_CAP_MAX:
        raise ValueError(f"max_active must be from 1 to {GROUP_CAP_MAX} (None: no cap), got {max_active}")
    return _group_call(queue, group, "MAX", max_active)


def pause_group(queue: str, group: str) -> Call[GroupInfo]:
    """Hold the group's waiting jobs back; its active ones run on."""
    return _group_call(queue, group, "PAUSE")


def resume_group(queue: str, group: str) -> Call[GroupInfo]:
    """Let the group's waiting jobs be claimed again."""
    return _group_call(queue, group, "RESUME")


def group_rows(queue: str, known: Sequence[bytes]) -> Read[list[GroupInfo] | tuple[bytes, ...]]:
    """Every group of one snapshot, by name, or, when the snapshot holds a group ``known`` does
    not name, the names to read again with (``client.groups``).

    One MULTI reads the index and the ring (the names) and the hash and the lane of every group
    ``known`` names; the rows are those of the snapshot's names, so a group that came or went
    between two reads is never shown half (issue 45)."""
    base = keys_of(queue).base.encode()

    def build(now: int) -> list[tuple[Any, ...]]:
        out = group_names_commands(queue)
        for g in known:
            out += [("HMGET", base + b"group:" + g, "active", "max", "paused"), ("ZCARD", base + b"g:" + g)]
        return out

    def parse(now: int, replies: list[Any]) -> list[GroupInfo] | tuple[bytes, ...]:
        names = group_names(replies[:4])
        if not set(names) <= set(known):
            return tuple(sorted(set(known) | set(names)))
        rows = dict(zip(known, zip(replies[4::2], replies[5::2], strict=True), strict=True))
        found = []
        for g in names:
            (active, cap, paused), waiting = rows[g]
            found.append(
                GroupInfo(
                    text(g),
                    int(waiting),
                    _whole(active, 0),
                    None if cap is None else _whole(cap, 0) or None,
                    paused is not None,
                )
            )
        return found

    return Read(keys_of(queue).pending, build, parse)


def _whole(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
