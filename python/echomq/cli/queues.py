"""A queue as a whole: inspect, sweep, reap, pause, resume, retention, obliterate."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any, cast

import redis

from .._protocol import SweepResult, text, wire
from .._scripts import library, load_refused
from .._sync.client import Client
from ..errors import QueueBusy
from ..keyspace import queue_keys
from ._common import (
    CliError,
    Command,
    connect,
    format_sweep,
    local_time,
    positive,
    require_module,
    seconds,
    stop_on_sigterm,
    table,
    task_calls,
)
from .flow import describe
from .groups import rows as group_rows


def backend_note(client: Client, queue: str) -> str:
    """How the verbs really reach this server: the module's commands, or Lua by FCALL or by EVALSHA."""
    rendering = client._render()  # the backend, asked once per client
    if rendering.name == "module":
        return "module (the emq module's EMQ.* commands)"
    if rendering.mode == "functions" and _library_loads(client, queue):
        name = library().name
        return f"scripts (Lua: the Functions library {name} run by FCALL; the server has no emq module)"
    return "scripts (Lua scripts run by EVALSHA: the server has no emq module, and FUNCTION LOAD is refused)"


def _library_loads(client: Client, queue: str) -> bool:
    """Does the queue's node have the verbs' library, or take it (as the client's first verb would)?"""
    r: Any = client.redis
    node = (
        {"target_nodes": r.get_node_from_key(queue_keys(queue).pending)}
        if hasattr(r, "get_node_from_key")
        else {}
    )
    name = library().name
    try:
        if r.execute_command("FUNCTION", "LIST", "LIBRARYNAME", name, **node):
            return True
    except redis.ResponseError:  # FUNCTION LIST refused: LOAD says it all
        pass
    try:
        r.execute_command("FUNCTION", "LOAD", library().source, **node)
    except redis.ResponseError as exc:
        return not load_refused(exc)  # "already exists": another client loaded it meanwhile
    return True


def inspect_partitioned(client: Client, queue: str, names: list[str]) -> int:
    """A partitioned queue as one logical queue, with a line per partition (docs/concepts/partitions.md)."""
    out = sys.stdout
    rows = [["partition", "node", "pending", "active", "delayed", "dead"]]
    totals = [0, 0, 0, 0]
    where = getattr(client.redis, "get_node_from_key", None)
    for name in names:
        counts = client.counts(name)
        node = where(queue_keys(name).base) if where is not None else None
        values = [counts.pending, counts.active, counts.delayed, counts.dead]
        totals = [t + v for t, v in zip(totals, values, strict=True)]
        rows.append([name, f"{node.host}:{node.port}" if node is not None else "-", *map(str, values)])
    pending, active, delayed, dead = totals
    out.write(f"queue {queue}  (partitioned: {len(names)} partitions)\n")
    out.write(f"  pending {pending}   active {active}   delayed {delayed}   dead {dead}\n")
    for line in describe(client.rate_limit(queue), client.counts(names[0]).server_time):
        out.write(f"  {line}\n")
    out.write("\n")
    table(rows, out)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    client = connect(args)
    require_module(client)
    if (names := client.partitions(args.queue)) != [args.queue]:
        return inspect_partitioned(client, args.queue, names)
    r, keys = client.redis, queue_keys(args.queue)
    counts = client.counts(args.queue)
    now, active = counts.server_time, counts.active
    out = sys.stdout
    paused = "  PAUSED (claims get nothing until 'echomq resume')" if counts.paused else ""
    out.write(f"queue {args.queue}  (server time {local_time(now)}){paused}\n")
    out.write(f"  backend {backend_note(client, args.queue)}\n")
    # dead is the dead set now; the metric counts every dead-lettering since the queue began
    out.write(
        f"  pending {counts.pending}   active {active}   dead {counts.dead}   "
        f"dead-lettered ever {counts.failed}\n"
    )
    out.write(
        f"  delayed {counts.delayed}   lapsed {counts.lapsed}   paused {'yes' if counts.paused else 'no'}\n"
    )
    if set(counts.by_priority) - {0}:  # pending by level, smaller first (0 is the default)
        by_level = counts.by_priority.items()
        levels = "   ".join(f"{level:+d}: {n}" if level else f"0: {n}" for level, n in by_level)
        out.write(f"  pending by priority   {levels}\n")
    if counts.stale:
        out.write(f"  tombstones {counts.stale} (cancelled jobs' entries; claims drop them)\n")
    for line in describe(client.rate_limit(args.queue), now):  # the window's use (issue 32)
        out.write(f"  {line}\n")
    from ..testing import schedule_problems  # (as check reads it) a cron the server's timer cannot go on with

    for line in schedule_problems(cast(redis.Redis, r), args.queue):
        out.write(f"  {line}\n")
    found = client.groups(args.queue)  # issue 45: each group's waiting, active against its cap
    if found:
        out.write("\ngroups\n")
        table(group_rows(found[: args.limit]), out)
        if len(found) > args.limit:
            out.write(f"  ... and {len(found) - args.limit} more (--limit)\n")
    waiting = client.pending(args.queue, count=min(args.limit, 10)) if counts.pending else []
    if waiting:  # the head of the line: what the next claims take
        out.write("\nnext to run\n")
        calls = task_calls(client, args.queue, [job.id for job in waiting])
        grouped = any(j.group for j in waiting)  # issue 45: a grouped job waits in its group's lane
        head = ["job", "task", "priority"] + (["group"] if grouped else [])
        rows = [[j.id, calls[j.id], str(j.priority)] + ([j.group or ""] if grouped else []) for j in waiting]
        table([head, *rows], out)
    leases = cast("list[tuple[bytes, float]]", r.zrange(keys.active, 0, args.limit - 1, withscores=True))
    if not leases:
        return 0
    out.write("\nactive\n")
    calls = task_calls(client, args.queue, [text(member) for member, _ in leases])
    rows = [["job", "task", "token", "lease left", "stalled", "cancel requested"]]
    for member, deadline in leases:
        row = r.hmget(keys.job(wire(member)), ["token", "stalled", "cancel_requested"])
        left = int(deadline) - now
        lapse = f"{left} ms" if left > 0 else f"lapsed {-left} ms ago"
        token, stalled, cancel = (text(v or b"") for v in row)
        rows.append([text(member), calls[text(member)], token, lapse, stalled or "0", cancel])
    table(rows, out)
    if active > len(leases):
        out.write(f"  ... and {active - len(leases)} more (--limit)\n")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    result = connect(args).sweep(args.queue, max_stalled=args.max_stalled, limit=args.limit)
    print(format_sweep(result))
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    from .._sync.reaper import Reaper

    def report(result: SweepResult) -> None:
        print(f"{time.strftime('%H:%M:%S')} {format_sweep(result)}", flush=True)

    client = connect(args)
    require_module(client)
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
    stopping = stop_on_sigterm()
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


