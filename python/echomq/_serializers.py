"""How a task's arguments and result become bytes: the serializers, without I/O.

Documented, and imported by users, as ``echomq.tasks.serializers``, which
re-exports every name here; they live below the drivers because a client
reads a stored result too (``client.result``).  What each one carries, and
why ``PICKLE`` is unsafe: that module's docstring.
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Protocol

__all__ = [
    "JSON",
    "MSGPACK",
    "PICKLE",
    "JsonSerializer",
    "MsgpackSerializer",
    "PickleSerializer",
    "SerializationError",
    "Serializer",
]


class SerializationError(TypeError):
    """A value the serializer cannot carry (the message names it and where it was); nothing was sent."""


class Serializer(Protocol):
    """Turns a task's arguments and result into bytes and back."""

    @property
    def name(self) -> str:
        """A short name without spaces, stored with each job and result (``json``, ``pickle``)."""
        ...

    def dumps(self, value: Any, where: str) -> bytes:
        """``value`` as bytes; ``SerializationError`` naming ``where`` (e.g. "argument 1") if it cannot."""
        ...

    def loads(self, data: bytes) -> Any:
        """The value ``data`` holds."""
        ...


def _refuse(value: object) -> Any:
    raise TypeError(f"JSON cannot carry a {type(value).__module__}.{type(value).__qualname__}: {value!r:.80}")


# What json.dumps(value, separators=..., ...) builds on each call: one, shared (it keeps no state
# between calls, as json's own default encoder does not).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_refuse)


class JsonSerializer:
    """JSON (compact, UTF-8, no NaN): str, int, float, bool, None, lists, tuples, dicts with str keys."""

    name = "json"

    def dumps(self, value: Any, where: str) -> bytes:
        try:
            return _ENCODER.encode(value).encode("utf-8")
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError (a lone surrogate) is a ValueError
            raise SerializationError(
                f"{where}: {exc} (convert it to str, a number, a list or a dict first, or give the app "
                "another serializer)"
            ) from None

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


class PickleSerializer:
    """Pickle: any picklable value.  UNSAFE: reading a pickle runs code; trust every writer of the queue."""

    name = "pickle"

    def dumps(self, value: Any, where: str) -> bytes:
        try:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SerializationError(f"{where}: pickle cannot carry it: {exc}") from None

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class MsgpackSerializer:
    """MessagePack (``pip install echomq[msgpack]``): JSON's values, and bytes, more compactly; safe to read.

    Tuples come back as lists; what it cannot carry is refused by name as with JSON.
    """

    name = "msgpack"

    def dumps(self, value: Any, where: str) -> bytes:
        packb = _msgpack().packb
        try:
            return bytes(packb(value, use_bin_type=True))
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(f"{where}: msgpack cannot carry it: {exc}") from None

    def loads(self, data: bytes) -> Any:
        return _msgpack().unpackb(data, raw=False, strict_map_key=False)


def _msgpack() -> Any:
    try:
        import msgpack  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise ImportError("the msgpack serializer needs msgpack: pip install 'echomq[msgpack]'") from None
    return msgpack


JSON = JsonSerializer()
PICKLE = PickleSerializer()
MSGPACK = MsgpackSerializer()
