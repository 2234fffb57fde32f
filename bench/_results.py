"""Where a bench section keeps its figures: ``bench/results/<name>-<UTC stamp>`` and ``<name>-latest``,
each as ``.json`` (the raw figures) and ``.md`` (the table RESULTS.md quotes)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def save(name: str, res: dict[str, Any], text: str) -> Path:
    """Write one run's figures and table, stamped and as the latest; the stamped table's path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for stem in (f"{name}-{stamp}", f"{name}-latest"):
        (RESULTS / f"{stem}.json").write_text(json.dumps(res, indent=2, default=str))
        (RESULTS / f"{stem}.md").write_text(text)
    return RESULTS / f"{name}-{stamp}.md"
