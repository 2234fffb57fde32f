"""Where emq.so is: ``echomq.module_path()``, the path to give ``redis-server --loadmodule``."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["module_path"]

_PACKAGE_DIR = Path(__file__).resolve().parent
_SOURCE_MODULE_DIR = _PACKAGE_DIR.parent.parent / "module"


def module_path() -> Path:
    """The emq.so to load, for ``redis-server --loadmodule``.

    In this order: ``$ECHOMQ_MODULE`` if set; else, when this package runs
    from a source checkout (an editable install, or ``python/`` on the path),
    the checkout's ``module/emq.so``, the one ``make -C module`` keeps fresh;
    else the emq.so that ``pip install`` put inside the package.  A checkout
    never consults a copy inside the package, so a stale one cannot hide the
    module just rebuilt.

    Raises FileNotFoundError, saying how to build it, when there is none.
    """
    env = os.environ.get("ECHOMQ_MODULE")
    if env:
        candidates = [Path(env)]
    elif _in_checkout():
        candidates = [_SOURCE_MODULE_DIR / "emq.so"]
    else:
        candidates = [_PACKAGE_DIR / "emq.so"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise FileNotFoundError(
        f"emq.so not found (looked at {', '.join(map(str, candidates))}); "
        "build it with `make -C module`, reinstall the package (pip install echomq), or set ECHOMQ_MODULE"
    )


def _in_checkout() -> bool:
    """True when this package is the ``python/echomq`` of a source tree beside ``module/``."""
    return _PACKAGE_DIR.parent.name == "python" and (_SOURCE_MODULE_DIR / "Makefile").is_file()
