"""echomq: the operator's command line.

    echomq inspect mail                 counts, failed metric, active jobs and their leases
    echomq sweep mail --max-stalled 3   one sweep, now
    echomq reap mail --interval 1       the reaper, until Ctrl-C
    echomq cancel mail job-42 --reason "customer withdrew"
    echomq enqueue mail '{"to": "ada"}'
    echomq worker tasks:send --queue mail --concurrency 4
                                        a worker running tasks.send (async def: asyncio)
    echomq server                       a local redis-server with the module loaded
    echomq module-path                  the emq.so for --loadmodule
    echomq demo                         the lifecycle demo on a server of its own

The server is --url (or $ECHOMQ_URL, default redis://localhost:6379/0);
--cluster (or ECHOMQ_CLUSTER=1) connects to Redis Cluster through that
URL's node.  Global options go before or after the command.  Logging:
--log-level (or $ECHOMQ_LOG_LEVEL) and --log-format text|json (or
$ECHOMQ_LOG_FORMAT).  Errors are one line on stderr (a traceback only with
--log-level debug); exit status 1, or 2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis

from . import __version__
from ._log import LEVELS, configure_logging
from ._protocol import SweepResult, server_ms, text, wire
from .client import Client
from .errors import EchoMQError, JobGone, ModuleNotLoaded
from .keyspace import queue_keys

DEFAULT_URL = "redis://localhost:6379/0"
MODULE_MISSING = (
    "the server does not know EMQ.*: start it with --loadmodule /path/to/emq.so (see echomq module-path)"
)
log = logging.getLogger("echomq.cli")


class CliError(Exception):
    """A failure to report in one line, with exit status 1."""


def _connect(args: argparse.Namespace) -> Client:
    return Client.from_url(args.url, cluster=args.cluster)


def _require_module(client: Client) -> None:
    """Refuse a server without the emq module (reading commands alone would show an empty queue)."""
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


def _table(rows: list[list[str]], out: Any) -> None:
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


# -- commands: one small function each -----------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    client = _connect(args)
    _require_module(client)
    r, keys = client.redis, queue_keys(args.queue)
    now = server_ms(r.time())
    pending, active, dead = r.zcard(keys.pending), r.zcard(keys.active), r.zcard(keys.dead)
    failed = r.hget(keys.metrics_failed, "count")
    out = sys.stdout
    out.write(f"queue {args.queue}  (server time {now} ms)\n")
    out.write(f"  pending {pending}   active {active}   dead {dead}   failed {text(failed or b'0')}\n")
    leases = cast("list[tuple[bytes, float]]", r.zrange(keys.active, 0, args.limit - 1, withscores=True))
    if not leases:
        return 0
    out.write("\n")
    rows = [["job", "token", "lease left", "stalled", "cancel requested"]]
    for member, deadline in leases:
        row = r.hmget(keys.job(wire(member)), ["token", "stalled", "cancel_requested"])
        left = int(deadline) - now
        lapse = f"{left} ms" if left > 0 else f"lapsed {-left} ms ago"
        token, stalled, cancel = (text(v or b"") for v in row)
        rows.append([text(member), token, lapse, stalled or "0", cancel])
    _table(rows, out)
    if active > len(leases):
        out.write(f"  ... and {active - len(leases)} more (--limit)\n")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    result = _connect(args).sweep(args.queue, max_stalled=args.max_stalled, limit=args.limit)
    print(format_sweep(result))
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    from .reaper import Reaper

    def report(result: SweepResult) -> None:
        print(f"{time.strftime('%H:%M:%S')} {format_sweep(result)}", flush=True)

    client = _connect(args)
    _require_module(client)
    totals: list[SweepResult] = []

    def on_sweep(result: SweepResult) -> None:
        totals.append(result)
        report(result)

    reaper = Reaper(
        client,
        args.queue,
        interval=args.interval,
        max_stalled=args.max_stalled,
        limit=args.limit,
        on_sweep=on_sweep,
    )
    print(f"reaping {args.queue} every {args.interval} s (Ctrl-C or SIGTERM stops)", flush=True)
    stopping = _stop_on_sigterm()
    reaper.start()
    try:
        deadline = math.inf if args.duration is None else time.monotonic() + args.duration
        while time.monotonic() < deadline and not stopping():
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        reaper.stop()
    total = SweepResult(
        [i for t in totals for i in t.recovered],
        [i for t in totals for i in t.dead],
        [i for t in totals for i in t.cancelled],
        sum(t.expired for t in totals),
    )
    print(f"total {format_sweep(total)}  errors {reaper.errors}")
    return 0 if reaper.errors == 0 else 1


def cmd_cancel(args: argparse.Namespace) -> int:
    try:
        outcome = _connect(args).cancel(args.queue, args.job_id, args.reason)
    except JobGone as exc:
        raise CliError(f"no job {args.job_id!r} in queue {args.queue!r}") from exc
    explain = {
        "cancelled": "it was waiting: it will not run",
        "requested": "it is running: its handler hears of it at the next checkpoint",
        "finished": "it had already finished: nothing to do",
    }
    print(f"{outcome}: {explain[outcome]}")
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    print(_connect(args).enqueue(args.queue, args.payload, job_id=args.id))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    handler = _load_handler(args.handler)
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (a callable object's own method)
    )
    settings: dict[str, Any] = {
        "lease_ms": args.lease_ms,
        "max_attempts": args.max_attempts,
        "concurrency": args.concurrency,
        "poll_interval": args.poll_interval,
        "grace": args.grace,
    }
    kind = "asyncio" if is_async else "threads"
    log.info(
        "worker of %r: %s (%s), concurrency %d, lease %d ms, grace %.1f s; SIGINT/SIGTERM stop it",
        args.queue, args.handler, kind, args.concurrency, args.lease_ms, args.grace,
    )  # fmt: skip
    if is_async:
        stats = asyncio.run(_run_async_worker(args, handler, settings))
    else:
        from .worker import Worker

        client = _connect(args)
        _require_module(client)
        worker = Worker(client, args.queue, handler, **settings)
        try:
            worker.run()
        finally:
            stats = worker.stats
            client.close()
    log.info("worker of %r stopped: %s", args.queue, stats)
    return 0


async def _run_async_worker(args: argparse.Namespace, handler: Any, settings: dict[str, Any]) -> Any:
    from . import asyncio as emq

    client = emq.Client.from_url(args.url, cluster=args.cluster)
    try:
        r: Any = client.redis
        options = {"target_nodes": r.get_random_node()} if hasattr(r, "get_random_node") else {}
        info = await r.execute_command("COMMAND INFO", "EMQ.SWEEP", **options)
        if isinstance(info, dict):
            info = next(iter(info.values()), None)
        if not info or info[0] is None:
            raise ModuleNotLoaded(MODULE_MISSING)
        worker = emq.Worker(client, args.queue, handler, **settings)
        try:
            await worker.run()
        finally:
            stats = worker.stats
    finally:
        await client.aclose()
    return stats


def _load_handler(spec: str) -> Callable[..., object]:
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
    if not callable(target):
        raise CliError(f"{spec} is not callable (it is a {type(target).__name__})")
    return cast("Callable[..., object]", target)


def cmd_server(args: argparse.Namespace) -> int:
    from .testing import EmbeddedServer

    stopping = _stop_on_sigterm()
    server = EmbeddedServer(args.server_args, port=args.port)
    try:
        server.start()
    except (RuntimeError, FileNotFoundError) as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    try:
        print(f"redis-server {server.url}  --loadmodule {server.module}", flush=True)
        print("Ctrl-C or SIGTERM stops it", flush=True)
        assert server.process is not None
        while server.process.poll() is None and not stopping():
            time.sleep(0.1)
        if stopping():
            return 0
        raise CliError(f"the server exited: {server.log_tail(1)}")
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def cmd_module_path(args: argparse.Namespace) -> int:
    from ._module_so import module_path

    try:
        print(module_path())
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from exc
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run

    run()
    return 0


def _stop_on_sigterm() -> Callable[[], bool]:
    """SIGTERM stops a foreground command as Ctrl-C does; returns "has it come?"."""
    came: list[int] = []
    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    return lambda: bool(came)


# -- the parser: one block per command -------------------------------------------


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return number


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {value!r}")
    return number


def _port(value: str) -> int:
    number = _positive(value)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"expected a port (1-65535), got {value!r}")
    return number


def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--url, --cluster, --log-level, --log-format: on the main parser (with the defaults) and on
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="echomq", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"echomq {__version__}")
    _global_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, defaults=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, helptext: str, func: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=helptext, parents=[common])
        p.set_defaults(func=func)
        return p

    p = command("inspect", "counts, failed metric and the active jobs' leases", cmd_inspect)
    p.add_argument("queue")
    p.add_argument("--limit", type=_positive, default=20, help="active jobs to list (default 20)")

    for name, helptext, func in (
        ("sweep", "sweep once", cmd_sweep),
        ("reap", "run the reaper until Ctrl-C", cmd_reap),
    ):
        p = command(name, helptext, func)
        p.add_argument("queue")
        p.add_argument("--max-stalled", type=_positive, default=1, help="stalls before dead (default 1)")
        p.add_argument("--limit", type=_positive, default=100, help="jobs per sweep (default 100)")
        if name == "reap":
            p.add_argument("--interval", type=_seconds, default=1.0, help="seconds between sweeps")
            p.add_argument("--duration", type=_seconds, default=None, help="stop after this many seconds")

    p = command("cancel", "request a cooperative cancel of a job", cmd_cancel)
    p.add_argument("queue")
    p.add_argument("job_id")
    p.add_argument("--reason", default=None, help="delivered to the handler's CancelToken")

    p = command("enqueue", "add a job; prints its id", cmd_enqueue)
    p.add_argument("queue")
    p.add_argument("payload")
    p.add_argument("--id", default=None, help="the job id (default: a new one)")

    p = command("worker", "run a worker: MODULE:HANDLER for the jobs of --queue", cmd_worker)
    p.add_argument("handler", metavar="MODULE:HANDLER", help="e.g. tasks:send (an async def runs on asyncio)")
    p.add_argument("--queue", "-q", required=True)
    p.add_argument("--concurrency", "-c", type=_positive, default=1, help="jobs at a time (default 1)")
    p.add_argument("--lease-ms", type=_positive, default=30_000, help="each job's lease (default 30000)")
    p.add_argument("--max-attempts", type=_positive, default=3, help="claims before dead (default 3)")
    p.add_argument(
        "--grace",
        type=_seconds,
        default=10.0,
        help="seconds handlers get to finish on SIGINT/SIGTERM (default 10)",
    )
    p.add_argument(
        "--poll-interval", type=_seconds, default=0.2, help="idle wait between claims (default 0.2)"
    )

    p = command("server", "start a local redis-server with the module loaded", cmd_server)
    p.add_argument("--port", type=_port, default=None, help="port (default: a free one)")
    p.add_argument("server_args", nargs="*", help="extra redis-server options, after --")

    command("module-path", "print the emq.so path for --loadmodule", cmd_module_path)
    command("demo", "run the lifecycle demo on a server of its own", cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``echomq`` command: exit status 0, 1 on an error (one line), 2 on bad usage,
    128 + the signal when a second SIGINT/SIGTERM stopped a worker at once."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configure_logging(args.log_level, args.log_format)
    except ValueError as exc:  # $ECHOMQ_LOG_LEVEL / $ECHOMQ_LOG_FORMAT
        parser.error(str(exc))
    debug = logging.getLogger().isEnabledFor(logging.DEBUG)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:  # a second Ctrl-C stopped a worker at once
        return 128 + signal.SIGINT
    except SystemExit as exc:  # a second SIGTERM did (the worker raises SystemExit(128 + signal))
        return exc.code if isinstance(exc.code, int) else 1
    except redis.exceptions.ConnectionError as exc:
        _error(f"cannot connect to {args.url}: {exc}", debug)
    except Exception as exc:  # one line, whatever it is: ModuleNotLoaded, JobExists, ValueError, ...
        known = isinstance(exc, (CliError, EchoMQError))
        _error(str(exc) if known else f"{type(exc).__name__}: {exc}", debug)
    return 1


def _error(message: str, debug: bool) -> None:
    if debug:
        log.exception("%s", message)
    first = message.splitlines()[0] if message else "error"
    print(f"echomq: {first}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