def cmd_pause(args: argparse.Namespace) -> int:
    changed = connect(args).pause(args.queue)
    print("paused: claims get nothing until 'echomq resume'" if changed else "already paused")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    changed = connect(args).resume(args.queue)
    print("resumed: jobs are handed out again" if changed else "was not paused")
    return 0


def _ms(value: int) -> str:
    return "forever" if value < 0 else ("not kept" if value == 0 else f"{value} ms")


def cmd_retention(args: argparse.Namespace) -> int:
    policy = connect(args).retention(
        args.queue, done_ms=args.done, cancelled_ms=args.cancelled, dead_ms=args.dead
    )
    print(f"done {_ms(policy.done_ms)}   cancelled {_ms(policy.cancelled_ms)}   dead {_ms(policy.dead_ms)}")
    return 0


def cmd_obliterate(args: argparse.Namespace) -> int:
    client = connect(args)
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


def cmd_check(args: argparse.Namespace) -> int:
    """Where the queue breaks the invariants the verbs keep (echomq.testing.queue_problems): ids in
    no set or two, the tombstone count, orphan unique keys.  Reads every member and row: a tool for
    a suspicion, not for a busy queue's every minute."""
    from ..testing import queue_problems  # its server helpers are needed by no other command

    # A cluster client scans every node and pipelines by slot: the same calls serve it.
    problems = queue_problems(cast(redis.Redis, connect(args).redis), args.queue)
    for problem in problems:
        print(problem)
    if problems:
        print(f"queue {args.queue}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"queue {args.queue}: no problems found")
    return 0


def register(command: Command) -> None:
    p = command("inspect", "counts, deaths and the active jobs' leases", cmd_inspect)
    p.add_argument("queue")
    p.add_argument("--limit", type=positive, default=20, help="active jobs to list (default 20)")

    p = command("check", "the queue's broken invariants, orphan unique keys among them", cmd_check)
    p.add_argument("queue")

    for name, helptext, func in (
        ("sweep", "sweep once", cmd_sweep),
        ("reap", "run the reaper until Ctrl-C", cmd_reap),
    ):
        p = command(name, helptext, func)
        p.add_argument("queue")
        p.add_argument("--max-stalled", type=positive, default=1, help="stalls before dead (default 1)")
        p.add_argument("--limit", type=positive, default=100, help="jobs per sweep (default 100)")
        if name == "reap":
            p.add_argument("--interval", type=seconds, default=1.0, help="seconds between sweeps")
            p.add_argument("--duration", type=seconds, default=None, help="stop after this many seconds")

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
    p.add_argument("--limit", type=positive, default=100, help="keys per command (default 100)")
