"""Progress lines: what a device sent reaches the terminal as text, never as escape sequences or lines."""

from __future__ import annotations

from cuvil.coordinator.progress import ProgressLog

from .helpers import HOSTILE

BAD = HOSTILE + "\nforged line: round 9 done"


def _lines(event: str, **kw) -> list[str]:
    out: list[str] = []
    ProgressLog(out.append)(event, **kw)
    return out


def test_device_strings_are_escaped_in_every_line():
    lines = (_lines("reply", number=1, device=BAD, ok=False, failure="failure", reason=BAD, done=1, of=2)
             + _lines("inventory_error", node_id=3, reason=BAD)
             + _lines("inventory", devices=2, silent=0, classes={BAD: 2})
             + _lines("ab", a="m@1", b="m@2", comparison={BAD: {"devices": 1, "a": 0.5, "b": 0.6, "diff": 0.1,
                                                                 "se": 0.01}}))
    assert len(lines) == 5  # the reply, the inventory error, the inventory, the A/B header and its class
    assert all(line.isprintable() for line in lines)
    for line in lines[:3] + lines[4:]:
        assert "\\x1b]0;owned\\x07" in line and "\\n" in line and "\\u202e" in line


def test_plain_lines_are_unchanged():
    assert _lines("reply", number=1, device="d3", ok=True, failure=None, reason="", done=6, of=6) == [
        "  round 1: d3 reported (6/6)"]


def test_the_wire_line_says_what_deltas_saved_and_why_none_were_sent():
    from cuvil.coordinator.progress import wire_line

    assert wire_line({"full": 0, "delta": 0, "replaced": 0, "deltas": 0, "not_smaller": 0}) is None
    line = wire_line({"full": 500, "delta": 300, "replaced": 1200, "deltas": 2, "not_smaller": 0})
    assert "2 as signed deltas, 300 bytes in place of 1200" in line and "(0.25x)" in line and "500 bytes" in line
    assert "3 to devices holding a parent" in wire_line({"full": 9, "delta": 0, "replaced": 0, "deltas": 0,
                                                          "not_smaller": 3})


def test_rollout_unknown_versions_and_skipped_heartbeats_are_shown():
    from cuvil.coordinator.rollout_rule import Decision

    d = Decision("x86", "rollback", 0, None, None, None, "no canary reported both versions: nothing shows B is safe")
    assert _lines("rollout", device_class="x86", decision=d, applied=1, unknown=1) == [
        "rollout x86: rollback (no canary reported both versions: nothing shows B is safe); 1 devices switched; "
        "1 not known (a switch went unanswered)"]
    assert "1 device(s) left out" in _lines("unknown_versions", devices=1)[0]
    assert _lines("heartbeat_skipped", reason="database is locked") == [
        "heartbeat not written (database is locked): retried at the next beat"]
