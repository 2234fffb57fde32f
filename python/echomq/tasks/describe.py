"""A task job described in one short line for people: ``add(2, 3)``, for the CLI and the dashboard.

Read from the payload's header (``envelope.parse_call``) and, for the JSON
serializer, its arguments shortened; nothing is imported or run, and a
payload that is not a task call describes as None (a raw job).
"""

from __future__ import annotations

import json
from typing import Any

from .envelope import BadTaskPayload, parse_call

__all__ = ["call_text", "task_of"]

WIDTH = 60


def task_of(payload: bytes | None) -> str | None:
    """The task name a payload calls, or None for a raw job (or no payload)."""
    if payload is None:
        return None
    try:
        return parse_call(payload).name
    except BadTaskPayload:
        return None


def call_text(payload: bytes | None, width: int = WIDTH, *, arguments: bool = True) -> str | None:
    """``name(arg, key=value)`` shortened to ``width`` characters; ``name(...)`` without ``arguments``.

    Arguments are shown for JSON calls only (another serializer's bytes are
    not decoded here: ``name(<msgpack, 12 bytes>)``).  None for a raw job.
    """
    if payload is None:
        return None
    try:
        call = parse_call(payload)
    except BadTaskPayload:
        return None
    if not arguments:
        return f"{call.name}(...)"
    if call.serializer != "json":
        return f"{call.name}(<{call.serializer}, {len(call.body)} bytes>)"
    try:
        args, kwargs = json.loads(call.body)
        parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in dict(kwargs).items()]
    except (ValueError, TypeError):
        return f"{call.name}(<unreadable arguments>)"
    text = f"{call.name}({', '.join(parts)})"
    return text if len(text) <= width else text[: max(width - 4, len(call.name) + 1)] + "...)"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if len(text) <= 24:
        return text
    return text[:21] + ('..."' if isinstance(value, str) else "...")  # a string keeps its closing quote
