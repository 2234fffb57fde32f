"""Flow control's numbers (issue 32): the rate 8 workers get under a rate limit, and what the
limit costs a claim on the server.

    .venv/bin/python bench/run.py --only flow [--quick]     (also part of `make bench`)
    .venv/bin/python bench/flow.py [--quick]                (the same, alone)

Each measurement gets a fresh redis-server of its own (echomq.testing.EmbeddedServer, emq.so
loaded) on loopback:

a. Observed rate: 8 ``echomq.Worker``s (threads, one slot each, a handler that returns at
   once) on one queue of jobs under ``set_rate_limit(q, 200, 1000)`` for a few seconds.  The
   rows' ``claimed_at`` (the server's clock at each claim) grouped by the server's windows:
   the most in any window (must never pass 200), the mean of the whole windows, and the
   commands the server ran per second meanwhile.
b. Server time per claim: ``INFO commandstats`` usec_per_call of EMQ.CLAIM (COUNT 1) over N
   claims, without a limit and with one that never binds (``RATE 1000000000 PER 86400000``:
   the read and the count's write are paid, the refusal never).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import echomq  # noqa: E402
from echomq.keyspace import queue_keys  # noqa: E402
from echomq.testing import EmbeddedServer  # noqa: E402

Q = "flow"
MAX, PER_MS, WORKERS = 200, 1000, 8


def observed_rate(seconds: float) -> dict[str, Any]:
    with EmbeddedServer() as server:
        r = server.client()
        client = echomq.Client(r)
        jobs = int(MAX * (seconds + 2))
        client.enqueue_many(Q, [(f"j{i}", b"") for i in range(jobs)])
        client.set_rate_limit(Q, MAX, PER_MS)
        r.config_resetstat()
        workers = [
            echomq.Worker(
                echomq.Client(server.client()), Q, lambda ctx: None, concurrency=1, poll_interval=0.05
            )
            for _ in range(WORKERS)
        ]
        for w in workers:
            w.start()
        time.sleep(seconds)
        for w in workers:
            w.stop()
        stats = r.info("commandstats")
        commands = sum(int(v["calls"]) for v in stats.values())
        k = queue_keys(Q)
        pipe = r.pipeline(transaction=False)
        for i in range(jobs):
            pipe.hget(k.job(f"j{i}"), "claimed_at")
        at = [int(v) for v in pipe.execute() if v is not None]
        windows = Counter(t // PER_MS for t in at)
        ordered = sorted(windows)
        whole = [windows[w] for w in ordered[1:-1]]  # the first and last windows are cut by the run
        return {
            "claimed": len(at),
            "windows": len(windows),
            "max_in_a_window": max(windows.values()),
            "whole_windows": len(whole),
            "mean_whole_window": sum(whole) / len(whole) if whole else 0.0,
            "min_whole_window": min(whole) if whole else 0,
            "commands_per_s": commands / seconds,
            "seconds": seconds,
        }


def claim_cost(claims: int, limited: bool, module: str | None = None) -> float:
    with EmbeddedServer(module=module) as server:
        r = server.client()
        client = echomq.Client(r)
        for start in range(0, claims, 10_000):
            client.enqueue_many(Q, [(f"j{i}", b"") for i in range(start, min(start + 10_000, claims))])
        if limited:
            client.set_rate_limit(Q, 1_000_000_000, 86_400_000)
        k = queue_keys(Q)
        r.config_resetstat()
        pipe = r.pipeline(transaction=False)
        for _ in range(claims):
            pipe.execute_command("EMQ.CLAIM", k.pending, k.active, k.base, 60_000)
        replies = pipe.execute()
        assert all(replies), "every claim takes a job"
        return float(r.info("commandstats")["cmdstat_emq.claim"]["usec_per_call"])


def run(quick: bool, baseline: str | None = None) -> dict[str, Any]:
    """The rate, then each claim cost three times, interleaved (the median is reported: the
    machine is shared)."""
    claims = 20_000 if quick else 100_000
    costs: dict[str, list[float]] = {"usec_no_limit": [], "usec_limit": [], "usec_baseline": []}
    for _ in range(3):
        costs["usec_no_limit"].append(claim_cost(claims, False))
        costs["usec_limit"].append(claim_cost(claims, True))
        if baseline:
            costs["usec_baseline"].append(claim_cost(claims, False, baseline))
    res: dict[str, Any] = {
        "rate": observed_rate(4.0 if quick else 20.0),
        "claims": claims,
        "baseline": baseline,
    }
    for name, values in costs.items():
        res[name] = statistics.median(values) if values else None
    return res


def markdown(res: dict[str, Any], command: str) -> str:
    rate = res["rate"]
    baseline = ""
    if res["usec_baseline"] is not None:
        baseline = f"| before flow control (`{res['baseline']}`) | {res['usec_baseline']:.2f} |\n"
    return f"""## Flow control: a rate limit (issue 32)

`{command}`

{WORKERS} workers (one slot each) under `set_rate_limit(q, {MAX}, {PER_MS})` for
{rate["seconds"]:.0f} s: {rate["claimed"]} jobs claimed in {rate["windows"]} windows of the server's
clock; **at most {rate["max_in_a_window"]} in any window** (the limit: {MAX}); the
{rate["whole_windows"]} whole windows held {rate["mean_whole_window"]:.1f} on average (fewest
{rate["min_whole_window"]}); the server ran {rate["commands_per_s"]:.0f} commands a second
meanwhile (claims, completes, extends, sweeps: the workers wait on the server between windows).

| EMQ.CLAIM (COUNT 1), {res["claims"]} claims, median of 3 servers each | server µs per claim |
|---|---|
{baseline}| no limit | {res["usec_no_limit"]:.2f} |
| a limit that never binds (`RATE 1000000000 PER 86400000`) | {res["usec_limit"]:.2f} |
"""


def main_section(quick: bool, command: str, baseline: str | None = None) -> int:
    res = run(quick, baseline)
    print(markdown(res, command))
    ok = res["rate"]["max_in_a_window"] <= MAX
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a verdict")
    parser.add_argument(
        "--baseline-module", metavar="EMQ_SO", help="also the claim cost on this emq.so (e.g. main's)"
    )
    args = parser.parse_args(argv)
    command = ".venv/bin/python bench/flow.py " + " ".join(argv if argv is not None else sys.argv[1:])
    return main_section(args.quick, command.strip(), args.baseline_module)


if __name__ == "__main__":
    sys.exit(main())
