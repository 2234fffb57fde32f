"""Bytes per job, a task job against a raw job with the same arguments (issue 29): waiting, and done.

    .venv/bin/python bench/task_bytes.py [--engine redis|valkey] [--jobs 20000]

A raw job's payload is the arguments as a JSON object; a task job's is the task header and
the arguments as ``[[args],{kwargs}]``.  Memory is ``used_memory``'s growth over ``--jobs``
waiting jobs (default ids), on a fresh server each; then the same jobs done (claimed and completed:
the raw job without a result, the task job with its ``json\nnull`` result), over the empty server.
"""

from __future__ import annotations

import argparse
import json

import echomq
from echomq import _protocol as proto
from echomq.testing import EmbeddedServer

ARGS = ("ada@example.com",)
KWARGS = {"subject": "welcome", "template": "signup-v2"}


def measure(kind: str, jobs: int, binary: str | None) -> tuple[int, float, float]:
    with EmbeddedServer(binary=binary) as server:
        r = server.client()
        client = echomq.Client(r)
        app = echomq.App(client, queue="bench")

        @app.task
        def send_mail(to: str, subject: str, template: str) -> None: ...

        raw = json.dumps({"to": ARGS[0], **KWARGS}, separators=(",", ":")).encode()
        size = len(raw) if kind == "raw" else len(send_mail.payload(ARGS, KWARGS))
        before = int(r.info("memory")["used_memory"])
        for _ in range(jobs):
            if kind == "raw":
                client.enqueue("bench", raw)
            else:
                send_mail.enqueue(*ARGS, **KWARGS)
        after = int(r.info("memory")["used_memory"])
        result = b"json\nnull" if kind == "task" else None
        while batch := client.claim_many("bench", 60_000, 100):
            pipe = r.pipeline(transaction=False)
            for job in batch:  # EMQ.COMPLETE as client.complete sends it, pipelined
                call = proto.complete("bench", job.id, job.token, result)
                pipe.execute_command(*call.args)
            pipe.execute()
        done = int(r.info("memory")["used_memory"])
        return size, (after - before) / jobs, (done - before) / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--binary", default=None, help="the server binary (default: the testing default)")
    args = parser.parse_args()
    for kind in ("raw", "task"):
        size, waiting, done = measure(kind, args.jobs, args.binary)
        print(f"{kind:<5} payload {size:>3} B  {waiting:7.1f} B per waiting job  {done:7.1f} B per done job")


if __name__ == "__main__":
    main()
