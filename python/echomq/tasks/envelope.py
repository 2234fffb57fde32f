"""A task job's payload and a task's stored result, as bytes (sans I/O).

A task job is an ordinary job whose payload starts with one header line::

    task send_mail json\n["ada@example.com"],{"subject":"hi"}]

``task``, the task's name, the serializer's name, then any headers (words
``key=value``, the value percent-encoded: ``traceparent=00-...-01``, what
``echomq.contrib.otel`` carries), a newline, then the serializer's bytes of
``[args, kwargs]``.  Headers travel in the payload, so a retry or a
recovery of the job carries them as it carries the arguments.  The name travels in the payload
(no field of its own on the row): a worker reads the header without
decoding the arguments, and ``echomq job --payload`` shows what was called.

A result is ``<serializer>\n<bytes>`` (``json\n42``): whoever reads it knows
how, and refuses a pickle unless it was given the pickle serializer.  A
client reads results too: ``encode_result``, ``decode_result`` and
``BadTaskPayload`` live in ``echomq._results``, re-exported here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from .._results import BadTaskPayload, decode_result, encode_result
from .serializers import Serializer

__all__ = [
    "MAX_HEADERS",
    "MAX_HEADER_CHARS",
    "MAX_NAME_CHARS",
    "BadTaskPayload",
    "TaskCall",
    "check_name",
    "decode_result",
    "encode_call",
    "encode_result",
    "parse_call",
]

MARK = b"task "
MAX_NAME_CHARS = 200
_NAME = re.compile(r"[^\s]+")
# A header's key is a lowercase word; its value is percent-encoded (no space, no newline).
MAX_HEADERS = 16
MAX_HEADER_CHARS = 1024  # a key, or an encoded value (a W3C tracestate is at most 512 characters)
_KEY = re.compile(r"[a-z][a-z0-9_.-]*")


def check_name(name: object) -> str:
    """A task's name: a str of 1 to 200 characters without whitespace (it is one word of the header)."""
    if not isinstance(name, str):
        raise TypeError(f"a task name must be a str, not {type(name).__name__}")
    if not name or len(name) > MAX_NAME_CHARS or not _NAME.fullmatch(name) or not name.isprintable():
        raise ValueError(
            f"a task name is 1 to {MAX_NAME_CHARS} printable characters without whitespace, got {name!r}"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"a task name must be valid UTF-8 text, got {name!r}") from None
    return name


def encode_headers(headers: Mapping[str, str]) -> bytes:
    """The header words (`` key=value`` each); ValueError for a bad key, a value too long, too many."""
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"a task job carries at most {MAX_HEADERS} headers, not {len(headers)}")
    words = []
    for key, value in headers.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key) or len(key) > MAX_HEADER_CHARS:
            raise ValueError(f"a header key is a lowercase word (a-z, 0-9, _ . -), got {key!r}")
        if not isinstance(value, str):
            raise TypeError(f"header {key!r}: its value must be a str, not {type(value).__name__}")
        encoded = quote(value, safe="")
        if len(encoded) > MAX_HEADER_CHARS:
            raise ValueError(f"header {key!r}: its value is over {MAX_HEADER_CHARS} characters encoded")
        words.append(f" {key}={encoded}")
    return "".join(words).encode("ascii")


def encode_call(
    name: str,
    serializer: Serializer,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """The payload of a call of task ``name`` (``SerializationError`` naming the argument it cannot carry).

    ``headers`` (see ``encode_headers``) ride in the header line.
    """
    extra = encode_headers(headers) if headers else b""
    try:
        body = serializer.dumps([list(args), dict(kwargs)], "the arguments")
    except TypeError:
        for i, arg in enumerate(args):  # which one: the error names it
            serializer.dumps(arg, f"task {name!r}, argument {i + 1}")
        for key, arg in kwargs.items():
            serializer.dumps(arg, f"task {name!r}, argument {key}=")
        raise
    return b"%s%s %s%s\n%s" % (MARK, name.encode(), serializer.name.encode(), extra, body)


@dataclass(frozen=True, slots=True)
class TaskCall:
    """A task job's header, read without decoding its arguments (``headers``: its ``key=value`` words)."""

    name: str
    serializer: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    def arguments(self, serializers: Mapping[str, Serializer]) -> tuple[list[Any], dict[str, Any]]:
        """The call's ``(args, kwargs)`` (``BadTaskPayload`` when this reader cannot decode them)."""
        serializer = serializers.get(self.serializer)
        if serializer is None:
            raise BadTaskPayload(
                f"task {self.name!r} was enqueued with the {self.serializer!r} serializer, which this worker "
                f"does not accept (it accepts {', '.join(sorted(serializers))})"
            )
        try:
            decoded = serializer.loads(self.body)
            args, kwargs = decoded
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise TypeError("not [args, kwargs]")
        except Exception as exc:
            raise BadTaskPayload(f"task {self.name!r}: its arguments cannot be read: {exc}") from None
        return args, kwargs


def parse_call(payload: bytes) -> TaskCall:
    """The header of a task job's payload; ``BadTaskPayload`` for a payload that is not one."""
    head, newline, body = payload.partition(b"\n")
    if not head.startswith(MARK) or not newline:
        raise BadTaskPayload(
            f"not a task job (its payload does not start with 'task NAME SERIALIZER'): {payload[:60]!r}"
        )
    words = head[len(MARK) :].split(b" ")
    if len(words) < 2 or len(words) > 2 + MAX_HEADERS:
        raise BadTaskPayload(f"not a task job (a bad header): {head[:80]!r}")
    headers: dict[str, str] = {}
    for word in words[2:]:
        key, equals, value = word.partition(b"=")
        text = key.decode("ascii", "replace")
        if not equals or not _KEY.fullmatch(text) or len(key) > MAX_HEADER_CHARS or text in headers:
            raise BadTaskPayload(f"not a task job (a bad header word {word[:40]!r}): {head[:80]!r}")
        headers[text] = unquote(value.decode("ascii", "replace"))
    return TaskCall(words[0].decode("utf-8", "replace"), words[1].decode("ascii", "replace"), body, headers)


def task_name(payload: bytes) -> str | None:
    """The task name of a payload, or None when it is not a task job (cheap: the header only)."""
    try:
        return parse_call(payload).name
    except BadTaskPayload:
        return None
