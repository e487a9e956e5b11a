"""Signed JSON that would make the parser build far more than any real manifest holds: refused first."""

from __future__ import annotations

import tracemalloc

import pytest

from cuvil.compiler.bundle.delta_format import DeltaManifest
from cuvil.compiler.bundle.json_budget import JsonBudget, over_budget
from cuvil.compiler.bundle.reader import read_head
from cuvil.compiler.errors import BundleError, DeltaError
from cuvil.compiler.ir.limits import DEFAULT_LIMITS, Limits

from .helpers import new_key, resign

N = 1_000_000
SMALL = Limits(max_nodes=10_000)  # a budget every bomb below is over (the default's is over some)
BOMBS = {
    "empty lists": b"[" + b"[]," * N + b"[]]",
    "nested lists": b"[" + b",".join([b"[" * 50 + b"]" * 50] * (N // 50)) + b"]",
    "zeros": b"[" + b"0," * (2 * N) + b"0]",
    "empty strings": b"[" + b'"",' * N + b'""]',
    "empty objects": b"[" + b"{}," * N + b"{}]",
}


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name, limits", [(name, SMALL) for name in sorted(BOMBS)] + [("nested lists", DEFAULT_LIMITS)])
def test_a_manifest_bomb_is_refused_before_it_is_built(name, limits):
    """Whoever signed it (``cuvil inspect`` reads an untrusted signer's manifest): the parse would build a
    million values (tens of MB; a 64 MiB manifest of them took 3.4 GB); the budget, which the limits
    give, refuses it holding little more than the manifest's bytes and a copy."""
    text = BOMBS[name]
    bundle = resign(text, b"", new_key())

    def read():
        with pytest.raises(BundleError, match="this device's limit"):
            read_head(bundle, len(bundle), (), limits)

    assert _peak(read) < 4 * len(text) + (1 << 20)


@pytest.mark.parametrize("name", ["empty lists", "empty strings", "zeros"])
def test_a_delta_manifest_bomb_is_refused_before_it_is_built(name):
    text = BOMBS[name]

    def decode():
        with pytest.raises(DeltaError, match="this device's limit"):
            DeltaManifest.decode(text)

    assert _peak(decode) < 2 * len(text) + (1 << 20)


BUDGET = JsonBudget(objects=4, strings=4, containers=4, values=4)


@pytest.mark.parametrize("text, problem", [
    (b'{"graph":"' + b"[{,}]" * 10_000 + b'"}', None),  # brackets and commas inside a string are text
    (b'{"a":"x\\"[[[[[,,,,,\\"y","b":[1,2]}', None),  # escaped quotes do not end the string
    (b'{"a":"\\\\","b":[1,2,3]}', None),  # an escaped backslash before the closing quote
    (b'[[[[[]]]]]', "objects and lists"),
    (b'[1,2,3,4,5,6]', "values"),
    (b'["a","b","c","d","e"]', "strings"),
    (b'{"a":"[[[[[","b":[[[[[]]]]]}', "objects and lists"),
])
def test_over_budget_counts_structure_outside_strings(text, problem):
    found = over_budget(text, BUDGET)
    assert (found is None) if problem is None else (problem in found)
