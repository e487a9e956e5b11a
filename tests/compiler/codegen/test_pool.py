"""MaxPool and AveragePool kernels (``kernels/pool.py``, ``kernels/pool_generic.py``) against the NumPy reference.

The f32 kernels split every pool at compile time (vector interior columns, scalar or masked border
columns, runs of border rows, strided lane gathers, a separable two-sweep path for tall windows),
so the grid walks each split: kernels 1..5, strides 1..3, asymmetric pads, ceil_mode, dilations,
widths under one vector, between vectors and over several, batch 2, 1-D; and the vector widths of
SSE (4 lanes) and AVX-512 (16, run on the host as two halves) besides the host's own.
"""

from __future__ import annotations

import re

import shutil

import numpy as np
import pytest
from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.target import Target
from cuvil.devices.detect import resolve_target
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.compile import compile_graph, lower_for, runnable_here

HOST = jit.host_target()
SSE = Target("x86-sse4", "x86_64-unknown-linux-gnu", "x86-64-v2", ("+sse4.2",), 128)
WIDE16 = Target("avx512-plans-on-host", HOST.triple, HOST.cpu, HOST.features, 512)


def graph_of(op: str, shape, **attrs):
    gb = GraphBuilder(f"t_{op}")
    x = gb.input("x", TensorType(DType.F32, tuple(shape)))
    (y,) = gb.add(op, [x], **attrs)
    return gb.build([y])


def check(op: str, x: np.ndarray, target: Target = HOST, **attrs) -> np.ndarray:
    """Run the one-node graph natively and compare with the reference: max exactly, average to
    float32 rounding; NaN must match NaN."""
    graph = graph_of(op, x.shape, **attrs)
    got = compile_graph(graph, target=target, use_cache=False, optimize=False).run({"x": x})[graph.outputs[0]]
    want = run_reference(graph, {"x": x})[graph.outputs[0]]
    assert got.shape == want.shape
    if op == "MaxPool":
        np.testing.assert_array_equal(got, want, err_msg=f"{op} {x.shape} {attrs}")
    else:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=f"{op} {x.shape} {attrs}")
    return got


def rnd(*shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).uniform(-3, 3, size=shape).astype(np.float32)


