"""The compat run: what pyproject.toml declares (``redis>=...``, ``requires-python``), tested.

Each combination of a Python, a redis-py and hiredis (or not) gets a virtual
environment of its own under ``.compat/venvs/`` (kept between runs: only the
echomq wheel, built fresh from this tree, is installed again), where
``pip check`` first proves that the declared range admits that redis-py;
then the compat subset (``SUBSET``: the client, both workers and the CLI,
against a real server with the module and the scripts backend) runs once per
RESP version (the suite's ``--resp``).  The table of versions x results is
printed and written to ``.compat/results.md`` (``--docs`` also puts it in
docs/reference/engines.md).

    python -m tests.compat.run            the whole matrix (make compat)
    python -m tests.compat.run --short    the extremes (make test)

A Python that is not on this machine is reported as skipped, with the reason;
a combination that fails makes the run fail.  Pythons are looked for as
``python3.X`` under pyenv's versions, then on PATH.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".compat"
DOCS_PAGE = ROOT / "docs" / "reference" / "engines.md"
START_MARK = "<!-- compat table: python -m tests.compat.run --docs -->"
END_MARK = "<!-- end of compat table -->"

PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# The lowest and the newest release of every redis-py major that pyproject.toml admits;
# "newest" is whatever the package index serves today (its version goes into the table).
REDIS_PY = ("5.0.1", "5.3.1", "6.0.0", "6.4.0", "7.0.0", "7.4.1", "8.0.0", "newest")
RESP = (2, 3)

# The client (its verbs, their replies and errors, a lost reply's retry), both workers
# (claims, checkpoints, retries, dead letters, pushed cancels, shutdown) and the CLI, on
# the module and on the scripts backend; about 20 s per RESP version.
SUBSET = (
    "tests/house/test_compat.py",
    "tests/verbs/test_client.py",
    "tests/verbs/test_retry_safety.py",
    "tests/workers/test_worker.py",
    "tests/workers/test_asyncio.py",
    "tests/integrations/test_cli.py",
)
TEST_TOOLS = ("pytest>=8", "pytest-timeout>=2.3")
# What echomq needs besides redis-py (pyproject.toml's dependencies): installed with the
# combination's redis-py, so that `pip check` judges the whole declared set.
OTHER_DEPENDENCIES = [
    dep
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    if not re.match(r"redis\b", dep)
]


@dataclasses.dataclass(frozen=True)
class Combo:
    python: str  # "3.10"
    redis_py: str  # "5.0.1" or "newest"
    hiredis: bool
    resp: tuple[int, ...]

    @property
    def key(self) -> str:
        return f"py{self.python}-redis{self.redis_py}" + ("-hiredis" if self.hiredis else "")


# make test's short form: the extremes.  The oldest redis-py on the oldest Python with each
# parser, the newest on the newest Python with hiredis; RESP3 on both ends.
SHORT = (
    Combo("3.10", REDIS_PY[0], False, (2,)),
    Combo("3.10", REDIS_PY[0], True, (3,)),
    Combo("3.13", "newest", True, (3,)),
)


@dataclasses.dataclass
class Outcome:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    note: str = ""  # why nothing ran (a skipped or broken combination)
    seconds: float = 0.0

    def cell(self) -> str:
        if self.note:
            return self.note
        text = f"{self.passed} passed"
        if self.skipped:
            text += f", {self.skipped} skipped"
        if self.failed:
            text += f", **{self.failed} failed**"
        return text


@dataclasses.dataclass
class Row:
    combo: Combo
    versions: dict[str, str] = dataclasses.field(default_factory=dict)  # python, redis, hiredis
    by_resp: dict[int, Outcome] = dataclasses.field(default_factory=dict)
    note: str = ""

    @property
    def ok(self) -> bool:
        if self.note.startswith("skipped"):
            return True
        return not self.note and all(not o.failed and not o.note for o in self.by_resp.values())


def find_python(version: str) -> str | None:
    """``python<version>``: pyenv's newest patch release of it, else one on PATH (not a pyenv shim)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(
        root.glob(f"{version}.*/bin/python{version}"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.parent.name)],
    )
    if found:
        return str(found[-1])
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if entry and "shims" not in Path(entry).parts:
            hit = shutil.which(f"python{version}", path=entry)
            if hit:
                return hit
    return None


