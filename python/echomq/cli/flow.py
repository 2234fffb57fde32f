"""Flow control from the command line: ``echomq limit`` (a queue's rate limit and back-off)."""

from __future__ import annotations

import argparse

from .._protocol import RateLimit
from ._common import CliError, Command, connect, positive


def describe(limit: RateLimit, now_ms: int) -> list[str]:
    """The lines ``echomq limit`` and ``echomq inspect`` print about a queue's limit."""
    lines = []
    if limit.max is not None and limit.per_ms is not None and limit.window_ends_at is not None:
        left = max(limit.window_ends_at - now_ms, 0)
        lines.append(
            f"rate limit {limit.max} per {limit.per_ms} ms: {limit.used} claimed in this window "
            f"(this window ends in {left} ms)"
        )
    if limit.backoff_until is not None:
        lines.append(f"backed off: no claims for {max(limit.backoff_until - now_ms, 0)} ms more")
    return lines


def cmd_limit(args: argparse.Namespace) -> int:
    client = connect(args)
    if (args.rate is None) != (args.per is None):
        raise CliError("--rate and --per go together (e.g. --rate 50 --per 1000)")
    if args.off and args.rate is not None:
        raise CliError("--off removes the rate: give it without --rate/--per")
    if args.rate is not None:
        limit = client.set_rate_limit(args.queue, args.rate, args.per)
    elif args.off:
        limit = client.remove_rate_limit(args.queue)
    else:
        limit = client.rate_limit(args.queue)
    if args.backoff is not None:
        limit = client.back_off(args.queue, args.backoff)
    seconds, micros = client.redis.time()
    lines = describe(limit, int(seconds) * 1000 + int(micros) // 1000)
    print("\n".join(lines) if lines else "no rate limit, no back-off")
    return 0


def register(command: Command) -> None:
    p = command("limit", "show, set or remove the queue's rate limit; back it off", cmd_limit)
    p.add_argument("queue")
    p.add_argument("--rate", type=positive, default=None, metavar="MAX", help="at most MAX claims per window")
    p.add_argument("--per", type=positive, default=None, metavar="MS", help="the window, in ms (with --rate)")
    p.add_argument("--off", action="store_true", help="remove the rate limit")
    p.add_argument(
        "--backoff",
        type=int,
        default=None,
        metavar="MS",
        help="stop every claim for MS ms (0: lift a back-off)",
    )
