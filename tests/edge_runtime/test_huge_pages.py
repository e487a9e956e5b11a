"""A freshly compiled session's weights moved onto huge pages in place (edge_runtime/huge_pages.py)."""

from __future__ import annotations

import platform
import threading

import numpy as np
import pytest

from cuvil.compiler.codegen.lowered import aligned_empty
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir.types import TensorType
from cuvil.edge_runtime import huge_pages
from cuvil.edge_runtime.compile import compile_graph
from cuvil.edge_runtime.huge_pages import MIN_BYTES, collapse, huge_page_bytes

KERNEL = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2] if p.isdigit())
needs_thp = pytest.mark.skipif(huge_page_bytes() is None or KERNEL < (6, 1),
                               reason="needs Linux 6.1+ with transparent huge pages 'madvise' (the build machines')")


def _wide_layer():
    """One fully connected layer whose 4.5 MB of weights are over MIN_BYTES; an input for it."""
    rng = np.random.default_rng(4)
    b = GraphBuilder("wide")
    x = b.input("x", TensorType.parse("f32[1,1152]"))
    w = b.constant(rng.standard_normal((1152, 1024)).astype(np.float32) / 32)
    return b.build([b.add1("MatMul", [x, w])]), {"x": rng.standard_normal((1, 1152)).astype(np.float32)}


def _huge_kib(address: int) -> int:
    """AnonHugePages of the mapping holding ``address``, as /proc/self/smaps says."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def _moved() -> None:
    """Wait for the session's move to end (it starts after a run)."""
    for t in threading.enumerate():
        if t.name == "cuvil-weights":
            t.join(30)


@needs_thp
def test_a_block_moves_onto_huge_pages_in_place_with_its_bytes():
    block = aligned_empty(3 * (2 << 20) + 12345)
    block[:] = np.random.default_rng(1).integers(0, 256, len(block), dtype=np.uint8)
    before, address = block.tobytes(), block.ctypes.data
    assert _huge_kib(address) == 0  # the lowering's memory: 4 KiB pages
    assert collapse(block)
    assert block.ctypes.data == address and block.tobytes() == before and _huge_kib(address) >= 2048


def test_no_move_for_a_small_block_or_where_huge_pages_are_not_madvise(tmp_path, monkeypatch):
    assert not collapse(np.zeros(MIN_BYTES - 1, np.uint8))
    (tmp_path / "hpage_pmd_size").write_text("2097152\n")
    monkeypatch.setattr(huge_pages, "_THP", tmp_path)
    for setting, page in (("always madvise [never]", None), ("[always] madvise never", None),
                          ("always [madvise] never", 2 << 20)):
        (tmp_path / "enabled").write_text(setting + "\n")
        assert huge_page_bytes() == page
    (tmp_path / "enabled").write_text("always madvise [never]\n")
    assert not collapse(np.zeros(MIN_BYTES, np.uint8))
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    (tmp_path / "hpage_pmd_size").write_text(f"{512 << 20}\n")  # arm64 with 64 KiB base pages
    assert huge_page_bytes() is None


@needs_thp
def test_a_freshly_compiled_session_moves_its_weights_after_its_first_run_with_the_same_results(tmp_path):
    graph, feeds = _wide_layer()
    session = compile_graph(graph, cache_dir=tmp_path, tune=False)
    address = session._weights_ptr
    assert session._collapse is not None and _huge_kib(address) == 0
    first = session.run(feeds)
    _moved()
    assert session._weights_ptr == address and _huge_kib(address) >= 2048
    assert all(session.run(feeds)[k].tobytes() == first[k].tobytes() for k in first)
    warm = compile_graph(graph, cache_dir=tmp_path, tune=False)  # the cache entry's file: left as it is
    assert warm.stats.cache_hit and warm._collapse is None and not warm._collapsible
    assert all(warm.run(feeds)[k].tobytes() == first[k].tobytes() for k in first)


@needs_thp
def test_runs_from_several_threads_while_the_weights_move_all_give_the_same_bits():
    graph, feeds = _wide_layer()
    session = compile_graph(graph, use_cache=False, tune=False)
    expected = session.run(feeds)  # starts the move
    bad: list[str] = []

    def runs():
        for _ in range(200):
            got = session.run(feeds)
            if any(got[k].tobytes() != expected[k].tobytes() for k in got):
                bad.append("differs")

    threads = [threading.Thread(target=runs) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _moved()
    assert not bad and _huge_kib(session._weights_ptr) >= 2048
