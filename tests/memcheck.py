"""Run test files with every redis-server under valgrind, then read the logs.

    python tests/memcheck.py [pytest arguments...]      (what `make -C module check` runs)

1. The canary: a server loads module/memcheck-canary.so (a module that leaks
   and reads past a block on purpose) under valgrind; the run stops unless
   the logs blame both faults on that .so.  This proves the checker sees a
   module's memory at all (Debian's redis-server allocates through
   libjemalloc, which valgrind only watches when told to) and that servers
   are stopped cleanly enough to write their leak reports.
2. The suite: pytest runs the given test files with ``ECHOMQ_SERVER_WRAPPER``
   set, so every server the tests start runs under valgrind.
3. The verdict: every valgrind log must be complete (the server exited and
   wrote its summary) and report zero errors -- invalid reads or writes,
   uninitialised values, bad frees, definite leaks -- after the suppressions
   in module/valgrind.supp (none of which is about emq.so).  Errors are
   counted and attributed: those with a frame or an allocation in emq.so
   are ours.

Exit status 0 only when all of that holds.  Logs are kept on failure.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from echomq.testing import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent
MODULE_DIR = ROOT / "module"
SUPPRESSIONS = MODULE_DIR / "valgrind.supp"


def valgrind_command(log_dir: Path) -> list[str]:
    return [
        "valgrind",
        "--tool=memcheck",
        # Debian's redis-server calls malloc/free in libjemalloc.so.2: have
        # valgrind replace those too, or it sees none of the server's heap.
        "--soname-synonyms=somalloc=libjemalloc.so*",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "--show-leak-kinds=definite",
        "--num-callers=40",
        f"--suppressions={SUPPRESSIONS}",
        "--error-exitcode=99",
        f"--log-file={log_dir}/vg.%p.log",
    ]


ERROR_KINDS = re.compile(
    r"Invalid (read|write|free)|Mismatched free|Conditional jump|Use of uninitialised"
    r"|Syscall param|Source and destination overlap|Argument '\w+' of function"
    r"|are definitely lost|Process terminating"
)


@dataclass
class Log:
    path: Path
    pid: str = ""
    command: str = ""
    complete: bool = False
    contexts: int = -1
    errors: list[str] = field(default_factory=list)

    def ours(self, module: str) -> list[str]:
        return [e for e in self.errors if module in e]


def parse(path: Path) -> Log:
    """Split a valgrind log into records (blank-line separated) and keep the errors."""
    log = Log(path)
    records: list[list[str]] = [[]]
    for raw in path.read_text(errors="replace").splitlines():
        m = re.match(r"==(\d+)== ?(.*)$", raw)
        if not m:
            continue
        log.pid, line = m.group(1), m.group(2)
        if not line.strip():
            records.append([])
            continue
        records[-1].append(line)
        if line.startswith("Command: "):
            log.command = line[len("Command: ") :]
        summary = re.match(r"ERROR SUMMARY: [\d,]+ errors from ([\d,]+) contexts", line)
        if summary:
            log.complete = True
            log.contexts = int(summary.group(1).replace(",", ""))
    for record in records:
        if record and ERROR_KINDS.search(record[0]):
            log.errors.append("\n".join(record))
    return log


def parse_all(log_dir: Path) -> list[Log]:
    return [parse(p) for p in sorted(log_dir.glob("vg.*.log"))]


def problems(logs: Iterable[Log]) -> list[str]:
    """Everything wrong with a set of logs, as readable lines."""
    found = []
    for log in logs:
        if not log.complete:
            found.append(f"{log.path.name}: no ERROR SUMMARY (the server did not exit cleanly)")
            continue
        reported = len([e for e in log.errors if not e.startswith("Process terminating")])
        if reported != log.contexts:
            found.append(
                f"{log.path.name}: valgrind counts {log.contexts} error contexts, the parser {reported}"
            )
        found += [f"{log.path.name}: {log.command}\n{e}" for e in log.errors]
    return found


def run_canary(log_dir: Path) -> None:
    canary = MODULE_DIR / "memcheck-canary.so"
    with EmbeddedServer(module=canary, wrapper=valgrind_command(log_dir)) as server:
        conn = server.client()
        assert conn.execute_command("EMQCANARY.LEAK") == 1
        conn.execute_command("EMQCANARY.OVERREAD")
        conn.close()
    logs = parse_all(log_dir)
    blamed = [e for log in logs for e in log.ours(canary.name)]
    leak = any("definitely lost" in e for e in blamed)
    overread = any(e.startswith("Invalid read") for e in blamed)
    if not (leak and overread and all(log.complete for log in logs)):
        for line in problems(logs):
            print(line, file=sys.stderr)
        sys.exit(
            f"memcheck: the checker did not catch the canary's faults (leak={leak}, "
            f"overread={overread}); its report on emq.so would mean nothing. Logs: {log_dir}"
        )
    print(f"memcheck: canary caught ({len(blamed)} errors blamed on {canary.name}: a leak and a stray read)")


def run_suite(log_dir: Path, pytest_args: Sequence[str]) -> int:
    env = dict(os.environ)
    env["ECHOMQ_SERVER_WRAPPER"] = shlex.join(valgrind_command(log_dir))
    env.setdefault("ECHOMQ_FUZZ_EXAMPLES", "1500")
    env.setdefault("ECHOMQ_FUZZ_SECONDS", "120")
    env.setdefault("ECHOMQ_FUZZ_LIFECYCLE_EXAMPLES", "600")
    # Two test processes (valgrind makes every server CPU-bound; a CI machine has two cores),
    # a file's tests in one of them: a fuzz file's last test checks what its others counted.
    # -s: the fuzz tests print those counts.
    parallel = ["-n", "2", "--dist", "loadfile"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", *parallel, "-p", "no:cacheprovider", *pytest_args]
    print("memcheck:", shlex.join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def main(argv: Sequence[str]) -> int:
    if shutil.which("valgrind") is None:
        print("memcheck: valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="echomq-memcheck-"))
    canary_dir, suite_dir = work / "canary", work / "suite"
    canary_dir.mkdir()
    suite_dir.mkdir()
    run_canary(canary_dir)

    status = run_suite(suite_dir, argv)
    logs = parse_all(suite_dir)
    with_module = [log for log in logs if "emq.so" in log.command]
    found = problems(logs)
    ours = sum(len(log.ours("emq.so")) for log in logs)
    print(
        f"memcheck: {len(logs)} valgrind logs ({len(with_module)} servers with emq.so loaded), "
        f"{sum(len(log.errors) for log in logs)} errors, {ours} attributed to emq.so"
    )
    for line in found:
        print(line, file=sys.stderr)
    if status != 0:
        print(f"memcheck: the tests failed under valgrind (exit {status}); logs: {work}", file=sys.stderr)
        return 1
    if not with_module:
        print("memcheck: no server with emq.so ran under valgrind", file=sys.stderr)
        return 1
    if found:
        print(f"memcheck: FAILED; logs kept in {work}", file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("memcheck: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