def run(cmd: list[str], log: Path, *, env: dict[str, str] | None = None, timeout: float = 900) -> int:
    with log.open("a") as out:
        out.write(f"\n$ {shlex.join(cmd)}\n")
        out.flush()
        try:
            return subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n(timed out after {timeout:.0f} s)\n")
            return -1


def build_wheel(log: Path) -> Path:
    """The echomq wheel of this tree (pure Python: one wheel serves every Python)."""
    dist = HOME / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    code = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)], log)
    wheels = sorted(dist.glob("echomq-*.whl"))
    if code != 0 or not wheels:
        raise SystemExit(f"could not build the echomq wheel: see {log}")
    return wheels[0]


def prepare(combo: Combo, wheel: Path, log: Path) -> tuple[Path | None, str]:
    """The combination's venv with its redis-py, hiredis or not, and this tree's echomq: (python, why not)."""
    interpreter = find_python(combo.python)
    if interpreter is None:
        return None, f"skipped: no python{combo.python} on this machine"
    venv = HOME / "venvs" / combo.key
    python = venv / "bin" / "python"
    wanted = [*TEST_TOOLS, *OTHER_DEPENDENCIES]
    wanted.append("redis" if combo.redis_py == "newest" else f"redis=={combo.redis_py}")
    if combo.hiredis:
        wanted.append("hiredis")
    stamp = venv / ".compat-installed"
    fresh = not stamp.is_file() or stamp.read_text() != json.dumps(wanted)
    if fresh:
        shutil.rmtree(venv, ignore_errors=True)
        if run([interpreter, "-m", "venv", str(venv)], log) != 0:
            return None, f"broken: python{combo.python} could not make a venv (see the log)"
    if fresh or combo.redis_py == "newest":
        upgrade = ["--upgrade", "--upgrade-strategy", "eager"] if combo.redis_py == "newest" else []
        if run([str(python), "-m", "pip", "install", "-q", *upgrade, *wanted], log) != 0:
            return None, "broken: pip could not install it (see the log)"
        stamp.write_text(json.dumps(wanted))
    if run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], log):
        return None, "broken: echomq did not install (see the log)"
    # pip check: the installed redis-py (and Python) are inside what echomq declares.
    if run([str(python), "-m", "pip", "check"], log) != 0:
        return None, "outside the declared range (pip check)"
    return python, ""


