"""Packaging: the wheel carries emq.so, and module_path() finds the right one.

The slow test does what a user who never cloned the repository does: build
the sdist and, from it, the wheel; install the wheel into a fresh virtual
environment; from a directory outside the source tree ask
``python -m echomq module-path``; start redis-server with that path; and run
an EXTEND/SWEEP round trip with the installed package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from echomq.testing import EmbeddedServer

pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parents[2]

# Run by the fresh environment's python: only the installed package is importable there.
ROUND_TRIP = r"""
import json, sys
import echomq, redis

url = sys.argv[1]
r = redis.Redis.from_url(url)
client = echomq.Client.from_url(url)
keys = echomq.keyspace.queue_keys("pkg")
r.hset(keys.job("7"), mapping={"attempts": 2, "token": "2", "state": "active"})
r.zadd(keys.active, {"7": 0})
out = {"package": echomq.__file__, "module": str(echomq.module_path())}
client.extend("pkg", "7", token="2", lease_ms=600_000)
out["lease_ms_left"] = int(r.zscore(keys.active, "7")) - int(r.time()[0]) * 1000
out["early_sweep"] = len(client.sweep("pkg", max_stalled=2))
try:
    client.extend("pkg", "7", token="1", lease_ms=1000)
    out["stale"] = "accepted"
except echomq.StaleToken:
    out["stale"] = "refused"
