"""The main job: the demo runs for real and its timeline shows every act."""

from __future__ import annotations

import io
import re

import pytest

from echomq import _demo as demo


@pytest.mark.slow
def test_demo_tells_the_whole_story() -> None:
    out = io.StringIO()
    story = demo.run(out)
    text = out.getvalue()

    # A timeline stamped with the server's clock.
    assert re.search(r"^  \d\d:\d\d:\d\d\.\d{3}  \+\s*\d+ ms  ", text, re.M)
    # Leases were checkpointed while handlers ran.
    assert story.checkpoints > 0 and "checkpoint, lease now ends at" in text

    # Killed mid-job: recovered by the reaper and finished by another worker.
    resize_holders = story.who("resize", "start")
    assert len(resize_holders) >= 2 and resize_holders[-1] != resize_holders[0]
    assert story.states["resize"] == "done"
    assert any(e["kind"] == "sweep" and "resize" in e["what"] for e in story.events)

    # Poison: one crash per stall, dead-lettered at max-stalled.
    assert story.kinds("poison").count("crash") == demo.MAX_STALLED
    assert story.states["poison"] == "dead"

    # Cancelled from outside: the handler stopped at its next check.
    stopped = [e["what"] for e in story.events if e["job"] == "export" and e["kind"] == "stopped"]
    assert stopped and "the customer withdrew the export" in stopped[0]
    assert story.states["export"] == "cancelled"

    # Frozen past its lease: the keeper stopped the handler; another worker finished.
    lost = [e for e in story.events if e["job"] == "upload" and e["kind"] == "stopped"]
    assert lost and "lease lost" in lost[0]["what"]
    assert lost[0]["who"] != story.who("upload", "finished")[-1]
    assert story.states["upload"] == "done"

    assert story.counts == {"pending": 0, "active": 0, "dead": 1, "failed": 1, "done": 4, "cancelled": 1}
    assert text.rstrip().endswith("cancelled 1")
