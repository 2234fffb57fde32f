"""What every command shares: connecting, one-line errors, tables, argument types, signals."""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import redis

from .._log import LEVELS
from .._protocol import SweepResult
from .._protocol.views import joined, piece_fields
from .._sync._reach import wait_for_server
from .._sync.client import Client
from ..errors import ModuleNotLoaded
from ..keyspace import queue_keys
from ..tasks.describe import call_text

DEFAULT_URL = "redis://localhost:6379/0"
MODULE_MISSING = (
    "the server does not know EMQ.*: start it with --loadmodule /path/to/emq.so (see echomq module-path)"
)
log = logging.getLogger("echomq.cli")

Command = Callable[[str, str, Callable[[argparse.Namespace], int]], argparse.ArgumentParser]
"""``command(name, help, func)``: a new subcommand's parser (each module's ``register`` gets one)."""


class CliError(Exception):
    """A failure to report in one line, with exit status 1."""


def connect(args: argparse.Namespace) -> Client:
    return Client.from_url(args.url, cluster=args.cluster, backend=args.backend)


def connect_waiting(args: argparse.Namespace) -> Client:
    """``connect``, then ``--wait-for-server``'s wait (a cluster client connects as it is made: again)."""
    deadline = time.monotonic() + args.wait_for_server
    while True:
        try:
            client = connect(args)
            break
        except redis.ConnectionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
    wait_for_server(client.redis, max(0.0, deadline - time.monotonic()), args.url)
    return client


def require_module(client: Client) -> None:
    """Refuse a server without the emq module when the module is what runs the verbs.

    With the scripts backend (chosen by "auto" on a server without the
    module, or asked for) the verbs run as Lua and nothing is missing.  With
    the module backend on a server without it, reading commands alone would
    show an empty queue: refuse, in one line.
    """
    if client.backend != "module":
        return
    # "COMMAND INFO" as one name: redis-py splits it on the wire, and skips
    # the COMMAND reply parser, which fails on an unknown command's null.
    # A cluster client is told which node to ask (the command has no key).
    r: Any = client.redis
    options = {"target_nodes": r.get_random_node()} if hasattr(r, "get_random_node") else {}
    info = r.execute_command("COMMAND INFO", "EMQ.SWEEP", **options)
    if isinstance(info, dict):  # a cluster client answers per node
        info = next(iter(info.values()), None)
    if not info or info[0] is None:
        raise ModuleNotLoaded(MODULE_MISSING)


def table(rows: list[list[str]], out: Any) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def format_sweep(result: SweepResult) -> str:
    """What a sweep did, on one line: the same for ``sweep``, each ``reap`` tick and its total."""

    def part(name: str, ids: list[str]) -> str:
        return f"{name} {len(ids)}" + (f" ({' '.join(ids)})" if ids else "")

    return "  ".join(
        [
            part("recovered", result.recovered),
            part("dead", result.dead),
            part("cancelled", result.cancelled),
            f"expired {result.expired}",
        ]
    )


# -- times: local time and age, never raw epoch ms ------------------------------------


def duration(ms: int) -> str:
    """A span as people read it: ``250 ms``, ``3.2 s``, ``5m 03s``, ``2h 05m``, ``3d 4h``."""
    ms = abs(ms)
    if ms < 1000:
        return f"{ms} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    whole = int(s)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def ago(now: int, at: int | None) -> str:
    """``at`` (server ms) from ``now``: ``3.2 s ago`` or ``in 5m 03s``."""
    if at is None:
        return ""
    return f"{duration(now - at)} ago" if now >= at else f"in {duration(at - now)}"


def local_time(ms: int) -> str:
    """Server ms as this machine's local time, with its offset: ``2026-12-01 12:31:20 +0100``."""
    return datetime.fromtimestamp(ms / 1000).astimezone().strftime("%Y-%m-%d %H:%M:%S %z")


def when(now: int, at: int | None) -> str:
    """``at`` as local time and age: ``2026-12-01 12:31:20 +0100  (3.2 s ago)``; empty for None."""
    return "" if at is None else f"{local_time(at)}  ({ago(now, at)})"


def stop_on_sigterm() -> Callable[[], bool]:
    """SIGTERM stops a foreground command as Ctrl-C does; returns "has it come?"."""
    came: list[int] = []
    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    return lambda: bool(came)


def log_to_stderr() -> None:
    # Until the CLI's one logging setup lands (issue 19's point 3), the long-running
    # commands print echomq's INFO lines; a setup made by the caller wins.
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# -- argument types: a usage error that says which argument and why ---------------


def positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return number


def seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {value!r}")
    return number


def port(value: str) -> int:
    number = positive(value)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"expected a port (1-65535), got {value!r}")
    return number


def global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--url, --cluster, --backend, --log-level, --log-format: on the main parser (with the defaults) and on
    every command (without, so a value given after the command wins and none given leaves the main's)."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--url",
        default=default(os.environ.get("ECHOMQ_URL", DEFAULT_URL)),
        help=f"server URL (default: $ECHOMQ_URL or {DEFAULT_URL})",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        default=default(os.environ.get("ECHOMQ_CLUSTER", "") not in ("", "0")),
        help="the URL is a Redis Cluster node (default: $ECHOMQ_CLUSTER)",
    )
    parser.add_argument(
        "--backend",
        choices=["auto", "module", "scripts"],
        default=default(os.environ.get("ECHOMQ_BACKEND", "auto")),
        help="module (EMQ.* commands), scripts (Lua, any Redis 7 / Valkey 8) or auto (default: "
        "$ECHOMQ_BACKEND or auto: the module when the server has it)",
    )
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LEVELS,
        default=default(None),
        help="debug, info, warning or error (default: $ECHOMQ_LOG_LEVEL or info); debug shows tracebacks",
    )
    parser.add_argument(
        "--log-format",
        type=str.lower,
        choices=("text", "json"),
        default=default(None),
        help="text or json log lines (default: $ECHOMQ_LOG_FORMAT or text)",
    )


def task_calls(client: Any, queue: str, job_ids: list[str]) -> dict[str, str]:
    """Each listed job's task call on one short line (``add(2, 3)``), in one round trip; raw jobs: "-"."""
    if not job_ids:
        return {}
    keys, fields = queue_keys(queue), piece_fields("payload")
    pipe = client.redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(keys.job(job_id), fields)  # a payload of 65 B to 1 KiB is in pieces
    payloads = [joined(values) for values in pipe.execute()]
    return {job_id: call_text(p, 40) or "-" for job_id, p in zip(job_ids, payloads, strict=True)}


def load_handler(spec: str) -> Callable[..., object]:
    """``package.module:function`` (or ``module:object.method``) → the callable; CliError saying why not."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CliError(f"handler must be MODULE:FUNCTION, e.g. tasks:send, not {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the project's own modules import
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise CliError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"{module_name!r} has no {attr!r}") from None
    from ..tasks import AppCore

    if not callable(target) and not isinstance(target, AppCore):
        raise CliError(f"{spec} is not callable (it is a {type(target).__name__})")
    return cast("Callable[..., object]", target)
