"""Django 6.0's own ``django.tasks`` on Python 3.12: the venv that tests/integrations/test_django.py
runs itself in.

The suite's own venv has the ``django-tasks`` backport (Django 5.2 on Python
3.11); Django 6.0 needs Python 3.12.  As tests/compat/run.py does for its
combinations, a venv of its own is made under ``.compat/venvs/`` from pyenv's
(or PATH's) python3.12 and kept between runs (a stamp names what was
installed); Django 6.0, the test tools and echomq's other dependencies come
from the package index.  echomq itself is not installed: the run puts this
tree's ``python/`` first on ``sys.path``, so it tests the code as it is now.

    python -m tests.compat.django6      make (or reuse) the venv; print its python or why not
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from .run import HOME, OTHER_DEPENDENCIES, TEST_TOOLS, find_python, run

PYTHON = "3.12"
DJANGO = "Django>=6.0,<6.1"
VENV = HOME / "venvs" / f"django6-py{PYTHON}"
LOG = HOME / "logs" / f"django6-py{PYTHON}.log"


def prepare() -> tuple[Path | None, str]:
    """The venv's python, made if need be, or None and why it cannot be had (for a skip's reason)."""
    interpreter = find_python(PYTHON)
    if interpreter is None:
        return None, f"no python{PYTHON} on this machine (pyenv's versions, or PATH)"
    LOG.parent.mkdir(parents=True, exist_ok=True)
    python = VENV / "bin" / "python"
    wanted = [DJANGO, *TEST_TOOLS, "redis>=5.0.1", *OTHER_DEPENDENCIES]
    stamp = VENV / ".django6-installed"
    if stamp.is_file() and stamp.read_text() == json.dumps(wanted) and python.is_file():
        return python, ""
    shutil.rmtree(VENV, ignore_errors=True)
    LOG.write_text("")
    if run([interpreter, "-m", "venv", str(VENV)], LOG) != 0:
        return None, f"python{PYTHON} could not make a venv (see {LOG})"
    if run([str(python), "-m", "pip", "install", "-q", *wanted], LOG) != 0:
        return None, f"pip could not install {DJANGO} and the test tools (see {LOG})"
    stamp.write_text(json.dumps(wanted))
    return python, ""


if __name__ == "__main__":
    found, why = prepare()
    print(found if found is not None else f"not made: {why}")
    sys.exit(0 if found is not None else 1)
