"""Freed heap pages go back to the system."""

import ctypes

import pytest

from cuvil.edge_runtime import heap


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(getattr(ctypes.CDLL(None), "malloc_trim", None) is None,
                    reason="malloc_trim is glibc's; with another C library the call is a no-op")
def test_freed_heap_pages_go_back_to_the_system():
    held = [b"x" * 65536 for _ in range(2000)]  # 125 MiB of heap chunks (below the mmap threshold), touched
    pinned = held[::8]  # every eighth stays: the heap cannot shrink from its top
    del held
    before = _rss_mib()
    heap.release()
    after = _rss_mib()
    assert before - after > 60, (before, after)
    assert len(pinned) == 250
