"""The demo loop's own progress lines (the run itself is tests/coordinator's and the demo's CI run)."""

from __future__ import annotations

from cuvil.coordinator.rollout_rule import Decision
from cuvil.demo_loop import LoopProgress


def test_a_rollout_line_counts_devices_whose_version_is_unknown_and_prints_names_safely():
    lines: list[str] = []
    d = Decision("x86\x1b[2J", "rollback", 0, None, None, None, "B worse")
    LoopProgress(lines.append)("rollout", device_class="x86\x1b[2J", decision=d, applied=3, unknown=2)
    assert len(lines) == 1 and "\x1b" not in lines[0]
    assert lines[0].endswith("rollout x86\\x1b[2J: rollback (B worse); 3 devices switched; "
                             "2 not known (a switch went unanswered)")
