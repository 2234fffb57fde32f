"""How a task's arguments and result become bytes: JSON by default, pickle if you opt in.

A serializer has a ``name`` (it travels with every job and result, so a
reader knows how to read it), ``dumps`` and ``loads``.  ``JSON`` is the
default: what it cannot carry is refused before anything is sent, with an
error naming the value and where it was (``SerializationError``).  JSON
turns tuples into lists and a dict's keys into strings: a task receives
what JSON gives back.

``MSGPACK`` (``pip install 'echomq[msgpack]'``) carries what JSON does and
bytes, more compactly, and is as safe to read.

``PICKLE`` carries any picklable Python value, and runs code when it reads
one: whoever can write to the queue's keys can run code in your workers.
Use it only when every writer is trusted; a reader decodes a pickled
result only when it was given ``PICKLE`` itself (``App(...,
serializer=PICKLE)``, ``client.result(..., serializer=PICKLE)``).
"""

from __future__ import annotations

# In the order the reference page lists them (mkdocstrings: the source's), not sorted.
from .._serializers import (  # isort: skip
    SerializationError,
    Serializer,
    JsonSerializer,
    PickleSerializer,
    MsgpackSerializer,
    JSON,
    PICKLE,
    MSGPACK,
)

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
