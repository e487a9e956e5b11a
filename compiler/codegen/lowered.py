"""What a lowering hands the runtime, apart from the lowering itself: the lowered model, where each
input and output lives, and the buffers it runs on. A cache hit builds these without importing
the code generator (its kernels, passes and op table: ~7 MB and ~100 modules of a device process).
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import numpy as np

from ..errors import BoundedCountError, LimitError
from ..ir.dtypes import DType
from ..ir.types import COUNT_BYTES, TensorType
from ..memory.plan import MemoryPlan
from ..target import Target


@dataclass(frozen=True)
class IOSpec:
    """Where a graph input or output lives in the arena."""

    name: str
    offset: int
    dtype: DType
    shape: tuple[int, ...]
    bounded_axis: int | None = None  # this dimension is a bound; the valid length follows (TensorType.bounded_axis)

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, self.shape, self.bounded_axis)

    @property
    def bounded(self) -> bool:
        return self.bounded_axis is not None

    @property
    def nbytes(self) -> int:
        return self.type.nbytes()

    @property
    def row_bytes(self) -> int:
        """The bytes of its elements (the whole bound), without a bounded value's valid length."""
        return math.prod(self.shape) * self.dtype.itemsize

    def take(self, span: np.ndarray) -> np.ndarray:
        """A copy of the value from its ``nbytes`` bytes (uint8): a bounded one's valid part only."""
        rows = span[:self.row_bytes].view(self.dtype.numpy).reshape(self.shape)
        axis = self.bounded_axis
        if axis is None:
            return rows.copy()
        at = self.type.count_offset()
        count = int(span[at:at + COUNT_BYTES].view("<i8")[0])
        if not 0 <= count <= self.shape[axis]:
            raise BoundedCountError(f"output {self.name[:80]!r}: length {count} written, its bound is {self.shape[axis]}")
        return rows[(slice(None),) * axis + (slice(0, count),)].copy()


@dataclass(frozen=True)
class LoweredModel:
    llvm_ir: str
    entry: str
    weights: np.ndarray | bytes  # lower(): read-only uint8, 64-byte aligned; b"" where the block lives elsewhere
    plan: MemoryPlan
    arena_bytes: int  # the plan's arena, with the kernels' scratch where it did not fit between values
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    kernel_count: int
    target: Target
    batch: int
    node_count: int
    profile_offset: int | None = None  # arena offset of one u64 cycle counter per profiled node
    profile_nodes: tuple[str, ...] = ()
    fault_offset: int | None = None  # arena offset of the i32 a run-time check sets (OpDef.run_time_check)
    scratch_spans: tuple = ()  # memory.scratch.ScratchSpan of each kernel's (each part's) scratch: node, steps, bytes
    split_nodes: int = 0  # layers whose work is shared by the threads
    split_settled: bool = True  # False: the whole-model check kept it whole without free cores to time on
    split_reason: str = ""  # the whole-model check's verdict and figures (edge_runtime/split_check.py)
    workers: bool = True  # False: a split build the check kept whole, unsettled; its parts run on the caller until
    # the session's watch finds the workers pay (edge_runtime/split_check.py: keeps_built)

    @property
    def threads(self) -> int:
        return self.target.threads


_PRIVATE_POPULATED = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)


def private_map(nbytes: int) -> mmap.mmap:
    """An anonymous private mapping of ``nbytes`` (at least one), untouched: pages count once written."""
    try:
        return mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError, OverflowError):
        raise LimitError(f"{nbytes} bytes for the weights do not fit in this process's memory") from None


def grow(m: mmap.mmap, nbytes: int) -> None:
    """Resize a :func:`private_map` in place or by remapping (its bytes kept, new pages zero); LimitError if it cannot."""
    try:
        m.resize(nbytes)
    except (OSError, ValueError, OverflowError):
        raise LimitError(f"{nbytes} bytes for the weights do not fit in this process's memory") from None


def aligned_empty(nbytes: int) -> np.ndarray:
    """A zeroed uint8 buffer in an anonymous mapping of its own: page-aligned (so 64-byte aligned),
    given back to the system when the array goes, and first touched without the transparent-huge-page
    compaction numpy asks for on big arrays (57 MB of packed weights: 48 vs 120 CPU-ms on a Zen 4
    host). Private, so a forked child's writes stay its own, and populated at once: the callers fill
    or run on every page, and one mapping call faults them in faster than a fault per page does (a
    1.7 MB arena: 0.46 vs 1.04 ms; shared memory, ``mmap``'s default, is slower still to fault).
    LimitError when it does not fit."""
    try:
        return np.frombuffer(mmap.mmap(-1, max(nbytes, 1), flags=_PRIVATE_POPULATED), dtype=np.uint8)[:nbytes]
    except (OSError, ValueError, OverflowError):
        raise LimitError(f"{nbytes} bytes for the arena or weights do not fit in this process's memory") from None
