"""How much of a string a device sent the coordinator keeps: the one cut, for the store and the progress lines.

A device may send any text (a name, a class, a 1 MiB failure reason). It is shown escaped wherever it
appears (``printable``); it is also cut here before it is stored, emitted as an event or quoted in
an error, so no device makes a row, a progress line or an error message as long as it likes.
"""

from __future__ import annotations

TEXT_CHARS = 200  # an info field (class, CPU, ISA, runtime version)
FEATURES_CHARS = 2000  # the CPU feature list
REASON_CHARS = 2000  # a failure reason, or why a run was aborted
EXCERPT_CHARS = 64  # a device's string quoted inside an error (an array's name, a dtype)


def cut(value: object, limit: int = TEXT_CHARS) -> str:
    """``value`` as text, at most ``limit`` characters."""
    return str(value)[:limit]


def cut_reason(reason: object) -> str:
    """A reason as the store keeps it, and as events carry it."""
    return cut(reason, REASON_CHARS)


def excerpt(value: object) -> str:
    """A device's string for an error message: its start, quoted and escaped (``repr``)."""
    return repr(cut(value, EXCERPT_CHARS))
