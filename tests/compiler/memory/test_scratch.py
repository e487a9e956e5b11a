"""check_worker_scratch: regions of one split layer apart, after the tensors, inside the arena."""

from __future__ import annotations

import pytest

from cuvil.compiler.memory.checker import PlanError
from cuvil.compiler.memory.scratch import check_worker_scratch


def test_disjoint_parts_and_reuse_across_layers_pass():
    check_worker_scratch([("a", 0, 1024, 1536), ("a", 1, 1536, 2048), ("b", 0, 1024, 2048), ("b", 1, 2048, 3072)],
                         tensors_end=1024, arena_bytes=3072)


@pytest.mark.parametrize("spans,why", [
    ([("a", 0, 1024, 1600), ("a", 1, 1536, 2048)], "share scratch bytes"),  # parts overlap
    ([("a", 0, 960, 1024)], "between the tensors"),  # over the last tensor
    ([("a", 0, 1024, 4096)], "between the tensors"),  # past the arena
    ([("a", 0, 1040, 1100)], "aligned"),  # not on a cache line
])
def test_unsafe_scratch_is_refused(spans, why):
    with pytest.raises(PlanError, match=why):
        check_worker_scratch(spans, tensors_end=1024, arena_bytes=3072)
