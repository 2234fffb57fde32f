"""The main job: the demo runs for real and its timeline shows every act."""

from __future__ import annotations

import io
import re

import pytest

from echomq import _demo as demo

pytestmark = pytest.mark.once


@pytest.mark.slow
def test_demo_tells_the_whole_story() -> None:
    out = io.StringIO()
    story = demo.run(out)
    text = out.getvalue()

    # A timeline stamped with the server's clock.
    assert re.search(r"^  \d\d:\d\d:\d\d\.\d{3}  \+\s*\d+ ms  ", text, re.M)
    # Leases were checkpointed while handlers ran.
    assert story.checkpoints > 0 and "checkpoint, lease now ends at" in text

    # Killed mid-export: recovered by the reaper, and another worker resumed it from
    # the step of its last checkpoint (not from step 1), the state's server time shown.
    holders = story.who("export", "start")
    assert len(holders) == 2 and holders[0] != holders[1]
    assert any(e["kind"] == "sweep" and "export" in e["what"] for e in story.events)
    last = story.killed_at_step
    assert last >= demo.KILL_AT_STEP - 1  # killed right after reporting the step, maybe before storing it
    (resume,) = [e for e in story.events if e["job"] == "export" and e["kind"] == "resume"]
    assert resume["who"] == holders[1] and resume["step"] == last + 1
    assert re.search(r"stored \d\d:\d\d:\d\d\.\d{3} server time by attempt 1", resume["what"])
    assert re.search(rf"export's last checkpoint: step {last} done, stored \d\d:\d\d:\d\d\.\d{{3}}", text)
    steps = story.steps("export")
    first = [step for who, step in steps if who == holders[0]]
    second = [step for who, step in steps if who == holders[1]]
    assert first[:last] == list(range(1, last + 1))  # (it may have run a step past its last checkpoint)
    assert second == list(range(last + 1, 41))  # resumed at the next step, none done twice since it
    assert story.states["export"] == "done"

    # Poison: one crash per stall, dead-lettered at max-stalled.
    assert story.kinds("poison").count("crash") == demo.MAX_STALLED
    assert story.states["poison"] == "dead"

    # Cancelled from outside: the handler stopped at its next check.
    stopped = [e["what"] for e in story.events if e["job"] == "resize" and e["kind"] == "stopped"]
    assert stopped and "the customer withdrew the resize" in stopped[0]
    assert story.states["resize"] == "cancelled"

    # Frozen past its lease: the keeper stopped the handler; another worker finished.
    lost = [e for e in story.events if e["job"] == "upload" and e["kind"] == "stopped"]
    assert lost and "lease lost" in lost[0]["what"]
    assert lost[0]["who"] != story.who("upload", "finished")[-1]
    assert story.states["upload"] == "done"

    assert story.counts == {"pending": 0, "active": 0, "dead": 1, "failed": 1, "done": 4, "cancelled": 1}
    assert text.rstrip().endswith("cancelled 1")
