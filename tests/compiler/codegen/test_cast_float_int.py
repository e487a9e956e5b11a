"""Cast from every float dtype to every integer dtype at the values LLVM leaves undefined (negative to
unsigned, NaN, +-inf, past the range): ``codegen.float_int``'s table, the same natively and under qemu.

``expected`` restates that table in Python; it is checked against the reference interpreter on x86
hosts (NumPy's casts there are the definition), and native code against it on every host and CPU.
"""

from __future__ import annotations

import math
import platform
import shutil

import numpy as np
import pytest
from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.edge_runtime.compile import compile_graph

from tests.hosts import executable

SOURCES = [DType.F16, DType.F32, DType.F64, DType.BF16, DType.F8E4M3FN, DType.F8E5M2, DType.F4E2M1]
TARGETS = [DType.I8, DType.U8, DType.I16, DType.U16, DType.I32, DType.U32, DType.I64, DType.U64]
GRID = [2.7, -2.7, -7.0, -0.5, -0.0, 127.9, 128.5, -129.5, 255.5, 256.5, 32767.5, 32768.5, -32769.5, 65535.5,
        65536.5, 2.0**31 - 128, 2.0**31, -2.0**31, -2.0**31 - 1024, 2.0**32 - 256, 2.0**32, -3e9, 2.0**63 - 1024,
        2.0**63, -2.0**63, -2.0**63 - 4096, 2.0**64 - 4096, 2.0**64, -2.0**64, 1e30, -1e30,
        math.nan, math.inf, -math.inf]
"""In range, just past each integer type's range, +-2^63, +-2^64, far out, and the non-finite values."""
X86 = platform.machine().lower() in ("x86_64", "amd64")
EMULATED = ["rpi5", "arm64-sve2"]
VECTOR_COPIES = 16


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


def _indefinite(v: float, bits: int) -> int:
    """The truncated value where it fits ``bits`` signed bits, else the minimum (x86's integer indefinite)."""
    low = -(1 << (bits - 1))
    t = math.trunc(v) if math.isfinite(v) else low
    return t if low <= t < -low else low


def expected(v: float, src: DType, dst: DType) -> int:
    """``float_int``'s table for one value (``v`` already rounded to ``src``), as the target's bits."""
    info = np.iinfo(dst.numpy)
    bits = info.bits
    if src.is_narrow:  # ml_dtypes: the truncated value where it fits, else 0
        t = math.trunc(v) if math.isfinite(v) else None
        r = t if t is not None and info.min <= t <= info.max else 0
    elif info.kind == "u" and (bits == 64 or (bits == 32 and src is not DType.F16)):
        half = 2.0 ** (bits - 1)
        big = v >= half
        r = _indefinite(float(np.array(v - half if big else v, src.numpy)), bits) ^ (-(1 << (bits - 1)) if big else 0)
    else:
        r = _indefinite(v, 64 if bits == 64 or dst is DType.U32 else 32)
    r %= 1 << bits
    return r - (1 << bits) if info.kind == "i" and r > info.max else r


def _inputs(copies: int = 3) -> dict[str, np.ndarray]:
    """The grid in every source dtype; 3 copies end in a part no vector loop covers."""
    with np.errstate(all="ignore"):
        return {s.value: np.repeat(np.array(GRID, np.float64), copies).astype(s.numpy) for s in SOURCES}


def _graph(copies: int = 3):
    gb = GraphBuilder("t_cast_float_int")
    ins = {s: gb.input(s.value, TensorType(s, (copies * len(GRID),))) for s in SOURCES}
    return gb.build([gb.add1("Cast", [ins[s]], to=d) for s in SOURCES for d in TARGETS])


def _want(feeds) -> list[np.ndarray]:
    return [np.array([expected(float(v), s, d) for v in feeds[s.value].astype(np.float64)], d.numpy)
            for s in SOURCES for d in TARGETS]


