"""``echomq worker MODULE:HANDLER --queue Q``: a Worker (threads) or an asyncio Worker, by the handler."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any, cast

from ..errors import ModuleNotLoaded
from ._common import MODULE_MISSING, CliError, Command, connect, log, positive, require_module, seconds


def cmd_worker(args: argparse.Namespace) -> int:
    handler = load_handler(args.handler)
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
        from ..worker import Worker

        client = connect(args)
        require_module(client)
        worker = Worker(client, args.queue, handler, **settings)
        try:
            worker.run()
        finally:
            stats = worker.stats
            client.close()
    log.info("worker of %r stopped: %s", args.queue, stats)
    return 0


async def _run_async_worker(args: argparse.Namespace, handler: Any, settings: dict[str, Any]) -> Any:
    from .. import asyncio as emq

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
    if not callable(target):
        raise CliError(f"{spec} is not callable (it is a {type(target).__name__})")
    return cast("Callable[..., object]", target)


def register(command: Command) -> None:
    p = command("worker", "run a worker: MODULE:HANDLER for the jobs of --queue", cmd_worker)
    p.add_argument("handler", metavar="MODULE:HANDLER", help="e.g. tasks:send (an async def runs on asyncio)")
    p.add_argument("--queue", "-q", required=True)
    p.add_argument("--concurrency", "-c", type=positive, default=1, help="jobs at a time (default 1)")
    p.add_argument("--lease-ms", type=positive, default=30_000, help="each job's lease (default 30000)")
    p.add_argument("--max-attempts", type=positive, default=3, help="claims before dead (default 3)")
    p.add_argument(
        "--grace",
        type=seconds,
        default=10.0,
        help="seconds handlers get to finish on SIGINT/SIGTERM (default 10)",
    )
    p.add_argument(
        "--poll-interval", type=seconds, default=0.2, help="idle wait between claims (default 0.2)"
    )
