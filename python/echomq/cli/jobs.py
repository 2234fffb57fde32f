"""Jobs one by one: enqueue, job, cancel, and the dead: dead, retry, purge."""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime
from pathlib import Path

from .._protocol.calls import PRIORITY_MAX, PRIORITY_MIN
from ..errors import JobGone, NotRetryable
from ..tasks.describe import call_text
from ._common import CliError, Command, ago, connect, positive, table, task_calls, when


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = read_payload(args.payload)
    if args.unique_key is None and (args.unique_for is not None or args.replace):
        raise CliError("--unique-for and --replace need --unique-key")
    job_id = connect(args).enqueue(
        args.queue,
        payload,
        job_id=args.id,
        delay_ms=args.delay,
        run_at_ms=args.at,
        priority=args.priority,
        unique_key=args.unique_key,
        unique_for_ms=args.unique_for,
        replace=args.replace,
        group=args.group,
    )
    print(job_id)
    if job_id.replaced:
        print(f"job {job_id} holds unique key {args.unique_key!r}: its payload replaced", file=sys.stderr)
    elif not job_id.created:
        print(f"job {job_id} holds unique key {args.unique_key!r}: nothing enqueued", file=sys.stderr)
    return 0


def read_payload(spec: str) -> bytes | str:
    """The payload argument: ``-`` reads stdin, ``@PATH`` a file (any size, bytes as they are), else it."""
    if spec == "-":
        return sys.stdin.buffer.read()
    if spec.startswith("@"):
        try:
            return Path(spec[1:]).read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read the payload from {spec[1:]!r}: {exc.strerror or exc}") from exc
    return spec


UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def delay_ms(value: str) -> int:
    """``--delay``: a number of seconds, or a number with a unit (250ms, 30s, 5m, 2h, 1d) → ms."""
    number, unit = value.strip(), "s"
    for suffix in sorted(UNITS_MS, key=len, reverse=True):
        if number.endswith(suffix):
            number, unit = number[: -len(suffix)].strip(), suffix
            break
    try:
        amount = float(number)
    except ValueError:
        amount = math.nan
    if not math.isfinite(amount) or amount < 0:
        raise argparse.ArgumentTypeError(
            f"expected a delay such as 30, 250ms, 30s, 5m, 2h or 1d, got {value!r}"
        )
    return round(amount * UNITS_MS[unit])


def at_ms(value: str) -> int:
    """``--at``: an ISO 8601 time (local time unless it has an offset or Z) or unix time in ms → unix ms."""
    text = value.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a time such as 2026-12-01T09:30 or 2026-12-01T09:30:00+01:00, "
            f"or unix time in ms, got {value!r}"
        ) from None
    return round(moment.astimezone().timestamp() * 1000)  # a naive time is local


def priority(value: str) -> int:
    """``--priority``: an integer from -1000 to 1000 (smaller runs first)."""
    try:
        level = int(value)
    except ValueError:
        level = PRIORITY_MAX + 1
    if not PRIORITY_MIN <= level <= PRIORITY_MAX:
        raise argparse.ArgumentTypeError(
            f"expected an integer from {PRIORITY_MIN} to {PRIORITY_MAX} (smaller runs first), got {value!r}"
        )
    return level


