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
