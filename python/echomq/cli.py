"""echomq: the operator's command line.

    echomq inspect mail                 counts, failed metric, active jobs and their leases
    echomq sweep mail --max-stalled 3   one sweep, now
    echomq reap mail --interval 1       the reaper, until Ctrl-C
    echomq cancel mail job-42 --reason "customer withdrew"
    echomq enqueue mail '{"to": "ada"}'
    echomq server                       a local redis-server with the module loaded
    echomq module-path                  the emq.so for --loadmodule
    echomq demo                         the lifecycle demo on a server of its own

The server is --url (or $ECHOMQ_URL, default redis://localhost:6379/0);
--cluster (or ECHOMQ_CLUSTER=1) connects to Redis Cluster through that
URL's node.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, cast

import redis

from ._protocol import server_ms, text, wire
from .client import Client
from .errors import EchoMQError, JobGone
from .keyspace import queue_keys

DEFAULT_URL = "redis://localhost:6379/0"


class CliError(Exception):
    """A failure to report in one line, with exit status 1."""


def _connect(args: argparse.Namespace) -> Client:
    return Client.from_url(args.url, cluster=args.cluster)


def _table(rows: list[list[str]], out: Any) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


# -- commands ------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    client = _connect(args)
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
        row = r.hmget(keys.job(wire(member)), ["attempts", "stalled", "cancel_requested"])
        left = int(deadline) - now
        lapse = f"{left} ms" if left > 0 else f"lapsed {-left} ms ago"
        attempts, stalled, cancel = (text(v or b"") for v in row)
        rows.append([text(member), attempts, lapse, stalled or "0", cancel])
    _table(rows, out)
    if active > len(leases):
        out.write(f"  ... and {active - len(leases)} more (--limit)\n")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    result = _connect(args).sweep(args.queue, max_stalled=args.max_stalled, limit=args.limit)
    print(f"recovered {len(result.recovered)}: {' '.join(result.recovered)}".rstrip())
    print(f"dead      {len(result.dead)}: {' '.join(result.dead)}".rstrip())
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    from .reaper import Reaper

    def report(result: Any) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"{stamp} recovered {result.recovered} dead {result.dead}", flush=True)

    reaper = Reaper(
        _connect(args),
        args.queue,
        interval=args.interval,
        max_stalled=args.max_stalled,
        limit=args.limit,
        on_sweep=report,
    )
    print(f"reaping {args.queue} every {args.interval} s (Ctrl-C stops)", flush=True)
    reaper.start()
    try:
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        reaper.stop()
    print(f"recovered {reaper.recovered}, dead-lettered {reaper.dead}, errors {reaper.errors}")
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


def cmd_server(args: argparse.Namespace) -> int:
    from .testing import EmbeddedServer

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the server as Ctrl-C does

    signal.signal(signal.SIGTERM, terminate)
    server = EmbeddedServer(args.server_args, port=args.port)
    server.start()
    try:
        print(f"redis-server {server.url}  --loadmodule {server.module}", flush=True)
        print("Ctrl-C stops it", flush=True)
        assert server.process is not None
        server.process.wait()
        raise CliError(f"the server exited:\n{server.log_tail()}")
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


# -- the parser ----------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="echomq", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("ECHOMQ_URL", DEFAULT_URL),
        help="server URL (default: $ECHOMQ_URL or %(default)s)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        default=os.environ.get("ECHOMQ_CLUSTER", "") not in ("", "0"),
        help="the URL is a Redis Cluster node (default: $ECHOMQ_CLUSTER)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("inspect", help="counts, failed metric and the active jobs' leases")
    p.add_argument("queue")
    p.add_argument("--limit", type=_positive, default=20, help="active jobs to list (default 20)")
    p.set_defaults(func=cmd_inspect)

    for name, helptext in (("sweep", "sweep once"), ("reap", "run the reaper until Ctrl-C")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("queue")
        p.add_argument("--max-stalled", type=_positive, default=1, help="stalls before dead (default 1)")
        p.add_argument("--limit", type=_positive, default=100, help="jobs per sweep (default 100)")
        if name == "reap":
            p.add_argument("--interval", type=float, default=1.0, help="seconds between sweeps")
            p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
            p.set_defaults(func=cmd_reap)
        else:
            p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("cancel", help="request a cooperative cancel of a job")
    p.add_argument("queue")
    p.add_argument("job_id")
    p.add_argument("--reason", default=None, help="delivered to the handler's CancelToken")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("enqueue", help="add a job; prints its id")
    p.add_argument("queue")
    p.add_argument("payload")
    p.add_argument("--id", default=None, help="the job id (default: a new one)")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("server", help="start a local redis-server with the module loaded")
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.add_argument("server_args", nargs="*", help="extra redis-server options, after --")
    p.set_defaults(func=cmd_server)

    p = sub.add_parser("module-path", help="print the emq.so path for --loadmodule")
    p.set_defaults(func=cmd_module_path)

    p = sub.add_parser("demo", help="run the lifecycle demo on a server of its own")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except redis.exceptions.ConnectionError as exc:
        print(f"echomq: cannot connect to {args.url}: {exc}", file=sys.stderr)
    except (CliError, EchoMQError, ValueError, redis.exceptions.RedisError) as exc:  # ModuleNotLoaded too
        print(f"echomq: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
