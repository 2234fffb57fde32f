"""Jobs one by one: enqueue, job, cancel, and the dead: dead, retry, purge."""

from __future__ import annotations

import argparse
import sys

from ..errors import JobGone, NotRetryable
from ._common import CliError, Command, ago, connect, positive, table


def cmd_enqueue(args: argparse.Namespace) -> int:
    print(connect(args).enqueue(args.queue, args.payload, job_id=args.id))
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    info = connect(args).job(args.queue, args.job_id, payload=args.payload)
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
        ("enqueued", f"{info.enqueued_at}  ({ago(now, info.enqueued_at)})" if info.enqueued_at else ""),
        ("claimed", f"{info.claimed_at}  ({ago(now, info.claimed_at)})" if info.claimed_at else ""),
        ("finished", f"{info.finished_at}  ({ago(now, info.finished_at)})" if info.finished_at else ""),
    ]
    if info.lease_left_ms is not None:
        left = info.lease_left_ms
        rows.append(("lease", f"{left} ms left" if left > 0 else f"lapsed {-left} ms ago"))
    if info.due_at is not None:
        rows.append(("due", f"{info.due_at}  ({ago(now, info.due_at)})"))
    if info.dead_at is not None:
        rows.append(("died", f"{info.dead_at}  ({ago(now, info.dead_at)})"))
    if info.expires_at is not None:
        rows.append(("row expires", f"{info.expires_at}  ({ago(now, info.expires_at)})"))
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
    print(f"dead {counts.dead} in queue {args.queue} (oldest first; showing {len(jobs)} from {args.offset})")
    if not jobs:
        return 0
    now = counts.server_time
    rows = [["job", "died", "attempts", "retries", "last error"]]
    for job in jobs:
        error = (job.last_error or "").replace("\n", " ")
        rows.append([job.id, ago(now, job.died_at), str(job.attempts), str(job.retries), error[:80]])
    table(rows, sys.stdout)
    return 0


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
    p.add_argument("payload")
    p.add_argument("--id", default=None, help="the job id (default: a new one)")

    p = command("job", "one job's status", cmd_job)
    p.add_argument("queue")
    p.add_argument("job_id")
    p.add_argument("--payload", action="store_true", help="print the payload too")

    p = command("cancel", "request a cooperative cancel of a job", cmd_cancel)
    p.add_argument("queue")
    p.add_argument("job_id")
    p.add_argument("--reason", default=None, help="delivered to the handler's CancelToken")

    p = command("dead", "the dead jobs, oldest first, with their last errors", cmd_dead)
    p.add_argument("queue")
    p.add_argument("--limit", type=positive, default=20, help="jobs to list (default 20)")
    p.add_argument("--offset", type=int, default=0, help="skip this many (default 0)")

    p = command("retry", "send dead or cancelled jobs back to pending with a fresh budget", cmd_retry)
    p.add_argument("queue")
    p.add_argument("job_ids", nargs="*", metavar="JOB")
    p.add_argument("--all", action="store_true", help="every job dead now")
    p.add_argument("--limit", type=positive, default=100, help="jobs per command with --all (default 100)")

    p = command("purge", "delete the dead jobs", cmd_purge)
    p.add_argument("queue")
    p.add_argument("--dead", action="store_true", help="the dead jobs and their rows")
    p.add_argument("--limit", type=positive, default=100, help="jobs per command (default 100)")
