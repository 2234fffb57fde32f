"""Groups from the command line: ``echomq group list|limit|pause|resume`` (issue 45)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._protocol import GroupInfo
from ._common import CliError, Command, connect, global_options, positive, table


def describe(info: GroupInfo) -> str:
    """One group in a line: what ``limit``, ``pause`` and ``resume`` print."""
    cap = f"of max {info.max_active}" if info.max_active is not None else "(no cap)"
    paused = ", paused" if info.paused else ""
    return f"group {info.name}: {info.active} active {cap}, {info.waiting} waiting{paused}"


def rows(found: list[GroupInfo]) -> list[list[str]]:
    """The table ``group list`` and ``inspect`` print."""
    out = [["GROUP", "WAITING", "ACTIVE", "MAX", "PAUSED"]]
    for g in found:
        cap = "-" if g.max_active is None else str(g.max_active)
        out.append([g.name, str(g.waiting), str(g.active), cap, "yes" if g.paused else "no"])
    return out


def as_json(info: GroupInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "waiting": info.waiting,
        "active": info.active,
        "max_active": info.max_active,
        "paused": info.paused,
    }


def cmd_list(args: argparse.Namespace) -> int:
    found = connect(args).groups(args.queue)
    if args.json:
        print(json.dumps([as_json(g) for g in found]))
    elif not found:
        print(f"no groups in {args.queue!r}")
    else:
        table(rows(found), sys.stdout)
    return 0


def cmd_limit(args: argparse.Namespace) -> int:
    client = connect(args)
    if args.max is not None and args.no_max:
        raise CliError("--max sets the cap and --no-max removes it: give one")
    try:
        if args.max is not None or args.no_max:
            info = client.set_group_limit(args.queue, args.group, max_active=args.max)
        else:
            info = client.group(args.queue, args.group)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    print(describe(info))
    return 0


def _pause_or_resume(args: argparse.Namespace, pause: bool) -> int:
    client = connect(args)
    verb = client.pause_group if pause else client.resume_group
    try:
        info = verb(args.queue, args.group)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    print(describe(info))
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    return _pause_or_resume(args, pause=True)


def cmd_resume(args: argparse.Namespace) -> int:
    return _pause_or_resume(args, pause=False)


def register(command: Command) -> None:
    p = command("group", "a queue's groups: list them, cap one, pause or resume one", cmd_list)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, helptext: str, func: object) -> argparse.ArgumentParser:
        sp = actions.add_parser(name, help=helptext, allow_abbrev=False)
        global_options(sp, defaults=False)
        sp.set_defaults(func=func)
        sp.add_argument("queue")
        return sp

    sp = action("list", "every group with a job waiting or active, a cap or a pause", cmd_list)
    sp.add_argument("--json", action="store_true", help="one JSON array of the groups")
    sp = action("limit", "show, set (--max) or remove (--no-max) a group's cap on its active jobs", cmd_limit)
    sp.add_argument("group")
    sp.add_argument("--max", type=positive, default=None, metavar="N", help="at most N of its jobs active")
    sp.add_argument("--no-max", action="store_true", help="remove the group's cap")
    sp = action("pause", "hold back a group's waiting jobs (its active ones run on)", cmd_pause)
    sp.add_argument("group")
    sp = action("resume", "let a paused group's jobs be claimed again", cmd_resume)
    sp.add_argument("group")
