"""echomq: the operator's command line.

    echomq inspect mail                 counts, active jobs and their leases
    echomq check mail                   broken invariants, orphan unique keys (exit 1 if any)
    echomq sweep mail --max-stalled 3   one sweep, now
    echomq reap mail --interval 1       the reaper, until Ctrl-C
    echomq pause mail / resume mail     stop / restart handing out jobs
    echomq retention mail --done 60000  how long finished rows are kept (ms; -1 forever)
    echomq limit mail --rate 50 --per 1000  at most 50 claims a second (--off; --backoff MS)
    echomq group limit mail customer-42 --max 2   at most 2 of a group's jobs at once (--no-max)
    echomq group list mail              the groups: waiting, active, cap, paused (pause, resume)
    echomq obliterate mail              delete the queue and all its jobs (asks first)
    echomq enqueue mail '{"to": "ada"}'
    echomq job mail job-42              one job's status
    echomq cancel mail job-42 --reason "customer withdrew"
    echomq dead mail --limit 20         the dead jobs, oldest first, with their errors
    echomq retry mail job-42            back to pending with a fresh budget (--all: every dead job)
    echomq purge mail --dead            delete the dead jobs
    echomq schedule add mail digest --cron "0 8 * * *" --tz Europe/Berlin
                                        a job every day at 8:00 (list, remove)
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
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

import redis

from .. import __version__
from .._log import configure_logging
from ..errors import EchoMQError
from . import flow, groups, jobs, queues, schedules, serve, worker
from ._common import CliError, format_sweep, global_options, log

__all__ = ["CliError", "build_parser", "format_sweep", "main"]

# Each module registers its commands; --help lists them in this order.
COMMANDS = (queues, flow, groups, jobs, schedules, worker, serve)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False everywhere: a prefix is not an option (`--queu` must not start a worker)
    parser = argparse.ArgumentParser(
        prog="echomq",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"echomq {__version__}")
    global_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    global_options(common, defaults=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, helptext: str, func: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=helptext, parents=[common], allow_abbrev=False)
        p.set_defaults(func=func)
        return p

    for module in COMMANDS:
        module.register(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``echomq`` command: exit status 0, 1 on an error (one line), 2 on bad usage,
    128 + the signal when a second SIGINT/SIGTERM stopped a worker at once."""
    parser = build_parser()
    args = parser.parse_args(argv)
    settle = getattr(args, "settle", None)
    if settle is not None:  # a command's settings from $ECHOMQ_* where no flag gave them (usage errors: 2)
        settle(args)
    try:
        configure_logging(args.log_level, args.log_format)
    except ValueError as exc:  # $ECHOMQ_LOG_LEVEL / $ECHOMQ_LOG_FORMAT
        parser.error(str(exc))
    debug = logging.getLogger().isEnabledFor(logging.DEBUG)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, not at exit: a reader that left early is seen below
        return code
    except BrokenPipeError:
        # `echomq job ... | head`: the reader has what it wanted; end quietly, as other tools do.
        _quiet_stdout()
        return 0
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


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush must not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing will flush to the pipe
        pass


def _error(message: str, debug: bool) -> None:
    if debug:
        log.exception("%s", message)
    first = message.splitlines()[0] if message else "error"
    print(f"echomq: {first}", file=sys.stderr)
