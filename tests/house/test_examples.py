"""Every code example of README.md and docs/ runs as written, against real servers.

How blocks are told apart, marked and compared: tests/examples.py.  A python
block runs in an interpreter of its own (it starts its own servers with
``echomq.testing.EmbeddedServer``, on the engine the suite runs on); a
console block runs against the suite's server, flushed first.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from echomq.cli import build_parser
from echomq.testing import EmbeddedServer

from ..conftest import engine_cli
from ..examples import ROOT, Block, all_blocks, compare

pytestmark = pytest.mark.once

PYTHON = all_blocks("python")
CONSOLE = all_blocks("console")


def ids(found: list[Block]) -> list[str]:
    return [b.where for b in found]


def test_the_docs_have_examples_of_every_kind() -> None:
    assert sum(b.runs for b in PYTHON) >= 10
    assert sum(b.runs for b in CONSOLE) >= 3
    readme = [b for b in all_blocks() if b.path.name == "README.md"]
    assert {"python", "console", "sh"} <= {b.language for b in readme if b.runs}


def test_every_example_is_a_kind_the_suite_checks() -> None:
    known = {"python", "console", "sh", "yaml", "text"}
    for block in all_blocks():
        assert block.language in known, f"{block.where}: a ```{block.language} block is checked by nothing"
        if block.not_run is not None:
            assert block.language in {"python", "console"}, f"{block.where}: only run blocks are marked"
            assert len(block.not_run) >= 10, f"{block.where}: say why it is not run"


@pytest.mark.parametrize("block", [b for b in PYTHON if b.runs], ids=ids([b for b in PYTHON if b.runs]))
def test_python_example_runs(block: Block, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", block.code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"
    if block.output is not None:
        compare(block.output, done.stdout, {}, block.where)


@pytest.mark.parametrize("block", [b for b in CONSOLE if b.runs], ids=ids([b for b in CONSOLE if b.runs]))
def test_console_example_prints_what_the_docs_show(block: Block, server: EmbeddedServer) -> None:
    cli = engine_cli() or shutil.which("redis-cli")
    if cli is None:
        pytest.skip("no redis-cli beside the server or on PATH")
    subprocess.run([cli, "-p", str(server.port), "FLUSHALL"], check=True, capture_output=True)
    env = dict(os.environ, ECHOMQ_URL=server.url)
    tokens: dict[str, str] = {}
    for n, (command, expected) in enumerate(session(block)):
        args = [tokens.get(arg, arg) for arg in shlex.split(command, comments=True)]
        if args[0] == "redis-cli":
            # --no-raw: the formatted output a terminal shows, even into a pipe.
            argv = [cli, "--no-raw", "-p", str(server.port), *args[1:]]
        elif args[0] == "echomq":
            argv = [sys.executable, "-m", "echomq", *args[1:]]
        else:
            raise AssertionError(f"{block.where}: cannot run {args[0]!r}; mark it <!-- not run: why -->")
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        compare(expected, done.stdout + done.stderr, tokens, f"{block.where}, command {n + 1}: {command}")


def session(block: Block) -> list[tuple[str, str]]:
    """The ``$ `` commands of a console block, each with the lines it prints."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"{block.where}: a console block starts with a '$ ' command"
            steps[-1][1].append(line)
    return [(command, "".join(out + "\n" for out in lines)) for command, lines in steps]


def parses(argv: list[str], where: str) -> None:
    """`echomq ARGS...` is a command the CLI accepts (parsed, not run)."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            build_parser().parse_args(argv)
    except SystemExit as stop:
        assert stop.code == 0, f"{where}: echomq {shlex.join(argv)}: {out.getvalue()}"


def echomq_lines(script: str) -> list[list[str]]:
    found = []
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value before it
            words.pop(0)
        if words and words[0] == "echomq":
            found.append(words[1:])
    return found


NOT_RUN_CONSOLE = [b for b in CONSOLE if not b.runs]


@pytest.mark.parametrize("block", NOT_RUN_CONSOLE, ids=ids(NOT_RUN_CONSOLE))
def test_console_example_not_run_still_parses(block: Block) -> None:
    for command, _ in session(block):
        words = shlex.split(command, comments=True)
        if words[0] == "echomq":
            parses(words[1:], block.where)


@pytest.mark.parametrize("block", all_blocks("sh"), ids=ids(all_blocks("sh")))
def test_shell_example_is_valid(block: Block) -> None:
    done = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    assert done.returncode == 0, f"{block.where}: {done.stderr}"
    for argv in echomq_lines(block.code):
        parses(argv, block.where)


@pytest.mark.parametrize("block", all_blocks("yaml"), ids=ids(all_blocks("yaml")))
def test_yaml_example_parses(block: Block) -> None:
    assert yaml.safe_load(block.code) is not None, block.where


def test_output_is_compared_exactly_except_what_varies() -> None:
    tokens: dict[str, str] = {}
    compare("a 1-0123456789abcdef\n", "a 1-fedcba9876543210\n", tokens, "t")
    assert tokens == {"1-0123456789abcdef": "1-fedcba9876543210"}
    compare("lease  29727 ms  0\n", "lease  9727 ms   0\n", tokens, "t")
    compare(  # a local time and an age, in any of their shapes
        "died  2026-12-01 09:31:20 +0000  (3.2 s ago)\n",
        "died  2025-01-02 10:00:00 +0100  (5m 03s ago)\n",
        tokens,
        "t",
    )
    wrong = [
        ("a 1-0123456789abcdef\n", "a 2-fedcba9876543210\n"),  # another claim number
        ("lease 5 ms 0\n", "lease 5 s 0\n"),
        ("pending 1\n", "pending  1\n"),  # nothing varies: exact
        ("pending 1\n", "pending 1\nactive 0\n"),
        ("at 2026-12-01 09:31:20 +0000\n", "at 1796025080288\n"),  # a local time is not raw ms
        ("at 2026-12-01 09:31:20 +0000\n", "at 2026-12-01 09:31:20\n"),  # nor one without its offset
    ]
    for want, got in wrong:
        with pytest.raises(AssertionError):
            compare(want, got, {}, "t")


def test_readme_links_resolve() -> None:
    """The README is read on its own (GitHub, PyPI): every relative link leads to a file and heading."""
    from markdown.extensions.toc import slugify

    text = (ROOT / "README.md").read_text()
    for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]*))?\)", text):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / target).read_text(), re.M)
            assert anchor in {slugify(h, "-") for h in headings}, f"README.md: no #{anchor} in {target}"


def test_the_readme_is_a_front_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
