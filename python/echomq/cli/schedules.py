"""Schedules: echomq schedule add | list | remove (docs/concepts/schedules.md)."""

from __future__ import annotations

import argparse
import sys

from ..schedules import MISSED_CHOICES, ScheduleInfo, when_text
from ..tasks.envelope import task_name
from ._common import Command, connect, global_options, table
from .jobs import at_ms, delay_ms, read_payload


def cmd_add(args: argparse.Namespace) -> int:
    info = connect(args).schedule(
        args.queue,
        args.name,
        cron=args.cron,
        every_ms=args.every,
        payload=read_payload(args.payload),
        tz=args.tz,
        start_at=args.start,
        end_at=args.end,
        missed=args.missed,
    )
    print(f"{info.name}: next tick {when_text(info.next_ms, info.schedule.tz)}")
    return 0


def _when(info: ScheduleInfo) -> str:
    s = info.schedule
    return f"cron {s.cron}" if s.cron is not None else f"every {s.every_ms} ms"


def cmd_list(args: argparse.Namespace) -> int:
    found = connect(args).schedules(args.queue)
    if not found:
        print(f"no schedules in {args.queue!r}")
        return 0
    rows = [["NAME", "TASK", "WHEN", "TZ", "MISSED", "NEXT TICK", "LAST TICK", "FIRED"]]
    for info in found:
        s = info.schedule
        rows.append(
            [
                info.name,
                task_name(s.payload) or "-",  # a task's schedule (@app.task(cron=...)), else a raw payload
                _when(info),
                s.tz,
                s.missed,
                when_text(info.next_ms, s.tz),
                when_text(info.last_ms, s.tz),
                str(info.fired),
            ]
        )
    table(rows, sys.stdout)
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    if connect(args).unschedule(args.queue, args.name):
        print(f"removed {args.name!r} (the jobs it enqueued stay)")
        return 0
    print(f"no schedule {args.name!r} in {args.queue!r}", file=sys.stderr)
    return 1


def register(command: Command) -> None:
    p = command(
        "schedule", "a job on every tick of a cron expression or a period: add, list, remove", cmd_list
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, helptext: str, func: object) -> argparse.ArgumentParser:
        sp = actions.add_parser(name, help=helptext, allow_abbrev=False)
        global_options(sp, defaults=False)
        sp.set_defaults(func=func)
        return sp

    sp = action("add", "add or replace a schedule (its cursor is kept: no tick runs twice)", cmd_add)
    sp.add_argument("queue")
    sp.add_argument("name", help="1 to 128 of A-Z a-z 0-9 _ . : - (each tick's job id is NAME@<tick ms>)")
    when = sp.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="a cron expression: 5 fields, or 6 with seconds first")
    when.add_argument(
        "--every", type=delay_ms, metavar="PERIOD", help="a fixed period: seconds, or 250ms, 30s, 5m, 2h, 1d"
    )
    sp.add_argument("--payload", default="", help="each job's payload; - reads stdin, @PATH a file")
    sp.add_argument("--tz", default="UTC", help="the cron's IANA time zone (default UTC)")
    sp.add_argument("--start", type=at_ms, metavar="TIME", help="no tick before: ISO 8601 or unix ms")
    sp.add_argument("--end", type=at_ms, metavar="TIME", help="no tick after: ISO 8601 or unix ms")
    sp.add_argument(
        "--missed",
        choices=MISSED_CHOICES,
        default="skip",
        help="ticks missed while no driver ran: skip (none runs), one (the latest), all (default skip)",
    )

    sp = action("list", "the queue's schedules: when, next and last tick, jobs fired", cmd_list)
    sp.add_argument("queue")

    sp = action("remove", "remove a schedule (its jobs stay)", cmd_remove)
    sp.add_argument("queue")
    sp.add_argument("name")
