"""The README's Python examples pass ``mypy --strict`` as written (issue 15).

Each ```python block of README.md becomes a module of its own; one mypy run
checks them all against the package in ``python/``.  A user copying an
example must not meet ``Item "None" of "Job | None" has no attribute "id"``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_python_examples() -> None:
    assert len(python_blocks()) >= 4


def test_every_python_example_passes_mypy_strict(tmp_path: Path) -> None:
    files = []
    for n, block in enumerate(python_blocks()):
        path = tmp_path / f"readme_example_{n}.py"
        path.write_text(block)
        files.append(str(path))
    env = dict(os.environ, MYPYPATH=str(ROOT / "python"))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-version", "3.10",
         "--config-file", os.devnull, *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    report = done.stdout.replace(str(tmp_path) + os.sep, "")
    assert done.returncode == 0, f"mypy --strict on the README's examples:\n{report}"