def _grid():
    """(kernel, stride, width, ceil_mode, pads): every kernel and stride over widths below one
    AVX2 vector, between vectors and over several, with asymmetric pads smaller than the kernel."""
    for k in range(1, 6):
        for s in (1, 2, 3):
            for w, ceil in ((5, 0), (13, 1), (29, 0), (40, 1)):
                pads = (k // 2, k - 1, 0, (k - 1) // 2)  # top, left, bottom, right
                yield pytest.param((k, k), (s, s), w, ceil, pads, id=f"k{k}s{s}w{w}c{ceil}")


GRID = list(_grid())
RECT = [  # (kernel, strides, pads, ceil_mode): unequal axes, the separable path, large windows
    ((3, 2), (1, 2), (1, 0, 0, 1), 1),
    ((2, 5), (2, 1), (0, 2, 1, 3), 0),
    ((5, 1), (1, 3), (4, 0, 2, 0), 1),
    ((1, 4), (3, 1), (0, 3, 0, 0), 0),
    ((4, 4), (1, 1), (3, 0, 1, 2), 1),
    ((7, 7), (1, 1), (3, 3, 3, 3), 0),
    ((13, 13), (1, 1), (6, 6, 6, 6), 0),
    ((9, 3), (4, 2), (2, 1, 0, 2), 1),
]


@pytest.mark.parametrize("kernel,strides,w,ceil,pads", GRID)
def test_max_pool_grid(kernel, strides, w, ceil, pads):
    check("MaxPool", rnd(2, 3, 11, w), kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil,
          dilations=(1, 1))


@pytest.mark.parametrize("include", [0, 1])
@pytest.mark.parametrize("kernel,strides,w,ceil,pads", GRID)
def test_avg_pool_grid(kernel, strides, w, ceil, pads, include):
    check("AveragePool", rnd(2, 3, 11, w), kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil,
          count_include_pad=include)


@pytest.mark.parametrize("kernel,strides,pads,ceil", RECT)
def test_rectangular_and_large_windows(kernel, strides, pads, ceil):
    x = rnd(2, 3, 23, 37)
    check("MaxPool", x, kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil, dilations=(1, 1))
    for include in (0, 1):
        check("AveragePool", x, kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil,
              count_include_pad=include)


@pytest.mark.parametrize("kernel,strides,dil,pads,ceil", [
    ((3, 3), (1, 1), (2, 2), (2, 2, 2, 2), 0),
    ((3, 3), (2, 2), (2, 1), (1, 0, 2, 1), 1),
    ((2, 3), (1, 2), (3, 2), (1, 2, 0, 1), 0),
    ((3, 2), (3, 1), (1, 3), (0, 1, 2, 0), 1),
    ((4, 2), (2, 3), (2, 4), (3, 1, 1, 1), 0),
])
@pytest.mark.parametrize("w", [6, 19, 45])
def test_dilated_max_pool(kernel, strides, dil, pads, ceil, w):
    check("MaxPool", rnd(2, 2, 17, w), kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil,
          dilations=dil)


@pytest.mark.parametrize("k,s,d,pads,ceil", [
    (3, 2, 1, (1, 1), 0), (4, 4, 1, (0, 0), 0), (5, 1, 1, (2, 3), 1), (2, 3, 2, (1, 0), 1),
    (1, 2, 1, (0, 0), 0), (3, 1, 3, (2, 1), 0),
])
@pytest.mark.parametrize("w", [7, 21, 100])
def test_1d(k, s, d, pads, ceil, w):
    x = rnd(2, 4, w)
    check("MaxPool", x, kernel_shape=(k,), strides=(s,), pads=pads, ceil_mode=ceil, dilations=(d,))
    if d == 1:
        for include in (0, 1):
            check("AveragePool", x, kernel_shape=(k,), strides=(s,), pads=pads, ceil_mode=ceil,
                  count_include_pad=include)


@pytest.mark.parametrize("kernel,strides,dil,pads", [
    ((100,), (5,), (3,), (40, 7)),  # 500 vector loads unrolled: the generic path, taps in a loop
    ((9, 40), (1, 8), (1, 1), (4, 3, 2, 30)),  # separable would unroll 329 loads: the same
    ((5, 12), (2, 6), (2, 1), (1, 5, 3, 0)),  # rows first, 77 loads: still the vector path
])
def test_windows_too_big_to_unroll_loop_over_their_taps(kernel, strides, dil, pads):
    x = rnd(1, 2, *((31, 203) if len(kernel) == 2 else (411,)))
    check("MaxPool", x, kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=0, dilations=dil)
    if dil == (1,) * len(kernel):
        for include in (0, 1):
            check("AveragePool", x, kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=0,
                  count_include_pad=include)


@pytest.mark.parametrize("target", [SSE, WIDE16], ids=["sse4", "wide16"])
@pytest.mark.parametrize("kernel,strides,pads,ceil", [
    ((3, 3), (2, 2), (1, 1, 1, 1), 0), ((3, 3), (2, 2), (0, 0, 0, 0), 1), ((2, 2), (2, 2), (0, 0, 0, 0), 0),
    ((3, 3), (1, 1), (1, 1, 1, 1), 0), ((5, 5), (1, 1), (2, 1, 2, 3), 0), ((3, 3), (3, 3), (2, 0, 0, 2), 1),
])
@pytest.mark.parametrize("w", [3, 13, 55])
def test_other_vector_widths(target, kernel, strides, pads, ceil, w):
    if not runnable_here(target):
        pytest.skip(f"{target.name} code does not run on this host")
    x = rnd(2, 3, 9, w)
    check("MaxPool", x, target, kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil, dilations=(1, 1))
    check("AveragePool", x, target, kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil,
          count_include_pad=0)


@pytest.mark.parametrize("kernel,strides,pads", [((3, 3), (2, 2), (1, 1, 1, 1)), ((3, 3), (1, 1), (1, 1, 1, 1)),
                                                 ((2, 2), (2, 2), (0, 0, 0, 0))])
def test_max_pool_nan_and_inf(kernel, strides, pads):
    """A NaN anywhere in a window makes that output NaN (np.max), in vector lanes and borders alike;
    infinities are ordinary values."""
    x = rnd(2, 3, 12, 37)
    rng = np.random.default_rng(7)
    flat = x.reshape(-1)
    spots = rng.choice(flat.size, 40, replace=False)
    flat[spots[:20]] = np.nan
    flat[spots[20:30]] = np.inf
    flat[spots[30:]] = -np.inf
    x[0, 0, :, 0] = np.nan  # a border column
    x[1, 2, 5, :] = -np.inf
    got = check("MaxPool", x, kernel_shape=kernel, strides=strides, pads=pads, dilations=(1, 1))
    assert np.isnan(got).any() and np.isfinite(got).any()


def test_all_padding_window_is_minus_inf():
    """A dilated window that sees only padding gives -inf (as the reference and PyTorch)."""
    got = check("MaxPool", rnd(2, 2, 3, 3), kernel_shape=(2, 2), strides=(1, 1), pads=(1, 1, 1, 1),
                dilations=(4, 4))
    assert np.isneginf(got).all()


def _assembly(profile: str, op: str, shape, **attrs) -> str:
    target = resolve_target(profile)
    return jit.emit_assembly(lower_for(graph_of(op, shape, **attrs), target).llvm_ir, target)


@pytest.mark.parametrize("profile,register", [("x86-avx2", "ymm"), ("x86-avx512", "zmm")])
@pytest.mark.parametrize("kernel,strides,pads", [((3, 3), (2, 2), (1, 1, 1, 1)), ((3, 3), (1, 1), (1, 1, 1, 1)),
                                                 ((2, 2), (2, 2), (0, 0, 0, 0))])
def test_vectorized(kernel, strides, pads, profile, register):
    """Each x86 profile's pools are vector code of its width (its assembly, whatever the host)."""
    asm = _assembly(profile, "MaxPool", (1, 16, 56, 56), kernel_shape=kernel, strides=strides, pads=pads,
                    dilations=(1, 1))
    assert "vmaxps" in asm and register in asm
    assert "vinsertps" not in asm  # no scalar windows glued into vectors lane by lane
    asm = _assembly(profile, "AveragePool", (1, 16, 56, 56), kernel_shape=kernel, strides=strides, pads=pads)
    assert "vaddps" in asm and register in asm


def test_narrow_rows_are_ymm_vectors_at_512_bits():
    """Output rows of 6 (SqueezeNet's 3x3/2 pool of 256x13x13) fill under half a zmm and were scalar
    windows (3.5x ORT's time on a Xeon); on AVX-512 they are 8-lane vectors."""
    for op, extra, vector_op, scalar_op in (("MaxPool", {"dilations": (1, 1)}, "vmaxps", "vmaxss"),
                                            ("AveragePool", {}, "vaddps", "vaddss")):
        asm = _assembly("x86-avx512", op, (1, 256, 13, 13), kernel_shape=(3, 3), strides=(2, 2), pads=(0, 0, 0, 0),
                        **extra)
        assert re.search(rf"{vector_op}\s+[^\n]*%ymm", asm) and scalar_op not in asm and "zmm" not in asm


def test_code_size_stays_linear_in_the_window():
    """A 13x13 window over a 40x40 map: no unrolling over output rows or K*K taps per vector."""
    ir_text = lower_for(graph_of("MaxPool", (1, 8, 40, 40), kernel_shape=(13, 13), strides=(1, 1),
                                 pads=(6, 6, 6, 6), dilations=(1, 1)), HOST).llvm_ir
    assert ir_text.count("\n") < 2000


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                    reason="needs qemu-user and gcc-aarch64-linux-gnu")
@pytest.mark.parametrize("profile,bits", [("rpi5", None), ("graviton3", 256), ("graviton3", 512)])
def test_arm64_emulated(profile, bits):
    """NEON and SVE builds (4-lane vectors, masked loads lowered for ARM) under qemu-user."""
    from cuvil.edge_runtime.emulated import emulate

    gb = GraphBuilder("pools")
    x = gb.input("x", TensorType(DType.F32, (2, 3, 17, 13)))
    outs = []
    for op, attrs in [
        ("MaxPool", {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "dilations": (1, 1)}),
        ("AveragePool", {"kernel_shape": (5, 5), "strides": (1, 1), "pads": (2, 1, 2, 3)}),
        ("MaxPool", {"kernel_shape": (3, 3), "strides": (3, 3), "pads": (1, 0, 1, 2), "dilations": (1, 1),
                     "ceil_mode": 1}),
        ("MaxPool", {"kernel_shape": (2, 3), "strides": (1, 2), "pads": (1, 0, 0, 2), "dilations": (2, 2)}),
        ("AveragePool", {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (0, 0, 0, 0), "ceil_mode": 1,
                         "count_include_pad": 1}),
    ]:
        outs += gb.add(op, [x], **attrs)
    graph = gb.build(outs)
    xv = rnd(2, 3, 17, 13)
    xv[0, 1, 3, 4] = np.nan
    want = run_reference(graph, {"x": xv})
    got = emulate(graph, profile, [{"x": xv}], sve_vector_bits=bits)[0]
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-6, atol=1e-6, err_msg=f"{profile} {name}")
