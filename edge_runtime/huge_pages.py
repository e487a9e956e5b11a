"""A freshly compiled session's weights collapsed onto huge pages, beside the running session.

Why: a model's weights are streamed from memory on every inference, and on 4 KiB pages every 4 KiB
of them costs a TLB entry; ResNet-18's 54.7 MB span 14,000 pages, where the core's second-level TLB
holds 3,072. A cold compile's block is the lowering's anonymous memory (``aligned_empty`` avoids the
compaction huge pages ask for at allocation: compile time), so it sits on 4 KiB pages; collapsed into
2 MiB ones, the same code ran ResNet-18 0.93x its time at 1 thread, ResNet-50 0.97x (Zen 4). A warm
start's block is the cache entry's file, mapped, which the kernel does not collapse (``EINVAL``) and
which needs it no more: a session on it ran as fast as one on huge pages.

``madvise(MADV_COLLAPSE)`` (Linux 6.1 and later) moves the block in place, one huge page at a time:
the process never holds a second copy, the addresses stay, and the kernel serializes the move with
the code's reads, so the session runs on while a thread of its own waits in the call (ctypes lets go
of the GIL). Only where transparent huge pages are ``madvise`` (with ``always`` the block has them
already; with ``never``, or a huge page over ``MAX_PAGE_BYTES`` as with 64 KiB base pages on arm64,
there are none to have) and the block is ``MIN_BYTES`` or more; a kernel without the call refuses it
and nothing changes.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

MIN_BYTES = 4 << 20
"""Smaller blocks span few pages: the second-level TLB covers 12 MiB of 4 KiB pages on Zen 4."""
MAX_PAGE_BYTES = 32 << 20
"""A huge page larger than this (512 MiB with 64 KiB base pages on arm64) would leave most blocks on small ones."""
MADV_COLLAPSE = 25  # <linux/mman.h>, Linux 6.1
_THP = Path("/sys/kernel/mm/transparent_hugepage")


def huge_page_bytes() -> int | None:
    """The size of the transparent huge page an advised mapping gets here, or None: none without ``[madvise]``
    (``[never]``: off; ``[always]``: big anonymous blocks have them already)."""
    try:
        if "[madvise]" not in (_THP / "enabled").read_text():
            return None
        size = int((_THP / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return None
    return size if 0 < size <= MAX_PAGE_BYTES else None


def collapse(block: np.ndarray) -> bool:
    """Move the whole huge pages inside ``block`` onto huge pages, in place; whether the kernel did. False
    for a block under ``MIN_BYTES``, where huge pages are not ``madvise``, or where the call is refused."""
    page = huge_page_bytes() if len(block) >= MIN_BYTES else None
    if page is None:
        return False
    start = block.ctypes.data
    lo, hi = -(-start // page) * page, (start + len(block)) // page * page
    if hi <= lo:
        return False
    try:
        madvise = ctypes.CDLL(None).madvise  # the C library this process runs on
    except (OSError, AttributeError):
        return False
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise(lo, hi - lo, MADV_COLLAPSE) == 0
