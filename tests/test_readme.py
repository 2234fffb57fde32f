"""The README's examples run as written, against a real server."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def block_after(heading: str, language: str = "python") -> str:
    section = README[README.index(heading) :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"no {language} block after {heading!r}"
    return match.group(1)


def test_the_30_second_python_example_runs() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block_after("## 30 seconds: Python"), "README.md", "exec"), {})
    assert out.getvalue().strip() == "[] []"


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
    for args, expected in steps:
        # --no-raw: the formatted output a terminal shows, even into a pipe.
        done = subprocess.run([cli, "--no-raw", "-p", port, *args], capture_output=True, text=True)
        assert done.stdout.splitlines() == expected, (args, done.stdout)
