"""The Python examples of README.md and docs/ pass ``mypy --strict`` as written (issue 15).

Each ```python block becomes a module of its own, the ones marked
``<!-- not run: ... -->`` too (for them this is the check that remains); one
mypy run checks them all against the package in ``python/``.  A user copying
an example must not meet ``Item "None" of "Job | None" has no attribute "id"``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..examples import ROOT, all_blocks

pytestmark = pytest.mark.once


def test_every_python_example_passes_mypy_strict(tmp_path: Path) -> None:
    blocks = all_blocks("python")
    assert len(blocks) >= 10
    files, where = [], {}
    for n, block in enumerate(blocks):
        path = tmp_path / f"example_{n}.py"
        path.write_text(block.code)
        files.append(str(path))
        where[path.name] = block.where
    env = dict(os.environ, MYPYPATH=str(ROOT / "python"))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-version", "3.10",
         "--config-file", os.devnull, *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    report = done.stdout.replace(str(tmp_path) + os.sep, "")
    for name, place in sorted(where.items(), key=lambda item: -len(item[0])):  # example_10 before _1
        report = report.replace(name, place)
    assert done.returncode == 0, f"mypy --strict on the documentation's examples:\n{report}"
