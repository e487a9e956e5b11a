"""The emulated-device cache is checked like the compile cache: a damaged entry is rebuilt, never run.

Before, the cache was trusted because its files existed: one flipped weight byte gave silently wrong
outputs and a truncated harness failed forever. Needs the ARM64 cross toolchain and qemu-user (the
x86 build machines have them; a host without them skips with the packages to install).
"""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest
from cuvil.compiler import run_reference
from cuvil.edge_runtime.emulated import SUFFIX, EmulatedModel

from .test_cache_attacks import _deadline
from .test_session import mlp_graph

pytestmark = pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                                reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross")
PROFILE = "rpi5"
X = [{"x": np.random.default_rng(3).standard_normal((1, 37)).astype(np.float32)}]


def _entry(cache_dir):
    (entry,) = (cache_dir / "emulated").glob(f"*{SUFFIX}")
    return entry


def _check(em, graph):
    (got,) = em.run(X)
    want = run_reference(graph, X[0])
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def _rebuilt(graph, cache_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="cuvil.edge_runtime.emulated"):
        em = EmulatedModel(graph, PROFILE, cache_dir=cache_dir)
    assert not em.cache_hit and "unusable" in caplog.text
    _check(em, graph)
    again = EmulatedModel(graph, PROFILE, cache_dir=cache_dir)
    assert again.cache_hit
    _check(again, graph)


def _flip_last_weight_page(path):
    raw = bytearray(path.read_bytes())
    raw[-4096] ^= 0x40  # the first byte of the weights' last page
    path.write_bytes(bytes(raw))


DAMAGE = {
    "weight_flip": _flip_last_weight_page,
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 3]),
    "fifo": lambda p: (p.unlink(), os.mkfifo(p)),
    "directory": lambda p: (p.unlink(), p.mkdir()),
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_entry_is_rebuilt(tmp_path, caplog, how):
    graph = mlp_graph()
    cache_dir = tmp_path / "cache"
    first = EmulatedModel(graph, PROFILE, cache_dir=cache_dir)
    assert not first.cache_hit
    _check(first, graph)
    DAMAGE[how](_entry(cache_dir))
    with _deadline(120):
        if how == "directory":  # cannot be replaced: every model builds again, and runs right
            for _ in range(2):
                em = EmulatedModel(graph, PROFILE, cache_dir=cache_dir)
                assert not em.cache_hit
                _check(em, graph)
        else:
            _rebuilt(graph, cache_dir, caplog)


def test_another_models_entry_under_this_key_is_rebuilt(tmp_path, caplog):
    a, b = mlp_graph(seed=0), mlp_graph(seed=1)
    cache_dir = tmp_path / "cache"
    EmulatedModel(a, PROFILE, cache_dir=cache_dir)
    mine = _entry(cache_dir)
    EmulatedModel(b, PROFILE, cache_dir=cache_dir)
    (theirs,) = [p for p in (cache_dir / "emulated").glob(f"*{SUFFIX}") if p != mine]
    mine.write_bytes(theirs.read_bytes())
    _rebuilt(a, cache_dir, caplog)


def test_qemu_runs_a_private_copy_not_the_cache(tmp_path):
    graph = mlp_graph()
    em = EmulatedModel(graph, PROFILE, cache_dir=tmp_path / "cache")
    assert em.executable.parent.stat().st_mode & 0o777 == 0o700
    assert tmp_path / "cache" not in em.executable.parents
    em.close()
    assert not em.executable.exists()
