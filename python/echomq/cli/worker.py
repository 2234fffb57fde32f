"""``echomq worker MODULE:HANDLER --queue Q``: a Worker (threads) or an asyncio Worker, by the handler."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import math
import sys
from typing import Any

from ..asyncio._reach import wait_for_server as async_wait_for_server
from ..errors import ModuleNotLoaded
from ..retry import RetryPolicy
from ._common import (
    MODULE_MISSING,
    CliError,
    Command,
    connect_waiting,
    load_handler,
    log,
    port,
    positive,
    require_module,
    seconds,
)
from .settings import Setting, add_settings, boolean, targets


def number(value: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(out):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return out


def whole(value: str) -> int:
    try:
        out = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value!r}") from None
    if out < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value!r}")
    return out


def port_or_zero(value: str) -> int:
    return 0 if value.strip() == "0" else port(value)


# Every setting of the Python Worker (echomq.Worker, echomq.asyncio.Worker), and what the
# CLI adds around it.  Adding one is a row here: its flag (and so $ECHOMQ_<FLAG>), type,
# default and the Worker keyword it goes to ("retry.<field>": a field of its RetryPolicy).
WORKER_SETTINGS = (
    Setting("--concurrency", positive, 1, "jobs at a time", to="concurrency", short="-c", metavar="N"),
    Setting(
        "--wait-for-server",
        seconds,
        0.0,
        "at start, wait up to this long for the server to answer (0: exit 1 at once if it does not); "
        "once running, a worker rides out an outage by itself",
        metavar="S",
    ),
    Setting(
        "--prefetch",
        whole,
        0,
        "jobs claimed ahead of a free slot, their leases kept while they wait (fairness and a crash cost "
        "more: see the worker guide)",
        to="prefetch",
        metavar="N",
    ),
    Setting("--lease-ms", positive, 30_000, "each job's lease, in ms", to="lease_ms", metavar="MS"),
    Setting(
        "--extend-interval",
        seconds,
        None,
        "seconds between a held job's lease extensions",
        to="extend_interval",
        shown="a third of the lease",
        metavar="SECONDS",
    ),
    Setting(
        "--max-attempts",
        positive,
        3,
        "runs of a job in all before it is dead",
        to="max_attempts",
        metavar="N",
    ),
    Setting(
        "--retry-backoff",
        str,
        None,
        "how a failed job waits before it runs again",
        to="retry.backoff",
        shown="none: at once; exponential once another --retry-* option is given",
        choices=("exponential", "fixed"),
    ),
    Setting(
        "--retry-delay",
        whole,
        None,
        "the wait before the first retry, in ms (fixed: before every retry)",
        to="retry.base_ms",
        shown="1000 with a backoff",
        metavar="MS",
    ),
    Setting(
        "--retry-factor",
        number,
        None,
        "exponential: each further retry waits this many times longer",
        to="retry.factor",
        shown="2",
        metavar="X",
    ),
    Setting(
        "--retry-max-delay",
        whole,
        None,
        "exponential: the longest wait, in ms",
        to="retry.max_ms",
        shown="3600000",
        metavar="MS",
    ),
    Setting(
        "--retry-jitter",
        number,
        None,
        "a fraction in [0, 1]: each wait is drawn from [wait * (1 - jitter), wait]",
        to="retry.jitter",
        shown="0",
        metavar="FRACTION",
    ),
    Setting(
        "--grace",
        seconds,
        10.0,
        "seconds handlers get to finish on SIGINT/SIGTERM",
        to="grace",
        shown="10",
        metavar="SECONDS",
    ),
    Setting(
        "--poll-interval",
        seconds,
        0.2,
        "where a claim cannot wait on the server (the scripts backend, a cluster): how often an idle "
        "worker claims, in seconds (the scripts backend backs off to 3 s while the queue stays empty)",
        to="poll_interval",
        metavar="SECONDS",
    ),
    Setting(
        "--timeout-ms",
        positive,
        None,
        'a handler running longer has its token cancelled ("timeout"); after --timeout-grace its job fails',
        to="timeout_ms",
        shown="none",
        metavar="MS",
    ),
    Setting(
        "--timeout-grace",
        seconds,
        5.0,
        "seconds a timed-out handler gets to stop before its job fails without it (a thread runs on)",
        to="timeout_grace",
        shown="5",
        metavar="SECONDS",
    ),
    Setting(
        "--isolation",
        str,
        "thread",
        "where a handler runs: in the worker's threads or asyncio tasks (a timed-out one that never "
        "looks at its token runs on), or each slot's in a child process that a timeout kills and a crash "
        "cannot take down (the handler, or the app, must be importable by name: the children import "
        "MODULE:HANDLER)",
        to="isolation",
        choices=("thread", "process"),
        metavar="{thread,process}",
    ),
    Setting(
        "--max-jobs-per-child",
        positive,
        None,
        "with --isolation process: a child runs this many jobs, then is replaced",
        to="max_jobs_per_child",
        shown="no limit",
        metavar="N",
    ),
    Setting(
        "--reap",
        boolean,
        True,
        "sweep the queue now and then: lapsed jobs (a crashed worker's) back to pending, the dead "
        "retention applied",
        to="reap",
        switch=True,
    ),
    Setting(
        "--reap-interval",
        seconds,
        10.0,
        "seconds between this worker's sweeps, on average (each wait drawn from half to one and a half)",
        to="reap_interval",
        shown="10",
        metavar="SECONDS",
    ),
    Setting(
        "--max-stalled",
        positive,
        3,
        "this worker's sweeps dead-letter a job that lapsed this many times",
        to="max_stalled",
        metavar="N",
    ),
    Setting(
        "--replicas",
        whole,
        0,
        "a handler starts once this many replicas have its job's claim",
        to="replicas",
        metavar="N",
    ),
    Setting(
        "--replicas-timeout-ms",
        positive,
        1000,
        "how long a claim waits for the replicas; a job not confirmed is given back unrun",
        to="replicas_timeout_ms",
        metavar="MS",
    ),
    Setting(
        "--replicas-aof",
        boolean,
        False,
        "the replicas (and this server) must also have the claim in their AOF (WAITAOF)",
        to="replicas_aof",
        switch=True,
    ),
    Setting(
        "--metrics",
        boolean,
        True,
        "count claims, ends and run times (echomq[metrics]); the totals reach the dashboard and "
        "the exporter through the server",
        switch=True,
    ),
    Setting(
        "--metrics-port",
        port_or_zero,
        None,
        "also serve them to Prometheus on this port (0: a free one)",
        shown="none",
        metavar="PORT",
    ),
    Setting("--metrics-host", str, "127.0.0.1", "the address --metrics-port binds", metavar="HOST"),
)


def worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The Worker's keyword arguments from the settled settings (``retry``: a RetryPolicy when asked for)."""
    parts = targets(args, WORKER_SETTINGS)
    kwargs = parts[""]
    if parts.get("retry"):
        kwargs["retry"] = RetryPolicy(max_attempts=kwargs["max_attempts"], **parts["retry"])
    return kwargs


