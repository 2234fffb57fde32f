"""Arguments, checked where the public classes are made: TypeError or ValueError naming the bad one."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

# -- arguments -------------------------------------------------------------------


def check_int(name: str, value: object, minimum: int = 1, maximum: int = 2**63 - 1) -> int:
    """``value`` if it is an int in [minimum, maximum], else TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def check_seconds(name: str, value: object, *, zero_ok: bool = False) -> float:
    """A duration in seconds: a finite int or float, > 0 (>= 0 with ``zero_ok``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name} must be {'>= 0' if zero_ok else '> 0'} seconds, got {value}")
    return float(value)


def check_callable(name: str, value: object) -> None:
    if not callable(value):
        raise TypeError(f"{name} must be callable, not {type(value).__name__}")


def check_client(name: str, client: object, expected: type | None) -> None:
    """The driver's own client class: a sync worker cannot drive an asyncio client, nor the reverse."""
    if expected is None or isinstance(client, expected):
        return
    package = "echomq.asyncio" if expected.__module__.startswith("echomq.asyncio") else "echomq"
    other = "echomq.Client" if package == "echomq.asyncio" else "echomq.asyncio.Client"
    hint = f" ({other} goes with the other package's classes)" if type(client).__name__ == "Client" else ""
    raise TypeError(f"{name} must be an {package}.{expected.__name__}, not {type(client).__name__}{hint}")


def takes_context(handler: Callable[..., object]) -> bool:
    """True for ``handler(ctx)``, False for the older ``handler(job, cancel)`` (told apart by signature)."""
    try:
        parameters = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): the current style
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.kind in positional and p.default is inspect.Parameter.empty]
    if len(required) == 2:
        return False
    if len(required) > 2:
        raise TypeError(
            f"handler must take one argument (the JobContext) or two (job, cancel), "
            f"not {len(required)}: {handler!r}"
        )
    return True
