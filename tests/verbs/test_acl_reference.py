"""docs/reference/acl.md says what the server says (issue 28, point 7).

The page's claims, read from the page itself and checked against a real
server, as tests/house/test_docs_reference.py checks each command page's syntax:

- the key-permissions table: each declared key of each command with the key
  flags the page gives it, compared with `COMMAND DOCS` (which argument is a
  key) and `COMMAND INFO` (its key spec's flags);
- the `%W~*` user: the verbs the page says it may run run for it, the ones it
  says `ACL DRYRUN` passes and the module refuses do exactly that, and the
  server refuses every other.

(It once said "a %W~* user may run EMQ.ENQUEUE and nothing else" while
ENQUEUEMANY ran too, and gave SWEEP's <dead> as "RW insert" while the server
said "RW access update".)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory, needs
from ..examples import DOCS
from ..helpers import digest
from .test_metadata import SPEC, as_text, command

pytestmark = [
    needs("acl_keys", "no key specs, %R~/%W~ or ACL DRYRUN before Redis 7.0"),
    pytest.mark.smoke,
    pytest.mark.memcheck,
]

PAGE = (DOCS / "reference" / "acl.md").read_text()
FLAG_WORDS = {"RW", "RO", "OW", "RM", "access", "update", "insert", "delete"}


def documented_key_flags() -> dict[str, dict[str, set[str]]]:
    """The key-permissions table: {verb: {key name: flags}}, flags upper-cased."""
    section = PAGE.split("## Key permissions", 1)[1]
    out: dict[str, dict[str, set[str]]] = {}
    for line in section.splitlines():
        if not line.startswith("| `EMQ."):
            continue
        verbs_cell, keys_cell = line.split("|")[1:3]
        keys: dict[str, set[str]] = {}
        for text in re.sub(r"\([^)]*\)", "", keys_cell).split(";"):  # without the reasons in parentheses
            names = re.findall(r"`<([a-z]+)>`", text)
            flags = [w for w in re.sub(r"`<[a-z]+>`,?", " ", text).split() if w in FLAG_WORDS]
            assert names and flags, f"acl.md: cannot read {text!r}"
            for name in names:
                keys[name] = {f.upper() for f in flags}
        for verb in re.findall(r"`(EMQ\.[A-Z]+)`", verbs_cell):
            out[verb.lower()] = keys
    return out


def listed_after(words: str) -> set[str]:
    """The verbs named on the line after the paragraph that ends with ``words``."""
    match = re.search(re.escape(words) + r"\s*\n((?:`EMQ\.[A-Z]+`(?:, )?)+)\.", PAGE)
    assert match, f"acl.md: no list after {words!r}"
    return {v.lower() for v in re.findall(r"`(EMQ\.[A-Z]+)`", match.group(1))}


def pairs(flat: Any) -> dict[Any, Any]:
    """A RESP2 map (a flat list of keys and values) as a dict; a dict as it is."""
    return flat if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=True))


WRITE_ONLY_RUNS = listed_after("A `%W~*` user (keys it may write, none it may read) may run:")
DRYRUN_ONLY = listed_after("and the module refuses them with `-NOPERM` when they run:")


@pytest.fixture(scope="module")
def acl_server(server_factory: ServerFactory) -> Iterator[EmbeddedServer]:
    srv = server_factory()
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "writeonly", "reset", "on", ">pw", "+@all", "%W~*", "&*")
    admin.close()
    yield srv


def test_the_key_table_is_the_servers(acl_server: EmbeddedServer) -> None:
    r = acl_server.client()
    table = documented_key_flags()
    assert set(table) == set(SPEC), "acl.md's key table must list every command"
    for verb, keys in table.items():
        docs = as_text(r.execute_command("COMMAND DOCS", verb))
        docs = docs[verb] if isinstance(docs, dict) else pairs(docs[1])
        specs = [pairs(spec) for spec in command(r, "INFO", verb)[0][8]]
        served: dict[str, set[str]] = {}
        for arg in map(pairs, docs["arguments"]):
            if arg["type"] != "key":
                continue
            flags = {str(f).upper() for f in specs[arg["key_spec_index"]]["flags"]}
            if "NOT_KEY" not in flags:
                served[arg["name"]] = flags
        assert served == keys, f"acl.md's row of {verb} says {keys}, the server {served}"
    r.close()


def test_the_write_only_user_runs_what_the_page_says(acl_server: EmbeddedServer) -> None:
    admin = acl_server.client()
    user = acl_server.client(username="writeonly", password="pw")
    try:
        for verb in sorted(SPEC):
            admin.flushall()
            admin.execute_command("EMQ.ENQUEUE", "emq:{q}:pending", "emq:{q}:", "other", "x")
            before = digest(admin)
            line = [verb, *SPEC[verb][2]]
            dry = admin.execute_command("ACL", "DRYRUN", "writeonly", *line)
            try:
                user.execute_command(*line)
                ran = True
            except redis.exceptions.NoPermissionError as exc:
                ran = False
                derived = "derived from <base>" in str(exc)
                assert derived == (verb in DRYRUN_ONLY), (verb, str(exc))
                assert digest(admin) == before, verb
            assert ran == (verb in WRITE_ONLY_RUNS), verb
            dry_passes = dry in (b"OK", "OK")
            assert dry_passes == (verb in WRITE_ONLY_RUNS | DRYRUN_ONLY), (verb, dry)
    finally:
        user.close()
        admin.close()


def test_the_lists_are_disjoint_and_name_commands() -> None:
    assert WRITE_ONLY_RUNS and DRYRUN_ONLY and not WRITE_ONLY_RUNS & DRYRUN_ONLY
    assert set(SPEC) >= WRITE_ONLY_RUNS | DRYRUN_ONLY