def versions_of(python: Path) -> dict[str, str]:
    code = (
        "import json, platform, importlib.metadata as m\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return ''\n"
        "print(json.dumps({'python': platform.python_version(),\n"
        "                  'redis': v('redis'), 'hiredis': v('hiredis')}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out))


def read_junit(path: Path) -> Outcome:
    outcome = Outcome()
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            outcome.skipped += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            outcome.failed += 1
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            outcome.failures.append(name)
        else:
            outcome.passed += 1
    return outcome


def run_combo(combo: Combo, wheel: Path, engine: str, tests: tuple[str, ...]) -> Row:
    logs = HOME / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{combo.key}.log"
    log.write_text("")
    row = Row(combo)
    python, why = prepare(combo, wheel, log)
    if python is None:
        row.note = why
        return row
    row.versions = versions_of(python)
    env = dict(os.environ)
    env.pop("ECHOMQ_SERVER_BIN", None)
    env.pop("VIRTUAL_ENV", None)
    env["ECHOMQ_MODULE"] = str(ROOT / "module" / "emq.so")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for resp in combo.resp:
        junit = logs / f"{combo.key}-resp{resp}.xml"
        junit.unlink(missing_ok=True)
        started = time.monotonic()
        cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--engine", engine]
        cmd += ["--resp", str(resp), f"--junitxml={junit}", *tests]
        code = run(cmd, log, env=env)
        if junit.is_file():
            outcome = read_junit(junit)
            if code not in (0, 1):  # pytest itself broke (a usage error, an internal error)
                outcome.note = f"broken: pytest exited {code} (see the log)"
        else:
            outcome = Outcome(note=f"broken: pytest exited {code} before any test (see the log)")
        outcome.seconds = time.monotonic() - started
        row.by_resp[resp] = outcome
    return row


def matrix(args: argparse.Namespace) -> list[Combo]:
    if args.short:
        return list(SHORT)
    pythons = args.python.split(",") if args.python else list(PYTHONS)
    redis_pys = args.redis_py.split(",") if args.redis_py else list(REDIS_PY)
    hiredis = {"yes": [True], "no": [False], "both": [False, True]}[args.hiredis]
    resp = tuple(int(x) for x in args.resp.split(","))
    return [Combo(p, v, h, resp) for v in redis_pys for p in pythons for h in hiredis]


def table(rows: list[Row], resp: tuple[int, ...]) -> str:
    head = "| redis-py | Python | hiredis | " + " | ".join(f"RESP{n}" for n in resp) + " |"
    lines = [head, "|" + "---|" * (3 + len(resp))]
    for row in rows:
        v = row.versions
        redis_py = v.get("redis") or row.combo.redis_py
        if row.combo.redis_py == "newest" and v.get("redis"):
            redis_py += " (newest)"
        python = v.get("python") or row.combo.python
        hiredis = (v.get("hiredis") or "yes") if row.combo.hiredis else "no"
        cells = [
            row.note if row.note else (row.by_resp[n].cell() if n in row.by_resp else "not run") for n in resp
        ]
        lines.append(f"| {redis_py} | {python} | {hiredis} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_docs(text: str, command: str, summary: str) -> None:
    page = DOCS_PAGE.read_text()
    start, end = page.find(START_MARK), page.find(END_MARK)
    if start < 0 or end < start:
        raise SystemExit(f"{DOCS_PAGE} has no compat table markers ({START_MARK!r} ... {END_MARK!r})")
    day = datetime.date.today().isoformat()
    block = (
        f"{START_MARK}\nRun on {day} with `{command}` (Redis 7.0, the module and the scripts backend; "
        f"{summary}):\n\n"
    )
    DOCS_PAGE.write_text(page[:start] + block + text + "\n" + page[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--short", action="store_true", help="only the extremes (make test)")
    parser.add_argument("--python", help=f"comma-separated Pythons (default: {','.join(PYTHONS)})")
    parser.add_argument(
        "--redis-py", help=f"comma-separated redis-py versions (default: {','.join(REDIS_PY)})"
    )
    parser.add_argument("--hiredis", choices=("yes", "no", "both"), default="both")
    parser.add_argument("--resp", default="2,3", help="comma-separated RESP versions (default: 2,3)")
    parser.add_argument("--engine", default="redis", help="the suite's --engine (default: redis, Redis 7.0)")
    parser.add_argument("--jobs", type=int, default=2, help="combinations run at once (default: 2)")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/reference/engines.md")
    parser.add_argument("tests", nargs="*", help=f"the tests to run (default: {' '.join(SUBSET)})")
    args = parser.parse_args(argv)
    tests = tuple(args.tests) or SUBSET
    combos = matrix(args)
    HOME.mkdir(exist_ok=True)
    (HOME / ".gitignore").write_text("*\n")
    started = time.monotonic()
    wheel = build_wheel(HOME / "build.log")
    rows: dict[Combo, Row] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_combo, c, wheel, args.engine, tests): c for c in combos}
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            rows[row.combo] = row
            took = sum(o.seconds for o in row.by_resp.values())
            state = "skipped" if row.note.startswith("skipped") else "ok" if row.ok else "FAILED"
            detail = row.note or "; ".join(f"RESP{n}: {o.cell()}" for n, o in row.by_resp.items())
            print(f"{row.combo.key}: {state} ({detail}; {took:.0f} s)", flush=True)
            for n, o in row.by_resp.items():
                for name in o.failures:
                    print(f"    RESP{n} failed: {name}", flush=True)
    ordered = [rows[c] for c in combos]
    resp = tuple(sorted({n for c in combos for n in c.resp}))
    text = table(ordered, resp)
    (HOME / "results.md").write_text(text + "\n")
    summary = f"{len(combos)} combinations in {time.monotonic() - started:.0f} s, {args.jobs} at a time"
    print(f"\n{text}\n\n{summary}; logs in {HOME / 'logs'}")
    if args.docs:
        given = list(argv if argv is not None else sys.argv[1:])
        command = (
            "make compat" if given == ["--docs"] else shlex.join(["python", "-m", "tests.compat.run", *given])
        )
        write_docs(text, command, summary)
    failed = [r.combo.key for r in ordered if not r.ok]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
