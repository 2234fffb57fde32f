"""The layout page (docs/development.md) names the files that exist.

The project's brief lays the module out as module/emq.c (loading and the
one command table) beside its concept files; the page's table is where a
reader looks a file up, so every path it names must exist, and every C
file of the module must be named there.
"""

from __future__ import annotations

import re

import pytest

from ..examples import DOCS, ROOT

pytestmark = pytest.mark.once

PAGE = (DOCS / "development.md").read_text()
LAYOUT = PAGE.split("## Layout", 1)[1].split("\n## ", 1)[0]


def named_paths() -> set[str]:
    """Every path in the first column of the layout table (``a``, ``b/c.h`` and ``d.c``'s siblings)."""
    found: set[str] = set()
    for line in LAYOUT.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        names = re.findall(r"`([^`]+)`", cell)
        folder = ""
        for name in names:
            if "/" in name:
                folder = name.rsplit("/", 1)[0] + "/" if not name.endswith("/") else name
                found.add(name.rstrip("/"))
            else:
                found.add(folder + name)  # `module/emq_meta.c`, `emq_meta.h`: the same folder
    return found


def test_every_path_on_the_layout_page_exists() -> None:
    missing = sorted(p for p in named_paths() if not (ROOT / p).exists())
    assert not missing, f"docs/development.md names files that do not exist: {missing}"


def test_every_module_source_is_on_the_layout_page() -> None:
    named = named_paths()
    sources = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "module").glob("*.[ch]"))
    assert [s for s in sources if s not in named] == []


def test_the_entry_point_is_module_emq_c() -> None:
    """OnLoad and the one command table live in module/emq.c, the brief's name."""
    entry = (ROOT / "module" / "emq.c").read_text()
    assert "RedisModule_OnLoad" in entry and "static const EmqCommand commands[]" in entry
    others = [p.name for p in (ROOT / "module").glob("*.c") if p.name != "emq.c"]
    assert not [
        name
        for name in others
        if "RedisModule_OnLoad(" in (ROOT / "module" / name).read_text()
        and name not in ("memcheck_canary.c", "meta_probe.c")
    ]


def test_every_python_module_is_on_the_layout_page() -> None:
    """A file of the package is named itself, or its package folder is (``python/echomq/tasks/``)."""
    named = named_paths()
    package = ROOT / "python" / "echomq"
    unnamed = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        inside = [p for p in path.parents if p != package and package in p.parents]
        folders = [p.relative_to(ROOT).as_posix() for p in inside]
        if path.name == "__init__.py" and path.parent == package:
            continue  # the public names: every page says them
        if rel not in named and not any(f in named for f in folders):
            unnamed.append(rel)
    assert unnamed == [], f"docs/development.md's layout does not name: {unnamed}"
