"""The README's examples run as written, against a real server."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
TOKEN = re.compile(r"\b([0-9]+)-[0-9a-f]{16}\b")  # a fencing token: <claim number>-<16 hex>


def block_after(heading: str, language: str = "python") -> str:
    section = README[README.index(heading) :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"no {language} block after {heading!r}"
    return match.group(1)


def test_the_30_second_python_example_runs() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block_after("## 30 seconds: Python"), "README.md", "exec"), {})
    assert out.getvalue().strip() == "[] [] [] 0"


def test_the_cli_commands_in_the_readme_exist() -> None:
    from echomq.cli import build_parser

    parser = build_parser()
    documented = set(re.findall(r"^\| `echomq ([a-z-]+)", README, re.M))
    assert documented >= {"inspect", "sweep", "reap", "cancel", "server", "module-path", "demo"}
    for name in documented:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            parser.parse_args([name, "--help"])
    choices = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert documented == set(choices), "README's CLI table and the parser disagree"


def test_the_redis_cli_session_prints_what_the_readme_shows(server: object) -> None:
    """Line by line, output compared exactly -- except the fencing tokens, whose
    random part differs every run: where the README shows a token
    ("<claim>-<16 hex>"), any token of the same claim number is accepted, and the
    README's token in later commands is replaced by the one the server handed out.
    A token the README never showed as output (a guessed one) is sent as written."""
    import shlex
    import shutil
    import subprocess

    import pytest

    cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if cli is None:
        pytest.skip("no redis-cli on PATH")
    port = str(server.port)  # type: ignore[attr-defined]
    subprocess.run([cli, "-p", port, "FLUSHALL"], check=True, capture_output=True)
    session = block_after("## 30 seconds: redis-cli", "console")
    steps: list[tuple[list[str], list[str]]] = []
    for line in session.splitlines():
        if line.startswith("$ redis-cli "):
            steps.append((shlex.split(line[len("$ redis-cli ") :], comments=True), []))
        else:
            steps[-1][1].append(line)
    assert len(steps) == 9
    handed_out: dict[str, str] = {}  # the README's token -> the server's
    for args, expected in steps:
        args = [handed_out.get(arg, arg) for arg in args]
        # --no-raw: the formatted output a terminal shows, even into a pipe.
        done = subprocess.run([cli, "--no-raw", "-p", port, *args], capture_output=True, text=True)
        actual = done.stdout.splitlines()
        assert len(actual) == len(expected), (args, done.stdout)
        for want, got in zip(expected, actual, strict=True):
            shown = TOKEN.search(want)
            if shown is None:
                assert got == want, (args, done.stdout)
                continue
            pattern = re.escape(want[: shown.start()]) + rf"({shown.group(1)}-[0-9a-f]{{16}})"
            match = re.fullmatch(pattern + re.escape(want[shown.end() :]), got)
            assert match, (args, want, got)
            assert match.group(1) not in handed_out.values(), "two claims handed out one token"
            handed_out[shown.group(0)] = match.group(1)
    assert len(handed_out) == 2
