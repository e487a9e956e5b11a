"""Per backend: every op of the op table has an emitter, and no emitter is left for an op that is gone.

A backend may leave an op out only with a reason here (none does today). FusedElementwise programs
run their steps through the element emitters both backends share, so every fusable op needs one.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from cuvil.compiler.codegen.cpu.kernels import KERNELS
from cuvil.compiler.codegen.nvptx.ops import EMITTERS
from cuvil.compiler.codegen.scalar_ops import ELEMENT_EMITTERS
from cuvil.compiler.ops import OP_TABLE

BACKENDS: dict[str, tuple[Mapping, Mapping[str, str]]] = {
    # backend -> (op -> emitter, op -> why the backend cannot support it)
    "cpu": (KERNELS, {}),
    "nvptx": (EMITTERS, {}),
}


def uncovered(emitters: Mapping, excluded: Mapping[str, str]) -> list[str]:
    """Ops of the op table without an emitter and without a reasoned exclusion."""
    return sorted(op for op in OP_TABLE if op not in emitters and op not in excluded)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_op_has_an_emitter(backend):
    emitters, excluded = BACKENDS[backend]
    assert uncovered(emitters, excluded) == []
    assert sorted(set(emitters) - set(OP_TABLE)) == []  # an emitter for an op the table no longer has
    assert all(reason and op not in emitters for op, reason in excluded.items())


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_missing_emitter_is_caught(backend):
    emitters, excluded = BACKENDS[backend]
    for op in ("HardSwish", "FusedConv", "Reshape"):
        assert uncovered({k: v for k, v in emitters.items() if k != op}, excluded) == [op]


def test_every_fusable_op_has_element_code():
    fusable = {op for op, d in OP_TABLE.items() if d.fusable}
    assert fusable and fusable <= set(ELEMENT_EMITTERS)
    assert sorted(op for op in ELEMENT_EMITTERS if not OP_TABLE[op].elementwise) == []