r.zadd(keys.active, {"7": 0})  # the worker vanished: its lease lapsed long ago
result = client.sweep("pkg", max_stalled=2)
out["recovered"], out["dead"] = result.recovered, result.dead
out["state"] = r.hget(keys.job("7"), "state").decode()
out["pending"] = [m.decode() for m in r.lrange(keys.pending, 0, -1)]
print(json.dumps(out))
"""


def _clean_env() -> dict[str, str]:
    """The environment of a user who never cloned the repository."""
    env = {k: v for k, v in os.environ.items() if k not in ("ECHOMQ_MODULE", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, env=env or _clean_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"{argv} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from it, as `python -m build` does for a release."""
    out = tmp_path_factory.mktemp("dist")
    argv = [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)]
    proc = subprocess.run(argv, cwd=out, env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{argv} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    (out / "build.log").write_text(proc.stdout + proc.stderr)
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("echomq-*.whl")
    return wheel


@pytest.mark.slow
def test_wheel_is_platform_specific_and_carries_the_module(dist: Path) -> None:
    wheel = _wheel(dist)
    python_tag, abi_tag, platform_tag = wheel.name[: -len(".whl")].split("-")[-3:]
    assert (python_tag, abi_tag) == ("py3", "none")  # the .so is loaded by redis-server, not by Python
    assert platform_tag == sysconfig.get_platform().replace("-", "_").replace(".", "_")  # e.g. linux_x86_64
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert {"echomq/emq.so", "echomq/__init__.py", "echomq/py.typed"} <= names
        # The scripts backend's Lua, every file of it.
        lua = {f"echomq/scripts/{p.name}" for p in (ROOT / "python" / "echomq" / "scripts").glob("*.lua")}
        assert len(lua) > 18 and lua <= names
        dashboard = {f"echomq/dashboard/static/{name}" for name in ("index.html", "app.js", "app.css")}
        assert dashboard <= names, "the dashboard's page must ship inside the wheel"
        assert zf.read("echomq/emq.so")[:4] == b"\x7fELF"
        (wheel_meta,) = (n for n in names if n.endswith(".dist-info/WHEEL"))
        meta = zf.read(wheel_meta).decode()
    assert "Root-Is-Purelib: false" in meta
    assert f"Tag: py3-none-{platform_tag}" in meta

    (sdist,) = dist.glob("echomq-*.tar.gz")
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    expected = {"setup.py", "module/Makefile", "module/emq.c", "module/emq_core.c", "module/emq_rm.h"}
    assert expected <= members
    assert not [m for m in members if m.endswith((".so", ".o"))], "the sdist ships compiled files"


@pytest.mark.slow
def test_the_build_warns_of_nothing_and_the_wheel_states_its_license(dist: Path) -> None:
    # Every build (and `pip install`) printed setuptools' "`project.license` as a TOML table is
    # deprecated" three times: the license is now an SPDX expression (PEP 639).
    log = (dist / "build.log").read_text()
    assert "deprecated" not in log.lower(), log
    with zipfile.ZipFile(_wheel(dist)) as zf:
        (metadata,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        headers = zf.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: BSD-3-Clause" in headers


def _no_compiler(venv: Path) -> dict[str, str]:
    """An environment whose PATH is the venv's bin alone: no gcc, cc or make, as on a slim image."""
    env = _clean_env()
    env["PATH"] = str(venv / "bin")
    for tool in ("gcc", "cc", "make"):
        assert shutil.which(tool, path=env["PATH"]) is None, f"{tool} is on the stripped PATH"
    return env


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A fresh virtual environment outside the source tree with only the wheel (and redis-py) installed.

    Installed where no compiler can be found (issue 42): a binary wheel needs none.
    """
    home = tmp_path_factory.mktemp("user")
    venv = home / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=home)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(_wheel(dist))], cwd=home, env=_no_compiler(venv))
    yield python, home
    shutil.rmtree(venv, ignore_errors=True)


@pytest.mark.slow
def test_the_sdist_without_a_compiler_installs_the_client_and_says_so(
    dist: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    home = tmp_path_factory.mktemp("slim")
    venv = home / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=home)
    python = venv / "bin" / "python"
    (sdist,) = dist.glob("echomq-*.tar.gz")
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-v", str(sdist)],
        cwd=home, env=_no_compiler(venv), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = pip.stdout + pip.stderr
    assert pip.returncode == 0, out
    assert "the Redis module emq.so could not be built" in out and "installing without it" in out
    missing = subprocess.run(
        [str(python), "-m", "echomq", "module-path"],
        cwd=home, env=_clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode != 0 and "emq.so not found" in missing.stderr
    with EmbeddedServer(load_module=False) as server:
        code = (
            "import echomq, sys; c = echomq.Client.from_url(sys.argv[1]); c.enqueue('q', b'x', job_id='a'); "
            "j = c.claim('q', lease_ms=1000); c.complete('q', j.id, j.token); print(c.backend, j.id)"
        )
        assert _run([str(python), "-c", code, server.url], cwd=home).split() == ["scripts", "a"]
    shutil.rmtree(venv, ignore_errors=True)


@pytest.mark.slow
def test_installed_wheel_serves_the_module_outside_the_source_tree(installed: tuple[Path, Path]) -> None:
    python, home = installed
    assert not home.resolve().is_relative_to(ROOT)
    reported = Path(_run([str(python), "-m", "echomq", "module-path"], cwd=home).strip())
    venv = python.parent.parent
    assert reported.is_file() and reported.name == "emq.so"
    assert reported.is_relative_to(venv.resolve()), f"{reported} is not the installed copy"

    with EmbeddedServer(module=reported) as server:
        modules = server.client().execute_command("MODULE", "LIST")
        assert [m[b"path"].decode() for m in modules if m[b"name"] == b"emq"] == [str(reported)]
        out = json.loads(_run([str(python), "-c", ROUND_TRIP, server.url], cwd=home))

    assert Path(out["package"]).is_relative_to(venv.resolve())
    assert out["module"] == str(reported)
    assert 590_000 < out["lease_ms_left"] <= 601_000
    assert out["early_sweep"] == 0
    assert out["stale"] == "refused"
    assert (out["recovered"], out["dead"]) == (["7"], [])
    assert (out["state"], out["pending"]) == ("pending", ["7"])


@pytest.mark.slow
def test_installed_wheel_runs_the_scripts_without_the_module(installed: tuple[Path, Path]) -> None:
    python, home = installed
    with EmbeddedServer(load_module=False) as server:
        code = (
            "import echomq, sys; c = echomq.Client.from_url(sys.argv[1]); c.enqueue('q', b'x', job_id='a'); "
            "j = c.claim('q', lease_ms=1000); c.complete('q', j.id, j.token); print(c.backend, j.id)"
        )
        assert _run([str(python), "-c", code, server.url], cwd=home).split() == ["scripts", "a"]


# module_path()'s order, on copies of the package laid out as a checkout and as an install.


def _lay_out(tmp_path: Path, checkout: bool) -> tuple[Path, Path, Path]:
    """python/echomq with its own emq.so, and (for a checkout) module/ beside it; returns the three paths."""
    package = tmp_path / "python" / "echomq"
    shutil.copytree(ROOT / "python" / "echomq", package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    package_copy = package / "emq.so"
    package_copy.write_bytes(b"stale copy inside the package")
    source = tmp_path / "module" / "emq.so"
    if checkout:
        source.parent.mkdir()
        (source.parent / "Makefile").write_text("# the module's build\n")
        source.write_bytes(b"just rebuilt by make -C module")
    return package, package_copy, source


def _module_path(package: Path, env_module: Path | None = None) -> tuple[str, str]:
    env = _clean_env()
    env["PYTHONPATH"] = str(package.parent)
    if env_module is not None:
        env["ECHOMQ_MODULE"] = str(env_module)
    code = "import echomq; print(echomq.__file__); print(echomq.module_path())"
    where, found = _run([sys.executable, "-c", code], cwd=package.parent, env=env).splitlines()
    return where, found


def test_module_path_in_a_checkout_is_the_one_make_builds(tmp_path: Path) -> None:
    package, _package_copy, source = _lay_out(tmp_path, checkout=True)
    where, found = _module_path(package)
    assert Path(where).parent == package
    assert found == str(source.resolve())


def test_module_path_of_an_install_is_the_packaged_copy(tmp_path: Path) -> None:
    package, package_copy, _source = _lay_out(tmp_path, checkout=False)
    _where, found = _module_path(package)
    assert found == str(package_copy.resolve())


def test_module_path_env_wins(tmp_path: Path) -> None:
    package, _package_copy, _source = _lay_out(tmp_path, checkout=True)
    chosen = tmp_path / "elsewhere.so"
    chosen.write_bytes(b"chosen by the operator")
    _where, found = _module_path(package, env_module=chosen)
    assert found == str(chosen.resolve())


def test_module_path_cli_says_how_to_get_the_module(tmp_path: Path) -> None:
    package, package_copy, _source = _lay_out(tmp_path, checkout=False)
    package_copy.unlink()
    env = _clean_env()
    env["PYTHONPATH"] = str(package.parent)
    proc = subprocess.run(
        [sys.executable, "-m", "echomq", "module-path"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert "emq.so not found" in proc.stderr and "make -C module" in proc.stderr
