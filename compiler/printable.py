"""Text from files and devices made safe to print on a terminal.

A model name in a bundle, a device id, a CPU name or a failure reason a device sent can hold escape
sequences (``ESC [``, 8-bit ``CSI``, OSC title and hyperlink codes, bidi overrides) that a terminal
would obey. Every CLI output of such text goes through :func:`printable`.
"""

from __future__ import annotations


def printable(text: object) -> str:
    """``text`` with every non-printable character (controls, format characters, line breaks) shown
    as its Python escape (``\\x1b``, ``\\u202e``, ``\\n``), so what reaches the terminal is only text."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
