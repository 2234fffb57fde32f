"""The task API is typed for ``mypy --strict`` users (issue 29): ``enqueue`` by the function's own
signature (ParamSpec), ``result()`` by its return type, for plain and ``async def`` tasks, sync and
asyncio apps.  A right use passes; each wrong one is reported where it is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parents[2]

USES = """
from __future__ import annotations

import echomq
import echomq.asyncio as emq

app = echomq.App(echomq.Client.from_url("redis://127.0.0.1:1/0"))


@app.task(queue="mail", max_attempts=3)
def send(to: str, *, subject: str = "") -> dict[str, int]:
    return {to: len(subject)}


@app.task
async def fetch(url: str) -> bytes:
    return url.encode()


def right() -> None:
    handle: echomq.TaskHandle[dict[str, int]] = send.enqueue("ada", subject="hi")
    sent: dict[str, int] = handle.result(timeout=1.0)
    data: bytes = fetch.enqueue("https://example.com").result()
    send.options(job_id="j", delay_ms=5, priority=-1).enqueue("bob")
    anything = app.enqueue("send", "carol", subject=3)  # by name: not checked, Any
    print(sent, data, anything.id)


def wrong() -> None:
    send.enqueue(1)  # WRONG-ARG
    send.enqueue("ada", subjct="hi")  # WRONG-KWARG
    name: str = send.enqueue("ada").result()  # WRONG-RESULT
    send.options(delay="5").enqueue("ada")  # WRONG-OPTION


@app.task
def length(text: str) -> int:
    return len(text)


def flows_right() -> None:
    from echomq.tasks import chain, chord, group

    n: int = app.enqueue_flow(chain(send.s("ada"), length.s())).result(timeout=1.0)
    many: list[int] = app.enqueue_flow(group(length.s("a"), length.s("b"))).result()
    one: int = app.enqueue_flow(chord(group(length.s("a")), length.s())).result()
    print(n, many, one)


def flows_wrong() -> None:
    from echomq.tasks import chain, group

    text: str = app.enqueue_flow(chain(send.s("ada"), length.s())).result()  # WRONG-CHAIN
    texts: list[str] = app.enqueue_flow(group(length.s("a"))).result()  # WRONG-GROUP
    print(text, texts)


aapp = emq.App(emq.Client.from_url("redis://127.0.0.1:1/0"))


@aapp.task
async def double(x: int) -> int:
    return 2 * x


async def async_right() -> int:
    handle = await double.enqueue(2)
    return await handle.result(timeout=1.0)


async def async_flow() -> int:
    from echomq.tasks import chain

    return await (await aapp.enqueue_flow(chain(double.s(1), double.s()))).result()


async def async_wrong() -> str:
    return await (await double.enqueue("2")).result()  # WRONG-ASYNC
"""


def test_the_task_api_types_arguments_and_results_under_mypy_strict(tmp_path: Path) -> None:
    path = tmp_path / "uses.py"
    path.write_text(USES)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-version", "3.10",
         "--config-file", os.devnull, str(path)],
        cwd=tmp_path, env=dict(os.environ, MYPYPATH=str(ROOT / "python")), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    lines = USES.splitlines()
    flagged = {int(m.group(1)) for m in re.finditer(r"uses\.py:(\d+): error", done.stdout)}
    expected = {n for n, line in enumerate(lines, 1) if "# WRONG" in line}
    assert flagged == expected, done.stdout
