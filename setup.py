"""Build hook: the echomq wheel carries emq.so, compiled from module/ at build time.

Everything declarative lives in pyproject.toml; this file only teaches
setuptools two things it cannot be told there:

* build_py compiles the module with its own Makefile (gcc and make, nothing
  else) and puts emq.so inside the package, where ``echomq.module_path()``
  finds it after ``pip install``.  It builds a private copy of module/ in the
  build's temporary directory, so a wheel is always compiled from the sources
  it ships, never from an emq.so or .o files lying around in the checkout.
  In an editable install (``pip install -e .``) it runs ``make -C module`` in
  the checkout instead and copies nothing: the package then loads
  module/emq.so, which ``make`` keeps fresh, and no stale copy can hide it.

* where the module cannot be compiled (no gcc or make: an sdist installed on a
  slim image), the build says so and goes on without emq.so: the client, the
  workers and the scripts backend need no module, and ``echomq.module_path()``
  then says how to get one.  ``ECHOMQ_REQUIRE_MODULE=1`` (``make wheel``) makes
  that an error instead, so a release wheel always carries the module.

* the wheel is platform-specific.  emq.so is loaded by redis-server, not by
  Python, so the wheel is tagged ``py3-none-<platform>``: any Python 3, one
  operating system and processor.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:  # setuptools >= 70.1 ships bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools: the wheel package's
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent
MODULE_SOURCES = ("Makefile", "*.c", "*.h")


def _make(directory: Path) -> Path:
    subprocess.run(["make", "-C", str(directory)], check=True)
    built = directory / "emq.so"
    if not built.is_file():
        raise RuntimeError(f"make -C {directory} did not produce emq.so")
    return built


def _made(directory: Path) -> Path | None:
    """``_make``, or None (said loudly) where this machine cannot compile it and nobody required it."""
    try:
        return _make(directory)
    except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
        if os.environ.get("ECHOMQ_REQUIRE_MODULE") == "1":
            raise
        print(
            f"WARNING: echomq: the Redis module emq.so could not be built ({exc}); installing without it. "
            "The client, the workers and the scripts backend work without it; for the module, install "
            "gcc and make and reinstall, or install a binary wheel (make wheel).",
            file=sys.stderr,
        )
        return None


class BuildPyWithModule(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            _made(ROOT / "module")
            return
        work = Path(self.get_finalized_command("build").build_temp) / "emq-module"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for pattern in MODULE_SOURCES:
            for source in (ROOT / "module").glob(pattern):
                shutil.copy2(source, work / source.name)
        target = Path(self.build_lib) / "echomq" / "emq.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        built = _made(work)
        if built is not None:
            shutil.copy2(built, target)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        target = Path(self.build_lib) / "echomq" / "emq.so"
        if not getattr(self, "editable_mode", False) and target.is_file():
            outputs.append(str(target))
        return outputs


class BinaryDistribution(Distribution):
    """A distribution with a compiled part: wheels go to platlib and get a platform tag."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):  # type: ignore[misc,valid-type]
    def get_tag(self) -> tuple[str, str, str]:
        _python, _abi, platform = super().get_tag()
        return "py3", "none", platform


setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPyWithModule, "bdist_wheel": PlatformWheel},
)
