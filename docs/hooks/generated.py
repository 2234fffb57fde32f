"""MkDocs hook: the pages that are generated at build time, never copied by hand.

- ``<!-- generated: cli-help -->`` becomes the ``--help`` of ``echomq`` and of each of
  its commands, as the installed parser prints it (``echomq.cli.build_parser``), so the
  CLI reference cannot drift from the CLI.
- ``<!-- include: PATH -->`` becomes the file at PATH (from the repository's root), its
  headings one level down: ``docs/performance.md`` shows ``bench/RESULTS.md`` as the
  benchmark leaves it, so the numbers are never a stale copy.

A marker whose source is missing fails the build (``mkdocs build --strict`` in ``make
test``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
HELP_WIDTH = "88"  # argparse wraps to $COLUMNS: a fixed width, whatever the terminal
CLI_MARKER = "<!-- generated: cli-help -->"
INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", re.M)
FENCE = re.compile(r"^(```|~~~)")


@contextlib.contextmanager
def _columns(width: str) -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def cli_help() -> str:
    """Markdown: ``echomq --help``, then ``echomq COMMAND --help`` for every command."""
    from echomq.cli import build_parser

    with _columns(HELP_WIDTH):
        parser = build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parts = ["## echomq\n", "```text\n$ echomq --help\n" + parser.format_help() + "```\n"]
        for name, command in sub.choices.items():
            parts.append(f"## echomq {name}\n")
            parts.append(f"```text\n$ echomq {name} --help\n" + command.format_help() + "```\n")
            nested = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
            for action_name, action in nested[0].choices.items() if nested else ():  # echomq schedule add
                parts.append(f"### echomq {name} {action_name}\n")
                parts.append(
                    f"```text\n$ echomq {name} {action_name} --help\n" + action.format_help() + "```\n"
                )
    return "\n".join(parts)


def demote_headings(text: str) -> str:
    """Every ATX heading one level down (outside code fences), so an included file nests."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,5} ", line):
            line = "#" + line
        out.append(line)
    return "\n".join(out) + "\n"


def include(match: re.Match[str]) -> str:
    path = ROOT / match.group(1)
    if not path.is_file():
        raise PluginError(f"include: {match.group(1)} does not exist")
    return demote_headings(path.read_text())


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_help())
    return INCLUDE.sub(include, markdown)
