"""The house's layers, checked from the code's imports (issue 40): nothing imports upward, no cycles.

Every import counts: at the top of a module, deferred into a function (it hides a cycle
from the interpreter, not from the design) and under ``TYPE_CHECKING``.  The layers,
bottom first (docs/development.md draws the same map):

0. the rules without I/O: ``_protocol``, ``_runtime``, the errors, the keyspace, the retry
   policy, cancellation, schedules' rules (``echomq.schedules``), logging, the module's path,
   a task's serializers, its stored result and the rules of a wait for it (``_serializers``,
   ``_results``: a client reads results too);
1. the drivers over them: the sync driver and its asyncio twin (``echomq.asyncio``), which
   are siblings: neither imports the other, what both need lives in layer 0 (or in the
   shared driver helpers listed in ``SHARED``);
2. the capabilities over the drivers: tasks, metrics, the integrations (``contrib``);
3. the tools on top: the CLI, the dashboard, the demo, and the package's public face.

``KNOWN_CYCLES`` and ``KNOWN_UPWARD`` are the debts found when this test was written; the
test fails when one appears that is not listed, and when a listed one is paid (so the list
only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.once

PACKAGE = Path(__file__).resolve().parents[2] / "python"

CORE = (
    "echomq._protocol", "echomq._runtime", "echomq.errors", "echomq.keyspace", "echomq.retry",
    "echomq.cancel", "echomq.schedules", "echomq._log", "echomq._module_so", "echomq._version",
    # a task's serializers, its stored result and the wait's rules: a client reads results too
    "echomq._serializers", "echomq._results",
)  # fmt: skip
SYNC = (
    "echomq._sync",
    # the sync driver's public faces, each its _sync twin's names
    "echomq.client", "echomq.worker", "echomq.lease", "echomq.context", "echomq.reaper",
)  # fmt: skip
# Driver helpers both drivers use that belong to neither: redis-py as both use it, the deadline
# watch (one thread per process over the core's HeldJob), the scripts backend's Lua and its
# loader, the embedded server for tests and demos; the wait for a job's end, over either client;
# the child processes of isolation="process" (a thread of each worker waits on its child).
SHARED = (
    "echomq._redis", "echomq._scripts", "echomq._watch", "echomq.scripts", "echomq.testing",
    "echomq._result_wait", "echomq.isolation",
)  # fmt: skip
ASYNC = ("echomq.asyncio",)  # its package's __init__ is the asyncio public face: a tool (below)
CAPABILITIES = ("echomq.tasks", "echomq.metrics", "echomq.contrib")
TOOLS = ("echomq.cli", "echomq.dashboard", "echomq._demo", "echomq.__main__", "echomq")
FACES = ("echomq", "echomq.asyncio")  # the public names: every layer's, re-exported


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def owner(module: str, groups: tuple[str, ...]) -> bool:
    return any(module == g or module.startswith(g + ".") for g in groups if g != "echomq") or (
        "echomq" in groups and module == "echomq"
    )


def layer(module: str) -> int:
    if module in FACES:
        return 3
    for number, groups in enumerate((CORE, SYNC + SHARED + ASYNC, CAPABILITIES, TOOLS)):
        if owner(module, groups):
            return number
    raise AssertionError(f"{module} is in no layer: name its layer in tests/house/test_layers.py")


def imports(found: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of the package's own modules (every kind of import, see the docstring)."""
    out: dict[str, set[str]] = {}
    for name, path in found.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = package[: len(package) - (node.level - 1)]
                    base = ".".join([*here, *([node.module] if node.module else [])])
                # ``from pkg import sub`` imports the submodule; ``from pkg import name``, the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base for a in node.names]
            for target in targets:
                while target and target not in found and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in found and target != name:
                    deps.add(target)
        out[name] = deps
    return out


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    part.add(top)
                    if top == node:
                        break
                if len(part) > 1:
                    out.append(frozenset(part))
    return out


# The debts of 2026-12-02, all paid (issue 40): each cycle as its modules.
KNOWN_CYCLES: set[frozenset[str]] = set()
# (importer, imported): an import that runs up a layer, or across from one driver to its twin.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    bad = set()
    for importer, deps in graph.items():
        for dep in deps:
            up = layer(dep) > layer(importer)
            twins = (owner(importer, ASYNC), owner(dep, ASYNC))
            across = (twins == (True, False) and owner(dep, SYNC)) or (
                twins == (False, True) and owner(importer, SYNC)
            )
            if up or across:
                bad.add((importer, dep))
    return bad


def test_every_module_has_a_layer() -> None:
    for name in modules():
        layer(name)


def test_no_new_import_cycle_and_no_known_one_left_listed_once_paid() -> None:
    found = set(cycles(imports(modules())))
    new = found - KNOWN_CYCLES
    assert not new, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    paid = KNOWN_CYCLES - found
    assert not paid, f"these cycles are gone: take them out of KNOWN_CYCLES: {paid}"


def test_nothing_imports_upward_or_across_the_twins() -> None:
    found = violations(imports(modules()))
    new = found - KNOWN_UPWARD
    assert not new, "imports against the layers: " + "; ".join(f"{a} imports {b}" for a, b in sorted(new))
    paid = KNOWN_UPWARD - found
    assert not paid, f"these imports are gone: take them out of KNOWN_UPWARD: {sorted(paid)}"


def test_the_checker_sees_a_deferred_import_and_a_cycle() -> None:
    # The checker itself: a cycle closed only by an import inside a function is a cycle.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    source = "def f():\n    from .. import client\n"
    tree = ast.parse(source)
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(tree))
