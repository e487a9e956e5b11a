"""Guard pages: a buffer between two inaccessible (``PROT_NONE``) pages, so a read or write past
either end faults at once instead of touching a neighbour's memory.

The guard-page mode of a Session (``compile_graph(..., guard_pages=True)``) puts its arena and its
weights in such buffers: a debugging and testing mode (tests run the zoo, the architecture set
and the op fuzzer in it), not the default, since the weights are then copied rather than mapped.
A buffer ends at the upper guard (rounded up to the alignment) or, with ``at_end=False``, starts
at the lower one, so an overrun of either kind can be caught.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

from ..compiler.errors import LimitError

PAGE = mmap.PAGESIZE
PROT_NONE = 0  # not in the mmap module
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _protect(address: int, nbytes: int, prot: int) -> None:
    if _LIBC.mprotect(address, nbytes, prot) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")


def guarded(nbytes: int, align: int = 64, at_end: bool = True) -> np.ndarray:
    """A zeroed, writable uint8 buffer of ``nbytes``, ``align``-aligned, between two PROT_NONE pages."""
    span = -(-max(nbytes, 1) // align) * align
    inner = -(-span // PAGE) * PAGE
    try:
        mm = mmap.mmap(-1, inner + 2 * PAGE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)  # a forked child's writes stay its own
    except (OSError, MemoryError, OverflowError):
        raise LimitError(f"{nbytes} bytes between guard pages do not fit in this process's memory") from None
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    _protect(base, PAGE, PROT_NONE)
    _protect(base + PAGE + inner, PAGE, PROT_NONE)
    start = PAGE + (inner - span if at_end else 0)
    return np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=start)


def make_read_only(buf: np.ndarray) -> None:
    """Forbid writes to ``buf`` (from :func:`guarded`) in hardware too: its pages become PROT_READ."""
    first = buf.ctypes.data // PAGE * PAGE
    last = -(-(buf.ctypes.data + max(len(buf), 1)) // PAGE) * PAGE
    _protect(first, last - first, mmap.PROT_READ)
    buf.flags.writeable = False