def make_metrics(args: argparse.Namespace) -> Any:
    """The worker's ``Metrics`` (on by default; served on --metrics-port when given), or None."""
    if not args.metrics:
        if args.metrics_port is not None:
            raise CliError("--metrics-port serves the metrics: it needs --metrics (on by default)")
        return None
    try:
        from ..metrics import Metrics, serve
    except ImportError as exc:
        if args.metrics_port is not None:
            raise CliError(str(exc)) from exc
        log.warning("metrics off: %s", exc)
        return None
    metrics = Metrics()
    if args.metrics_port is not None:
        serve(args.metrics_port, args.metrics_host, metrics.registry)  # logs where
    return metrics


def cmd_worker(args: argparse.Namespace) -> int:
    from ..tasks import AppCore

    try:
        handler = load_handler(args.handler)
    except CliError as exc:
        if args.queue is None:  # what is wrong first: the handler, not a --queue it might have needed
            usage_error(f"{exc} (and --queue is required unless {args.handler} is an echomq.App)")
        raise
    if isinstance(handler, AppCore):
        from ._tasks import run_app

        return run_app(args, handler, worker_settings(args), make_metrics)
    if args.queue is None:
        usage_error(
            f"--queue is required: {args.handler} is a handler, not an echomq.App "
            "(whose tasks name their queues)"
        )
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (a callable object's own method)
    )
    settings = worker_settings(args)
    retry = settings.get("retry")
    log.info(
        "worker of %r: %s (%s), concurrency %d, lease %d ms, %d attempts, retried %s, grace %.1f s; "
        "SIGINT/SIGTERM stop it",
        args.queue, args.handler, "asyncio" if is_async else "threads", args.concurrency, args.lease_ms,
        args.max_attempts, describe(retry), args.grace,
    )  # fmt: skip
    settings["metrics"] = make_metrics(args)
    if is_async:
        stats = asyncio.run(_run_async_worker(args, handler, settings))
    else:
        from .._sync.worker import Worker

        client = connect_waiting(args)
        require_module(client)
        worker = Worker(client, args.queue, handler, **settings)
        try:
            worker.run()
        finally:
            stats = worker.stats
            client.close()
    log.info("worker of %r stopped: %s", args.queue, stats)
    return 0


def usage_error(message: str) -> None:
    """Exit 2 with argparse's words: ``--queue`` is required unless the target is an app."""
    print(f"echomq worker: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def describe(retry: RetryPolicy | None) -> str:
    if retry is None:
        return "at once"
    if retry.backoff == "fixed":
        return f"after {retry.base_ms} ms"
    return f"after {retry.base_ms} ms, x{retry.factor:g} each time up to {retry.max_ms} ms"


async def _run_async_worker(args: argparse.Namespace, handler: Any, settings: dict[str, Any]) -> Any:
    from .. import asyncio as emq

    client = emq.Client.from_url(args.url, cluster=args.cluster, backend=args.backend)
    try:
        await async_wait_for_server(client.redis, args.wait_for_server, args.url)
        if args.backend == "module":  # as require_module: a server without it would look empty
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


def register(command: Command) -> None:
    p = command(
        "worker",
        "run a worker: MODULE:HANDLER for the jobs of --queue, or MODULE:APP for an app's tasks",
        cmd_worker,
    )
    p.add_argument(
        "handler",
        metavar="MODULE:HANDLER",
        help="e.g. tasks:send (an async def runs on asyncio), or myapp.tasks:app (an echomq.App: every task)",
    )
    p.add_argument(
        "--queue",
        "-q",
        default=None,
        help="the queue (required for a handler; for an app: default every queue of its tasks)",
    )
    add_settings(p, "worker settings (a flag wins over its $ECHOMQ_ variable, which wins over the default)",
                 WORKER_SETTINGS)  # fmt: skip
