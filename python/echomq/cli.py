"""echomq: the operator's command line.

    echomq inspect mail                 counts, failed metric, active jobs and their leases
    echomq sweep mail --max-stalled 3   one sweep, now
    echomq reap mail --interval 1       the reaper, until Ctrl-C
    echomq cancel mail job-42 --reason "customer withdrew"
    echomq enqueue mail '{"to": "ada"}'
    echomq job mail job-42              one job's status
    echomq dead mail --limit 20         the dead jobs, oldest first, with their errors
    echomq retry mail job-42            back to pending with a fresh budget (--all: every dead job)
    echomq purge mail --dead            delete the dead jobs
    echomq pause mail / resume mail     stop / restart handing out jobs
    echomq retention mail --done 60000  how long finished rows are kept (ms; -1 forever)
    echomq obliterate mail              delete the queue and all its jobs (asks first)
    echomq worker tasks:send --queue mail --concurrency 4
                                        a worker running tasks.send (async def: asyncio)
    echomq exporter --port 9640         Prometheus metrics of every queue (or the queues named)
    echomq dashboard                    the web dashboard on http://127.0.0.1:8640/
    echomq server                       a local redis-server with the module loaded
    echomq module-path                  the emq.so for --loadmodule
    echomq demo                         the lifecycle demo on a server of its own

The server is --url (or $ECHOMQ_URL, default redis://localhost:6379/0);
--cluster (or ECHOMQ_CLUSTER=1) connects to Redis Cluster through that
URL's node.  --backend (or $ECHOMQ_BACKEND) is auto (the default: the
module when the server has it, else the scripts), module or scripts;
`echomq inspect` says which one is in use.
Global options go before or after the command.  Logging:
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
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis

from . import __version__
from ._log import LEVELS, configure_logging
from ._protocol import SweepResult, text, wire
from .client import Client
from .errors import EchoMQError, JobGone, ModuleNotLoaded, NotRetryable, QueueBusy
from .keyspace import queue_keys

DEFAULT_URL = "redis://localhost:6379/0"
MODULE_MISSING = (
    "the server does not know EMQ.*: start it with --loadmodule /path/to/emq.so (see echomq module-path)"
)
log = logging.getLogger("echomq.cli")


class CliError(Exception):
    """A failure to report in one line, with exit status 1."""


def _connect(args: argparse.Namespace) -> Client:
    return Client.from_url(args.url, cluster=args.cluster, backend=args.backend)


BACKEND_NOTE = {
    "module": "the emq module's EMQ.* commands",
    "scripts": "Lua scripts (EVALSHA): the server has no emq module",
}


def _require_module(client: Client) -> None:
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
    counts = client.counts(args.queue)
    now, active = counts.server_time, counts.active
    out = sys.stdout
    paused = "  PAUSED (claims get nothing until 'echomq resume')" if counts.paused else ""
    out.write(f"queue {args.queue}  (server time {now} ms){paused}\n")
    out.write(f"  backend {client.backend} ({BACKEND_NOTE[client.backend]})\n")
    out.write(f"  pending {counts.pending}   active {active}   dead {counts.dead}   failed {counts.failed}\n")
    out.write(
        f"  delayed {counts.delayed}   lapsed {counts.lapsed}   paused {'yes' if counts.paused else 'no'}\n"
    )
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


def _ago(now: int, at: int | None) -> str:
    if at is None:
        return ""
    seconds = (now - at) / 1000
    return f"{seconds:.1f} s ago" if seconds >= 0 else f"in {-seconds:.1f} s"


def cmd_job(args: argparse.Namespace) -> int:
    info = _connect(args).job(args.queue, args.job_id, payload=args.payload)
    if info is None:
        raise CliError(f"no job {args.job_id!r} in queue {args.queue!r}")
    now = info.server_time
    rows: list[tuple[str, object]] = [
        ("state", info.state or "(none)"),
        ("attempts", f"{info.attempts} claims in all; {info.tries} since enqueue or the last retry"),
        ("retries", info.retries),
        ("stalled", info.stalled),
        ("last error", info.last_error or ""),
        ("cancel requested", (info.cancel_reason or "yes") if info.cancel_requested else "no"),
        ("enqueued", f"{info.enqueued_at}  ({_ago(now, info.enqueued_at)})" if info.enqueued_at else ""),
        ("claimed", f"{info.claimed_at}  ({_ago(now, info.claimed_at)})" if info.claimed_at else ""),
        ("finished", f"{info.finished_at}  ({_ago(now, info.finished_at)})" if info.finished_at else ""),
    ]
    if info.lease_left_ms is not None:
        left = info.lease_left_ms
        rows.append(("lease", f"{left} ms left" if left > 0 else f"lapsed {-left} ms ago"))
    if info.due_at is not None:
        rows.append(("due", f"{info.due_at}  ({_ago(now, info.due_at)})"))
    if info.dead_at is not None:
        rows.append(("died", f"{info.dead_at}  ({_ago(now, info.dead_at)})"))
    if info.expires_at is not None:
        rows.append(("row expires", f"{info.expires_at}  ({_ago(now, info.expires_at)})"))
    if info.checkpoint_size is not None:
        extra = f", attempt {info.checkpoint_attempt}" if info.checkpoint_attempt is not None else ""
        at = f", at {info.checkpoint_at}" if info.checkpoint_at is not None else ""
        rows.append(("checkpoint", f"{info.checkpoint_size} bytes{at}{extra}"))
    rows.append(("payload", f"{info.payload_size} bytes"))
    print(f"job {info.id} of queue {args.queue}")
    for name, value in rows:
        print(f"  {name:<17}{value}".rstrip())
    if info.payload is not None:
        print(info.payload.decode("utf-8", "backslashreplace"))
    return 0


def cmd_dead(args: argparse.Namespace) -> int:
    client = _connect(args)
    jobs = client.dead(args.queue, offset=args.offset, count=args.limit)
    counts = client.counts(args.queue)
    print(f"dead {counts.dead} in queue {args.queue} (oldest first; showing {len(jobs)} from {args.offset})")
    if not jobs:
        return 0
    now = counts.server_time
    rows = [["job", "died", "attempts", "retries", "last error"]]
    for job in jobs:
        error = (job.last_error or "").replace("\n", " ")
        rows.append([job.id, _ago(now, job.died_at), str(job.attempts), str(job.retries), error[:80]])
    _table(rows, sys.stdout)
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    client = _connect(args)
    if args.all == bool(args.job_ids):
        raise CliError("name the jobs to retry, or --all (and no ids) for every dead job")
    if args.all:
        result = client.retry_dead(args.queue, limit=args.limit)
        print(
            f"retried {result.retried} dead jobs"
            + (f" (dropped {result.dropped} stale entries)" if result.dropped else "")
        )
        return 0
    failed = 0
    for job_id in args.job_ids:
        try:
            client.retry(args.queue, job_id)
            print(f"{job_id}: pending")
        except JobGone:
            print(f"{job_id}: no such job", file=sys.stderr)
            failed += 1
        except NotRetryable as exc:
            print(f"{job_id}: not retried: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def cmd_purge(args: argparse.Namespace) -> int:
    if not args.dead:
        raise CliError("say what to purge: --dead (the dead jobs and their rows)")
    print(f"purged {_connect(args).purge_dead(args.queue, limit=args.limit)} dead jobs")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    changed = _connect(args).pause(args.queue)
    print("paused: claims get nothing until 'echomq resume'" if changed else "already paused")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    changed = _connect(args).resume(args.queue)
    print("resumed: jobs are handed out again" if changed else "was not paused")
    return 0


def _ms(value: int) -> str:
    return "forever" if value < 0 else ("not kept" if value == 0 else f"{value} ms")


def cmd_retention(args: argparse.Namespace) -> int:
    policy = _connect(args).retention(
        args.queue, done_ms=args.done, cancelled_ms=args.cancelled, dead_ms=args.dead
    )
    print(f"done {_ms(policy.done_ms)}   cancelled {_ms(policy.cancelled_ms)}   dead {_ms(policy.dead_ms)}")
    return 0


def cmd_obliterate(args: argparse.Namespace) -> int:
    client = _connect(args)
    if not args.yes:
        counts = client.counts(args.queue)
        total = counts.pending + counts.delayed + counts.active + counts.dead
        prompt = (
            f"obliterate queue {args.queue!r}: {total} jobs in its sets ({counts.active} active), "
            "its finished rows, settings and metric? type the queue name to confirm: "
        )
        sys.stdout.write(prompt)
        sys.stdout.flush()
        if sys.stdin.readline().strip() != args.queue:
            raise CliError("not confirmed: nothing deleted")
    try:
        result = client.obliterate(args.queue, force=args.force, limit=args.limit)
    except QueueBusy as exc:
        raise CliError(f"{exc} (echomq obliterate {args.queue} --force)") from exc
    print(f"obliterated {args.queue}: {result.removed} jobs from its sets, {result.forgotten} finished rows")
    return 0


def _log_to_stderr() -> None:
    # Until the CLI's one logging setup lands (issue 19's point 3), the long-running
    # commands print echomq's INFO lines; a setup made by the caller wins.
    import logging

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_exporter(args: argparse.Namespace) -> int:
    try:
        from .metrics import exporter_registry, serve
    except ImportError as exc:
        raise CliError(str(exc)) from exc
    _log_to_stderr()
    registry, _collector, watch = exporter_registry(
        _connect(args),
        args.queues or None,
        max_queues=args.max_queues,
        scan_budget=args.scan_budget,
        discover_every=args.discover_every,
        cancel_latency=not args.no_cancel_latency,
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    server = serve(args.port, args.addr, registry)
    host, port = server.server_address[:2]
    print(f"metrics of {' '.join(args.queues) or 'every queue'} at http://{host}:{port}/metrics", flush=True)
    try:
        stopping.wait(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        if watch is not None:
            watch.stop()
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        from .dashboard import Dashboard, DashboardServer
    except ImportError as exc:
        raise CliError(str(exc)) from exc
    _log_to_stderr()
    token = args.token or os.environ.get("ECHOMQ_DASHBOARD_TOKEN") or None
    dashboard = Dashboard.from_url(
        args.url,
        cluster=args.cluster,
        queues=args.queues or None,
        read_only=args.read_only,
        token=token,
        show_payloads=args.show_payloads,
        interval=args.interval,
    )
    server = DashboardServer(dashboard, args.host, args.port)  # refuses a non-loopback host without a token
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    server.start()
    login = "?token=<token>" if token else ""
    print(f"dashboard at {server.url}{login}  (Ctrl-C or SIGTERM stops it)", flush=True)
    try:
        stopping.wait(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


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

    p = command("job", "one job's status", cmd_job)
    p.add_argument("queue")
    p.add_argument("job_id")
    p.add_argument("--payload", action="store_true", help="print the payload too")

    p = command("dead", "the dead jobs, oldest first, with their last errors", cmd_dead)
    p.add_argument("queue")
    p.add_argument("--limit", type=_positive, default=20, help="jobs to list (default 20)")
    p.add_argument("--offset", type=int, default=0, help="skip this many (default 0)")

    p = command("retry", "send dead or cancelled jobs back to pending with a fresh budget", cmd_retry)
    p.add_argument("queue")
    p.add_argument("job_ids", nargs="*", metavar="JOB")
    p.add_argument("--all", action="store_true", help="every job dead now")
    p.add_argument("--limit", type=_positive, default=100, help="jobs per command with --all (default 100)")

    p = command("purge", "delete the dead jobs", cmd_purge)
    p.add_argument("queue")
    p.add_argument("--dead", action="store_true", help="the dead jobs and their rows")
    p.add_argument("--limit", type=_positive, default=100, help="jobs per command (default 100)")

    for name, helptext, func in (
        ("pause", "stop handing out the queue's jobs", cmd_pause),
        ("resume", "hand out the queue's jobs again", cmd_resume),
    ):
        p = command(name, helptext, func)
        p.add_argument("queue")

    p = command("retention", "show or set how long finished rows are kept", cmd_retention)
    p.add_argument("queue")
    for option in ("done", "cancelled", "dead"):
        p.add_argument(
            f"--{option}", type=int, default=None, metavar="MS", help=f"{option} rows: ms, -1 forever"
        )

    p = command("obliterate", "delete the queue, its jobs, settings and metric", cmd_obliterate)
    p.add_argument("queue")
    p.add_argument("--force", action="store_true", help="even while jobs are active")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--limit", type=_positive, default=100, help="keys per command (default 100)")

    p = command("exporter", "serve the queues' Prometheus metrics (echomq[metrics])", cmd_exporter)
    p.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to export (default: discover them)")
    p.add_argument("--port", type=int, default=9640, help="HTTP port (default 9640; 0: a free one)")
    p.add_argument("--addr", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--max-queues", type=_positive, default=100, help="queues discovered, at most (100)")
    p.add_argument(
        "--scan-budget", type=_positive, default=100_000, help="keys one discovery SCAN examines at most"
    )
    p.add_argument("--discover-every", type=float, default=30.0, help="seconds between discoveries")
    p.add_argument("--no-cancel-latency", action="store_true", help="do not follow cancels (no PSUBSCRIBE)")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")

    p = command("dashboard", "serve the web dashboard (echomq[dashboard])", cmd_dashboard)
    p.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to show (default: discover them)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other needs a token)"
    )
    p.add_argument("--port", type=int, default=8640, help="HTTP port (default 8640; 0: a free one)")
    p.add_argument("--token", default=None, help="asked of every request (default: $ECHOMQ_DASHBOARD_TOKEN)")
    p.add_argument("--read-only", action="store_true", help="no actions: no pause, cancel, retry or purge")
    p.add_argument("--show-payloads", action="store_true", help="show job payloads (hidden by default)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")

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