def cmd_job(args: argparse.Namespace) -> int:
    info = connect(args).job(args.queue, args.job_id, payload=True)  # the payload names a task job's call
    if info is None:
        raise CliError(f"no job {args.job_id!r} in queue {args.queue!r}")
    now = info.server_time
    call = call_text(info.payload, 100)
    rows: list[tuple[str, object]] = [("task", call)] if call is not None else []
    rows += [
        ("state", info.state or "(none)"),
        ("priority", info.priority),
        ("attempts", f"{info.attempts} claims in all; {info.tries} since enqueue or the last retry"),
        ("retries", info.retries),
        ("stalled", info.stalled),
        ("last error", info.last_error or ""),
        ("cancel requested", (info.cancel_reason or "yes") if info.cancel_requested else "no"),
        ("enqueued", when(now, info.enqueued_at)),
        ("claimed", when(now, info.claimed_at)),
        ("finished", when(now, info.finished_at)),
    ]
    if info.lease_left_ms is not None:
        left = info.lease_left_ms
        rows.append(("lease", f"{left} ms left" if left > 0 else f"lapsed {-left} ms ago"))
    for name, at in (("due", info.due_at), ("died", info.dead_at), ("row expires", info.expires_at)):
        if at is not None:
            rows.append((name, when(now, at)))
    if info.checkpoint_size is not None:
        extra = f", attempt {info.checkpoint_attempt}" if info.checkpoint_attempt is not None else ""
        saved = f", at {when(now, info.checkpoint_at)}" if info.checkpoint_at is not None else ""
        rows.append(("checkpoint", f"{info.checkpoint_size} bytes{extra}{saved}"))
    if info.progress is not None:
        rows.append(("progress", shown(info.progress)))
    if info.result is not None:
        rows.append(("result", f"{len(info.result)} bytes: {shown(info.result)}"))
    rows.append(("payload", f"{info.payload_size} bytes"))
    print(f"job {info.id} of queue {args.queue}")
    for name, value in rows:
        print(f"  {name:<17}{value}".rstrip())
    if info.traceback is not None:
        print("  traceback")
        for line in info.traceback.rstrip("\n").splitlines():
            print(f"    {line}")
    if args.payload and info.payload is not None:
        print(info.payload.decode("utf-8", "backslashreplace"))
    return 0


SHOWN = 60


def shown(value: bytes) -> str:
    """A stored value on one line: its first SHOWN characters, control characters escaped."""
    line = value.decode("utf-8", "backslashreplace")
    line = line.encode("unicode_escape").decode("ascii") if not line.isprintable() else line
    return line if len(line) <= SHOWN else line[:SHOWN] + "..."


def cmd_cancel(args: argparse.Namespace) -> int:
    try:
        outcome = connect(args).cancel(args.queue, args.job_id, args.reason)
    except JobGone as exc:
        raise CliError(f"no job {args.job_id!r} in queue {args.queue!r}") from exc
    explain = {
        "cancelled": "it was waiting: it will not run",
        "requested": "it is running: its handler hears of it at the next checkpoint",
        "finished": "it had already finished: nothing to do",
    }
    print(f"{outcome}: {explain[outcome]}")
    return 0


def cmd_dead(args: argparse.Namespace) -> int:
    client = connect(args)
    jobs = client.dead(args.queue, offset=args.offset, count=args.limit)
    counts = client.counts(args.queue)
    print(dead_heading(args.queue, counts.dead, len(jobs), args.offset))
    if not jobs:
        return 0
    now = counts.server_time
    calls = task_calls(client, args.queue, [job.id for job in jobs])
    rows = [["job", "task", "died", "attempts", "retries", "last error"]]
    for job in jobs:
        error = (job.last_error or "").replace("\n", " ")
        rows.append(
            [job.id, calls[job.id], ago(now, job.died_at), str(job.attempts), str(job.retries), error[:80]]
        )
    table(rows, sys.stdout)
    if args.traceback:
        for job in jobs:
            info = client.job(args.queue, job.id)
            if info is not None and info.traceback:
                print(f"\njob {job.id}: {info.last_error or ''}")
                for line in info.traceback.rstrip("\n").splitlines():
                    print(f"    {line}")
    return 0


def dead_heading(queue: str, total: int, shown: int, offset: int) -> str:
    """``dead 2 in queue mail (oldest first)``; the rows shown when they are not all of them."""
    if total == 0 and shown == 0:
        return f"no dead jobs in queue {queue}"
    head = f"dead {max(total, shown)} in queue {queue} (oldest first"
    if shown == 0:
        return f"{head}; none after the first {offset}: --offset)"
    if offset == 0 and shown >= total:
        return f"{head})"
    return f"{head}; {shown} shown from #{offset + 1}: --offset, --limit)"


def cmd_retry(args: argparse.Namespace) -> int:
    client = connect(args)
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
    print(f"purged {connect(args).purge_dead(args.queue, limit=args.limit)} dead jobs")
    return 0


