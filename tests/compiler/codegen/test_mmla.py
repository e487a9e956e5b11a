"""ARM i8mm GEMMs (``smmla`` 2x2 tiles): the code compiled for the i8mm profiles uses ``smmla``, the
profiles without i8mm ``sdot`` only, and under qemu every tail (odd rows, an odd last quad of K,
partial column vectors) equals the int8 reference exactly at SVE lengths 128 and 512."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.codegen.cpu.int_dot import choose_dot
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.devices.detect import resolve_target
from cuvil.devices.isa_report import from_assembly, from_object
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.emulated import EmulatedModel

from .test_quant_kernels import _qconv_graph, _random_x

QEMU = pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                          reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross")


def _qmatmul_graph(a_dtype, rows, k, n, bias, float_out=False):
    rng = np.random.default_rng(k)
    gb = GraphBuilder("qmm")
    a = gb.input("a", TensorType(a_dtype, (rows, k)))
    inputs = [a, gb.constant(rng.integers(-127, 128, (k, n)).astype(np.int8), "b")]
    if bias:
        inputs.append(gb.constant(rng.integers(-900, 900, (n,)).astype(np.int32), "c"))
    out = dict(y_scale=1.0, y_zero_point=0, to=DType.F32) if float_out else dict(y_scale=0.2, y_zero_point=-5,
                                                                                   to=DType.I8)
    y = gb.add1("QMatMul", inputs, a_scale=0.04, a_zero_point=7, b_scale=np.linspace(0.01, 0.02, n), **out)
    return gb.build([y])


def _conv(dtype, m, c, shape, stride=1, seed=0):
    w = np.random.default_rng(seed).integers(-127, 128, (m, c, 3, 3)).astype(np.int8)
    bias = np.random.default_rng(seed + 1).integers(-2000, 2000, (m,)).astype(np.int32)
    return _qconv_graph(dtype, w, bias, 1, stride, [1, 1, 1, 1], (1, c) + shape)


CASES = [  # (graph, input name, dtype, input shape)
    (_conv(DType.U8, 11, 5, (7, 9)), "x", DType.U8, (1, 5, 7, 9)),  # odd rows: the last by sdot; 63 pixels
    (_conv(DType.I8, 16, 8, (9, 8), stride=2), "x", DType.I8, (1, 8, 9, 8)),  # 8-row blocks, even k4
    (_conv(DType.U8, 10, 4, (5, 5)), "x", DType.U8, (1, 4, 5, 5)),  # a row-pair remainder, 9 quads of K
    (_qmatmul_graph(DType.U8, 7, 19, 21, True), "a", DType.U8, (7, 19)),  # 5 quads of K, 21 columns
    (_qmatmul_graph(DType.I8, 4, 64, 16, False), "a", DType.I8, (4, 64)),
    (_qmatmul_graph(DType.U8, 7, 19, 21, True, float_out=True), "a", DType.U8, (7, 19)),  # float32 out (logits)
    (_qmatmul_graph(DType.U8, 1, 5, 3, False), "a", DType.U8, (1, 5)),  # one row: sdot only
]


@pytest.mark.parametrize("profile,i8mm", [("graviton3", True), ("graviton4", True), ("jetson-thor", True),
                                          ("rpi5", False), ("jetson-orin", False)])
def test_i8mm_profiles_compile_to_smmla(profile, i8mm):
    target = resolve_target(profile)
    assert choose_dot(target, False).kind == ("i8mm" if i8mm else "sdot")
    for i, (graph, *_) in enumerate(CASES[:2] + CASES[3:4]):
        r = from_assembly(jit.emit_assembly(lower(graph, target, optimize=False).llvm_ir, target), "aarch64")
        assert (r.dots.get("smmla NEON", 0) > 0) == i8mm, r.summary()
        assert (r.dots.get("sdot NEON", 0) > 0) == (not i8mm or i != 1), r.summary()  # odd rows: 11, 7


def check_under_qemu(case: int, profile: str, dots: str | None, lengths: tuple[int, ...], tmp_path) -> None:
    """CASES[case] compiled for ``profile``: ``dots`` (e.g. "smmla NEON") in its object code, and
    outputs equal to the reference at each SVE length."""
    graph, name, dtype, shape = CASES[case]
    em = EmulatedModel(graph, profile, use_cache=False, workdir=tmp_path)
    try:
        if dots:
            assert from_object(em.object_code, em.target.triple).dots.get(dots, 0) > 0
        examples = [{name: _random_x(dtype, shape, seed)} for seed in range(2)]
        want = [run_reference(graph, ex)[graph.outputs[0]] for ex in examples]
        for bits in lengths:
            for got, expected in zip(em.run(examples, bits), want, strict=True):
                assert np.array_equal(got[graph.outputs[0]], expected), f"case {case} at {bits} bits"
    finally:
        em.close()


@QEMU
@pytest.mark.parametrize("case", range(len(CASES)))
def test_i8mm_gemms_are_exact_under_qemu(case, tmp_path):
    one_row = case == len(CASES) - 1
    check_under_qemu(case, "graviton4", None if one_row else "smmla NEON", (128, 512), tmp_path)
