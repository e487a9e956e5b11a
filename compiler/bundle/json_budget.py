"""Parsing signed JSON without letting it choose how much memory the parse takes.

``json.loads`` builds every list, string and number before any check can look at them, and its
object hook never sees a list: a 158 kB bundle whose 64 MiB manifest was nested empty lists made
the reader build 22 million lists (3.4 GB, 20 s) before refusing it, whoever signed it
(``cuvil inspect`` reads an untrusted signer's manifest). So the text is counted first, in linear
time and without building anything: strings (by their quotes), containers and values (by their
brackets and commas, outside strings), each against a budget that the manifest's own limits give.
Only text within the budget is parsed, and the object hook still stops at the object budget.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


@dataclass(frozen=True)
class JsonBudget:
    """The most of each kind a well-formed document of this kind can hold (the parse builds no more)."""

    objects: int
    strings: int
    containers: int  # objects and lists
    values: int  # elements and members, counted by their separating commas


def over_budget(data: bytes, budget: JsonBudget) -> str | None:
    """What ``data`` holds more of than ``budget`` allows, or None. Each string's opening quote is never
    escaped, so quotes less escaped quotes bound the strings from above; brackets and commas are
    counted on the text with its strings taken out, which is done only when the raw counts (strings
    included, so never fewer) are over, and only once the strings are known to be few."""
    if data.count(b'"') - data.count(b'\\"') > 2 * budget.strings:
        return f"more than {budget.strings} strings"

    def containers(text: bytes) -> int:
        return text.count(b"[") + text.count(b"{")

    if containers(data) <= budget.containers and data.count(b",") <= budget.values:
        return None
    bare = _STRING.sub(b"", data)
    if containers(bare) > budget.containers:
        return f"more than {budget.containers} objects and lists"
    if bare.count(b",") > budget.values:
        return f"more than {budget.values} values"
    return None


def loads_bounded(data: bytes, budget: JsonBudget, error: type[Exception], what: str) -> Any:
    """``data`` parsed as integer-only JSON within ``budget``; ``error`` for anything else (too much of
    something, invalid JSON, a float, nesting past the recursion limit, no memory left)."""
    problem = over_budget(data, budget)
    if problem is not None:
        raise error(f"the {what} holds {problem} (this device's limit)")
    try:
        return json.loads(data.decode("utf-8"), parse_float=_no_floats, parse_constant=_no_floats,
                          object_pairs_hook=_ObjectBudget(budget.objects, error, what))
    except (ValueError, RecursionError) as e:
        raise error(f"{what} is not valid JSON: {_short(e)}") from None
    except MemoryError:
        raise error(f"the {what} ({len(data)} bytes) does not fit in this device's memory") from None


class _ObjectBudget:
    """A JSON ``object_pairs_hook`` that refuses more than ``left`` objects."""

    def __init__(self, left: int, error: type[Exception], what: str):
        self.left, self.error, self.what = left, error, what

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        self.left -= 1
        if self.left < 0:
            raise self.error(f"the {self.what} lists more entries than this device's limit")
        return dict(pairs)


def _no_floats(text: str) -> Any:
    raise ValueError(f"non-integer number {text[:20]!r}")


def _short(e: Exception) -> str:
    """An exception's first line, at most 200 characters (it may quote the hostile input)."""
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__