def _check(got: dict[str, np.ndarray], graph, feeds) -> None:
    pairs = [(s, d) for s in SOURCES for d in TARGETS]
    for (s, d), o, want in zip(pairs, graph.outputs, _want(feeds)):
        bad = np.flatnonzero(got[o] != want)
        xs = feeds[s.value].astype(np.float64)
        assert not len(bad), f"{s.value}->{d.value}: " + "; ".join(f"{xs[i]!r} gives {got[o][i]}, not {want[i]}"
                                                                   for i in bad[:6])


@pytest.mark.skipif(not X86, reason="NumPy's casts on x86-64 define the table; other hosts' NumPy saturates")
def test_the_table_is_what_the_reference_gives_on_x86():
    """16 copies of each value (NumPy's own astype converts f32/f64 to u32 by the table in blocks of 4
    only; the reference now does so for every element: the test below)."""
    graph, feeds = _graph(VECTOR_COPIES), _inputs(VECTOR_COPIES)
    with np.errstate(all="ignore"):
        _check(run_reference(graph, feeds), graph, feeds)


def test_some_values_written_out():
    assert expected(-7.0, DType.F32, DType.U64) == 2**64 - 7
    assert [expected(v, DType.F32, DType.U64) for v in (math.nan, math.inf, -math.inf, 2.0**64)] == [2**63, 0, 2**63, 0]
    assert [expected(v, DType.F64, DType.U32) for v in (math.nan, -math.inf, -3e9, 2.0**32)] == [2**31, 2**31, 2**31, 0]
    assert [expected(v, DType.F16, DType.U32) for v in (math.nan, -math.inf, -7.0)] == [0, 0, 2**32 - 7]
    assert [expected(v, DType.F32, DType.I32) for v in (math.nan, math.inf, 2.0**31)] == [-2**31] * 3
    assert [expected(v, DType.F32, DType.U8) for v in (math.nan, -2.7, 300.7)] == [0, 254, 44]
    assert [expected(v, DType.BF16, DType.U8) for v in (-2.7, 256.0, math.nan)] == [0, 0, 0]


@pytest.mark.parametrize("profile", ["host", "x86-avx2", "x86-avx512"])
@pytest.mark.parametrize("optimize", [False, True])
def test_native_casts_follow_the_table(profile, optimize):
    target = executable(profile)
    graph, feeds = _graph(), _inputs()
    _check(compile_graph(graph, target=target, optimize=optimize, use_cache=False).run(feeds), graph, feeds)


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                    reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross")
@pytest.mark.parametrize("profile", EMULATED)
def test_arm64_casts_follow_the_same_table(profile, tmp_path):
    """ARM's fcvtz* saturates where x86 gives the minimum: the answer must not depend on that."""
    from cuvil.edge_runtime.emulated import EmulatedModel

    graph, feeds = _graph(), _inputs()
    em = EmulatedModel(graph, profile, use_cache=False, workdir=tmp_path)
    try:
        (got,) = em.run([feeds])
    finally:
        em.close()
    _check(got, graph, feeds)


def test_the_references_float_to_u32_does_not_depend_on_an_elements_position():
    """NumPy's astype gave the last len % 4 elements (and a lone value) another answer than the rest
    (NaN 0 against 2^31): the reference follows the table for every element, wherever it stands."""
    values = [math.nan, -math.inf, -3e9, math.inf, 2.0**32, 3e9, -7.0]
    for dt in (DType.F32, DType.F64):
        for n in (1, 3, 5):
            b = GraphBuilder("cast")
            x = b.input("x", TensorType(dt, (n,)))
            graph = b.build([b.add1("Cast", [x], to=DType.U32)])
            for v in values:
                got = run_reference(graph, {"x": np.full(n, v, dt.numpy)})
                assert list(got.values())[0].tolist() == [expected(v, dt, DType.U32)] * n, (dt, n, v)
