"""The command reference (docs/reference/commands/) says what the server says.

Each command's page opens with its syntax line and its flags.  Both are
compared here with what the loaded module tells the server about itself
(``COMMAND DOCS``: the arguments, their order, the optional tokens;
``COMMAND INFO``: the flags), and the commands index lists every command
with the same flags.  The error texts are checked elsewhere, word for word
(test_core_cffi.py, the fuzz suites: ``examples.reference_text``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from ..conftest import needs, supports
from ..examples import DOCS, ROOT
from ..verbs.test_metadata import as_text, command_info

pytestmark = pytest.mark.smoke

COMMANDS = DOCS / "reference" / "commands"
SYNTAX = re.compile(r"^    (EMQ\.[A-Z]+)( .*)?(\n {5,}\S.*)*$", re.M)  # continued: indented further
FLAGS = re.compile(r"^Flags `([a-z -]+)`", re.M)
SHOWN_FLAGS = {"write", "denyoom", "fast", "readonly"}


def pages_by_verb() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for page in sorted(COMMANDS.glob("*.md")):
        for match in SYNTAX.finditer(page.read_text()):
            verb = match.group(1).lower()
            assert verb not in found, f"{verb} has two syntax lines: {found[verb].name}, {page.name}"
            found[verb] = page
    return found


PAGES = pages_by_verb()


def syntax_line(page: Path, verb: str) -> str:
    match = next(m for m in SYNTAX.finditer(page.read_text()) if m.group(1).lower() == verb)
    return " ".join(match.group(0).split())


def render(arguments: list[dict[str, Any]]) -> str:
    """COMMAND DOCS arguments as the pages write them; an option's value is shown as ``<>``."""
    out = []
    for arg in arguments:
        flags = set(arg.get("flags", []))
        kind = arg["type"]
        if kind == "block":
            group = " ".join(f"<{a['name']}>" for a in arg["arguments"])
            out.append(f"{group} [{group} ...]" if "multiple" in flags else group)
        elif kind == "oneof":
            out.append("[" + " | ".join(f"{a['token']} <>" for a in arg["arguments"]) + "]")
        elif kind == "pure-token":
            out.append(f"[{arg['token']}]")
        elif "token" in arg and "multiple" in flags:  # AFTER <dep-id> [<dep-id> ...]
            out.append(f"[{arg['token']} <> [<{arg['name']}> ...]]")
        elif "token" in arg:
            out.append(f"[{arg['token']} <>]")
        else:
            out.append(f"<{arg['name']}>")
    return " ".join(out)


def as_documented(line: str) -> str:
    """A page's syntax line, an option's value name left out (``[COUNT <n>]`` -> ``[COUNT <>]``)."""
    return re.sub(r"(\[|\| )([A-Z_]+) <[a-z-]+>", r"\1\2 <>", line)


def test_every_command_has_one_page(r: redis.Redis) -> None:
    served = {name for name in as_text(list(r.command())) if name.startswith("emq.")}  # as listed
    assert len(served) >= 18
    assert set(PAGES) == served, "a command without a page, or a page of no command"
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "python"))["nav"]
    flat = yaml.safe_dump(nav)
    for page in set(PAGES.values()):
        assert f"reference/commands/{page.name}" in flat, f"{page.name} is not in mkdocs.yml's nav"


@pytest.mark.parametrize("verb", sorted(PAGES))
def test_the_index_lists_the_command_with_its_flags(verb: str, r: redis.Redis) -> None:
    index = (COMMANDS / "index.md").read_text()
    page = PAGES[verb].name
    row = next((line for line in index.splitlines() if f"]({page})" in line and verb.upper() in line), None)
    assert row is not None, f"reference/commands/index.md has no row for {verb.upper()}"
    shown = set(row.rsplit("`", 2)[-2].split())
    assert shown == documented_flags(verb)


def documented_flags(verb: str) -> set[str]:
    match = FLAGS.search(PAGES[verb].read_text())
    assert match, f"{PAGES[verb].name}: no 'Flags `...`' line"
    return set(match.group(1).split())


@pytest.mark.parametrize("verb", sorted(PAGES))
def test_the_documented_flags_are_the_servers(verb: str, r: redis.Redis) -> None:
    served = {f.replace("denyoom", "deny-oom") for f in command_info(r, verb)["flags"] & SHOWN_FLAGS}
    assert documented_flags(verb) == served, f"{PAGES[verb].name}: {verb.upper()}'s flags"