def register(command: Command) -> None:
    p = command("enqueue", "add a job; prints its id", cmd_enqueue)
    p.add_argument("queue")
    p.add_argument("payload", help="the payload; - reads it from stdin, @PATH from a file (any size)")
    p.add_argument("--id", default=None, help="the job id (default: a new one)")
    p.add_argument(
        "--priority",
        type=priority,
        default=None,
        metavar="N",
        help="its level, -1000 to 1000: smaller runs first (default 0)",
    )
    p.add_argument(
        "--group",
        default=None,
        metavar="NAME",
        help="the job's group, whose active jobs the server counts (1 to 128 of A-Z a-z 0-9 -_.:@)",
    )
    p.add_argument(
        "--unique-key",
        default=None,
        metavar="KEY",
        help="one job per key: while a job holding KEY is pending or active, add none and print its id",
    )
    p.add_argument(
        "--unique-for",
        type=delay_ms,
        default=None,
        metavar="DELAY",
        help="hold the key this long whatever the job does (a throttle): 30s, 5m, ... (default: until done)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="with --unique-key: a pending holder gets this payload (debounce: the newest wins)",
    )
    when_group = p.add_mutually_exclusive_group()
    when_group.add_argument(
        "--delay",
        type=delay_ms,
        default=None,
        metavar="DELAY",
        help="claimable only after this long: seconds, or 250ms, 30s, 5m, 2h, 1d (server clock)",
    )
    when_group.add_argument(
        "--at",
        type=at_ms,
        default=None,
        metavar="TIME",
        help="claimable from this time: ISO 8601 (local unless it has an offset or Z), or unix ms",
    )

    p = command("job", "one job's status", cmd_job)
    p.add_argument("queue")
    p.add_argument("job_id")
    p.add_argument("--payload", action="store_true", help="print the payload too")

    from ._tasks import cmd_call, cmd_result

    p = command("call", "enqueue a call of a task by name (JSON arguments); prints its id", cmd_call)
    p.add_argument("task", metavar="TASK", help="the task's name, as @app.task named it")
    p.add_argument(
        "args", metavar="ARGS_JSON", nargs="?", default=None, help="positional arguments: '[2, 3]'"
    )
    p.add_argument("--kwargs", default=None, metavar="JSON", help='keyword arguments: \'{"to": "ada"}\'')
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--queue", "-q", default=None, help="the task's queue (default: 'default', or --app's)"
    )
    where.add_argument(
        "--app",
        default=None,
        metavar="MODULE:APP",
        help="the app defining the task: its queue, and the arguments checked against its signature",
    )
    p.add_argument("--id", default=None, help="the job id (default: a new one)")
    p.add_argument("--priority", type=priority, default=None, metavar="N", help="its level, -1000 to 1000")
    p.add_argument(
        "--delay", type=delay_ms, default=None, metavar="DELAY", help="claimable after: 30s, 5m, ..."
    )
    p.add_argument("--unique-key", default=None, metavar="KEY", help="one job per key (see enqueue)")
    p.add_argument(
        "--wait", type=float, default=None, metavar="S", help="wait up to S seconds and print its result"
    )

    p = command("result", "a job's result (a task's value, as JSON); waits with --wait", cmd_result)
    p.add_argument("queue")
    p.add_argument("job_id")
    p.add_argument(
        "--wait", type=float, default=None, metavar="S", help="wait up to S seconds for the job's end"
    )

    p = command("cancel", "request a cooperative cancel of a job", cmd_cancel)
    p.add_argument("queue")
    p.add_argument("job_id")
    p.add_argument("--reason", default=None, help="delivered to the handler's CancelToken")

    p = command("dead", "the dead jobs, oldest first, with their last errors", cmd_dead)
    p.add_argument("queue")
    p.add_argument("--limit", type=positive, default=20, help="jobs to list (default 20)")
    p.add_argument("--offset", type=int, default=0, help="skip this many (default 0)")
    p.add_argument("--traceback", action="store_true", help="print each job's stored traceback too")

    p = command("retry", "send dead or cancelled jobs back to pending with a fresh budget", cmd_retry)
    p.add_argument("queue")
    p.add_argument("job_ids", nargs="*", metavar="JOB")
    p.add_argument("--all", action="store_true", help="every job dead now")
    p.add_argument("--limit", type=positive, default=100, help="jobs per command with --all (default 100)")

    p = command("purge", "delete the dead jobs", cmd_purge)
    p.add_argument("queue")
    p.add_argument("--dead", action="store_true", help="the dead jobs and their rows")
    p.add_argument("--limit", type=positive, default=100, help="jobs per command (default 100)")
