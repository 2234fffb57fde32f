"""``echomq worker myapp.tasks:app``: a worker for every task of an ``echomq.App``, and ``echomq result``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

from ..errors import JobCancelled, JobFailed, JobGone, ResultTimeout
from ..tasks import AppCore
from ..tasks.results import ResultWait
from ..tasks.serializers import JSON
from ._common import CliError, connect, connect_waiting, load_handler, log, require_module

__all__ = ["cmd_call", "cmd_result", "run_app"]


def run_app(
    args: argparse.Namespace, app: AppCore, settings: dict[str, Any], make_metrics: Callable[[Any], Any]
) -> int:
    """The app's tasks on this command's connection (--url, --backend): threads, or asyncio for its twin."""
    from ..tasks.aio import AsyncApp
    from ..tasks.dispatch import AsyncDispatcher, Dispatcher

    queues = [args.queue] if args.queue is not None else app.queues()
    if not queues:
        raise CliError(
            f"{args.handler} has no tasks (does importing it define them?), and no --queue was given"
        )
    unused = [q for q in queues if app.tasks and q not in app.queues()]
    if unused:  # a typo, most often: its jobs would be failed as no task of this app
        log.warning(
            "--queue %s: none of %s's tasks uses it (theirs: %s); its jobs run only if they name one of "
            "this app's tasks", ", ".join(unused), args.handler, ", ".join(app.queues()),
        )  # fmt: skip
    log.info(
        "worker of %s for %s: tasks %s, concurrency %d per queue; SIGINT/SIGTERM stop it",
        args.handler, ", ".join(queues), ", ".join(sorted(app.tasks)) or "none", args.concurrency,
    )  # fmt: skip
    settings["metrics"] = make_metrics(args)
    if app.import_path is None:  # where its children import it from (isolation="process")
        app.import_path = args.handler
    try:
        app._check_isolation(settings.get("isolation", "thread"), queues)
    except TypeError as exc:
        raise CliError(str(exc)) from exc
    if isinstance(app, AsyncApp):
        from .. import asyncio as emq
        from ..asyncio._reach import wait_for_server as async_wait_for_server
        from ..tasks.aio import AsyncTaskWorker

        async def main() -> None:
            client = emq.Client.from_url(args.url, cluster=args.cluster, backend=args.backend)
            try:
                await async_wait_for_server(client.redis, args.wait_for_server, args.url)
                dispatcher = AsyncDispatcher.of(app)
                workers = [emq.Worker(client, q, dispatcher, **settings) for q in queues]

                async def schedules() -> None:  # on this command's connection, not the app module's
                    assert isinstance(app, AsyncApp)
                    await app.register_schedules(client)

                await AsyncTaskWorker(workers, schedules if app.periodic else None, dispatcher).run()
            finally:
                await client.aclose()

        asyncio.run(main())
        return 0
    from .._sync.worker import Worker
    from ..tasks.app import App, TaskWorker

    client = connect_waiting(args)
    require_module(client)
    dispatcher = Dispatcher.of(app)
    workers = TaskWorker(
        [Worker(client, q, dispatcher, **settings) for q in queues],
        (lambda: app.register_schedules(client)) if app.periodic and isinstance(app, App) else None,
        dispatcher,
    )
    try:
        workers.run()
    finally:
        for w in workers.workers:
            log.info("worker of %r stopped: %s", w.queue, w.stats)
        client.close()
    return 0


def cmd_result(args: argparse.Namespace) -> int:
    """Print a job's result (JSON as stored); exit 1 for a dead or cancelled job, 2 when it has not ended."""
    client = connect(args)
    try:
        if args.wait is None:
            wait = ResultWait(args.queue, args.job_id, None, 0.0, JSON)
            redis_client: Any = client.redis
            settled = wait.settle(redis_client.execute_command(*wait.read()))
            if settled is None:
                info = client.job(args.queue, args.job_id)
                state = info.state if info is not None else "gone"
                print(f"job {args.job_id} of queue {args.queue} is {state}: no result yet (--wait S waits)")
                return 2
            value = settled.value
        else:
            value = client.result(args.queue, args.job_id, timeout=args.wait)
    except JobFailed as exc:
        print(f"job {exc.job_id} is dead: {exc.type}: {exc.message}", file=sys.stderr)
        if exc.traceback:
            print(exc.traceback.rstrip("\n"), file=sys.stderr)
        return 1
    except JobCancelled as exc:
        print(f"job {exc.job_id} was cancelled" + (f": {exc.reason}" if exc.reason else ""), file=sys.stderr)
        return 1
    except ResultTimeout as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except JobGone as exc:
        raise CliError(f"no job {args.job_id!r} in queue {args.queue!r}") from exc
    print(json.dumps(value, ensure_ascii=False))
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    """Enqueue a call of a task by name (JSON arguments); print its id, or with --wait its result."""
    from ..tasks import App
    from ..tasks.serializers import SerializationError

    positional = _json_arg("ARGS_JSON", args.args, list, "a JSON array, e.g. '[2, 3]'")
    keywords = _json_arg("--kwargs", args.kwargs, dict, 'a JSON object, e.g. \'{"to": "ada"}\'')
    client = connect(args)
    if args.app is not None:  # the app that defines the task: its queue, and its signature checked here
        found = load_handler(args.app)
        if not isinstance(found, AppCore):
            raise CliError(f"--app {args.app} is not an echomq.App")
        if args.task not in found.tasks:
            known = ", ".join(sorted(found.tasks)) or "none"
            raise CliError(f"{args.app} has no task {args.task!r} (it has: {known})")
        app = App(client, queue=found.tasks[args.task].queue)
        app.tasks[args.task] = found.tasks[args.task]
    else:
        app = App(client, queue=args.queue or "default")
    try:
        handle = app.options(
            queue=args.queue, job_id=args.id, delay_ms=args.delay, priority=args.priority,
            unique_key=args.unique_key,
        ).enqueue(args.task, *positional, **keywords)  # fmt: skip
    except (TypeError, ValueError, SerializationError) as exc:
        raise CliError(str(exc)) from exc
    if not handle.created:
        print(f"job {handle.id} holds unique key {args.unique_key!r}: nothing enqueued", file=sys.stderr)
    if args.wait is None:
        print(handle.id)
        return 0
    args.queue, args.job_id = handle.queue, str(handle.id)
    return cmd_result(args)


def _json_arg(name: str, text: str | None, kind: type, example: str) -> Any:
    if text is None:
        return kind()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CliError(f"{name} must be {example}: {exc}") from None
    if not isinstance(value, kind):
        kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
        raise CliError(f"{name} must be {example}, not a JSON {kinds.get(type(value), 'number')}")
    return value