@needs("command_info", "COMMAND DOCS has nothing for module commands")
@pytest.mark.parametrize("verb", sorted(PAGES))
def test_the_documented_syntax_is_the_servers(verb: str, r: redis.Redis) -> None:
    docs = as_text(r.execute_command("COMMAND DOCS", verb))
    docs = docs[verb] if isinstance(docs, dict) else dict(zip(docs[1][::2], docs[1][1::2], strict=True))
    arguments = [a if isinstance(a, dict) else _pairs(a) for a in docs["arguments"]]
    for arg in arguments:
        if "arguments" in arg:
            arg["arguments"] = [a if isinstance(a, dict) else _pairs(a) for a in arg["arguments"]]
    expected = f"{verb.upper()} {render(arguments)}"
    assert as_documented(syntax_line(PAGES[verb], verb)) == expected, PAGES[verb].name


def _pairs(flat: list[Any]) -> dict[str, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


# -- the keyspace page names every field the verbs write, and no other -----------------


def documented_fields(section: str) -> set[str]:
    """The backticked names in the first column of the table under ``## <section>`` of keyspace.md."""
    page = (DOCS / "reference" / "keyspace.md").read_text()
    body = page.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}


@pytest.mark.backends
def test_the_keyspace_page_names_every_field_the_verbs_write(r: redis.Redis, backend: str) -> None:
    """One job through every verb that writes a row field, and a queue through every setting
    (with each backend: the scripts write the same fields)."""
    if backend == "scripts" and not supports("script_flags"):
        pytest.skip("the scripts backend needs Redis 7.0+ (script flags, Functions)")
    import echomq
    from echomq.keyspace import queue_keys

    client = echomq.Client(r)
    keys = queue_keys("q")
    row = keys.job("j")
    seen: set[str] = set()

    def look() -> None:
        seen.update(k.decode() for k in r.hkeys(row))

    client.enqueue("q", b"x", job_id="j", priority=3, unique_key="u", group="g")
    look()
    job = client.claim("q", lease_ms=60_000)
    assert job is not None
    client.checkpoint("q", job.id, job.token, lease_ms=60_000, state=b"s", progress="1/2")
    client.fail("q", job.id, job.token, "E: boom", traceback="Traceback: boom")
    look()
    job = client.claim("q", lease_ms=60_000)
    assert job is not None
    client.cancel("q", "j", reason="why")
    look()
    assert client.fail("q", job.id, job.token, "boom") == "cancelled"
    look()
    client.retry("q", "j")
    job = client.claim("q", lease_ms=60_000)
    assert job is not None
    r.zadd(keys.active, {"j": 0})  # its lease lapsed
    assert client.sweep("q", max_stalled=5).recovered == ["j"]
    job = client.claim("q", lease_ms=60_000)
    assert job is not None
    client.complete("q", "j", job.token, result="done")
    look()
    # a job waiting for another (issue 46), delayed, and the one it waits for
    client.enqueue("q", b"", job_id="dep-p")
    client.enqueue("q", b"", job_id="dep-w", delay_ms=600_000, after=["dep-p"], on_parent_failure="ignore")
    seen.update(k.decode() for k in r.hkeys(keys.job("dep-w")) + r.hkeys(keys.job("dep-p")))
    # pieces are named after their field (`payload:1`, ...): the page says so in its own section
    assert seen == documented_fields("The job row"), "docs/reference/keyspace.md, The job row"

    client.enqueue("q", b"", job_id="t")
    client.cancel("q", "t")  # a tombstone: `stale`
    client.enqueue("q", b"", job_id="w", group="g")  # a group waits: the ring exists, `ring`
    client.pause("q")
    client.retention("q", done_ms=1, cancelled_ms=2, dead_ms=3)
    client.set_group_limit("q", None, max_active=2)  # the default group cap: `group_max`
    meta = {k.decode() for k in r.hkeys(keys.base + "meta")}
    assert meta == documented_fields("The queue's settings: `<base>meta`"), "keyspace.md, <base>meta"


@pytest.mark.parametrize("name", ["echomq.Client", "echomq.asyncio.Client"])
def test_the_python_reference_lists_every_public_method_of_the_clients(name: str) -> None:
    # The operator's verbs are a mixin's (echomq/_sync/_operator.py, echomq/asyncio/_operator.py), so
    # the reference page names each client's members itself, in the page's order: a verb added to
    # either class and not to the page would be missing from the reference.
    import importlib
    import inspect

    module, _, attr = name.rpartition(".")
    client = getattr(importlib.import_module(module), attr)
    page = (DOCS / "reference" / "python.md").read_text()
    block = page.split(f"::: {name}\n", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^        - (\w+)$", block, re.M)
    kinds = (property, classmethod)
    public = {
        member
        for klass in client.__mro__[:-1]
        for member, value in vars(klass).items()
        if not member.startswith("_") and (inspect.isfunction(value) or isinstance(value, kinds))
    }
    assert sorted(listed) == sorted(public)
    assert len(listed) == len(set(listed))
