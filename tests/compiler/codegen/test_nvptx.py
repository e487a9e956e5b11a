"""The NVPTX (Jetson GPU) lowering: PTX for the whole zoo accepted by ptxas, and every op's GPU
kernel correct against the reference interpreter.

ptxas judges the PTX for the Jetson architectures (``ptxas.PTXAS_ARCH``). Correctness is
checked without a GPU: the same module runs on the host with a simulated grid (``gpu_sim``), and
every per-op case of ``test_kernels`` is re-run through it. ``tests/edge_runtime/test_cuda.py``
runs the real thing where a GPU exists.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tests.compiler.codegen.test_kernels as tk
from cuvil.compiler import run_reference
from cuvil.compiler.codegen.nvptx import gpu_target, lower_ptx
from cuvil.compiler.errors import CompileError
from cuvil.devices import resolve_target
from cuvil.edge_runtime import jit
from tests.compiler.codegen.gpu_sim import SimulatedGpu
from tests.compiler.codegen.ptxas import PTXAS_ARCH, ptxas
from tests.compiler.codegen.test_kernels_math import (  # noqa: F401  (re-run here on the simulated GPU)
    test_bitshift, test_float_unary_math, test_logic, test_math_near_zero_keeps_relative_accuracy, test_mean_and_integer_pow,
    test_mod, test_not_isnan_isinf_and_inclusive_comparisons, test_sign_and_bitwise_on_integers,
)
from tests.compiler.codegen.test_kernels_conv3d import test_conv_3d  # noqa: F401  (re-run on the simulated GPU)
from tests.compiler.codegen.test_kernels_indexing import (  # noqa: F401  (re-run here on the simulated GPU)
    test_arg_extremes, test_cumsum, test_gather_elements, test_reduce_min_of_bools_and_unsigned, test_reduce_min_prod,
    test_gather_nd, test_scatter, test_scatter_refuses_indices_outside_the_axis, test_trilu,
)
from tests.compiler.codegen.test_kernels_narrow import (  # noqa: F401  (re-run here on the simulated GPU)
    test_bitcast_keeps_the_bytes, test_float_to_narrow_float_rounds_to_nearest_even, test_narrow_float_to_wide_is_exact,
    test_narrow_ints_both_ways, test_float8e8m0_rounds_the_exponent_as_onnx, test_float8e8m0_decodes_every_code,
)
from tests.compiler.codegen.test_kernels_resample import (  # noqa: F401  (re-run here on the simulated GPU)
    test_conv_transpose, test_conv_transpose_f16_and_f64, test_grid_sample, test_grid_sample_volumetric, test_resize,
    test_resize_dtypes,
)
from tests.compiler.codegen.test_kernels import (  # noqa: F401  (re-run here on the simulated GPU)
    test_avg_pool, test_batch_norm, test_binary, test_binary_int, test_cast, test_compare, test_concat_split, test_conv,
    test_fused_conv, test_fused_elementwise, test_fused_gemm, test_gather,
    test_gather_refuses_indices_outside_the_axis, test_gelu_tanh_and_wide_ranges, test_gemm,
    test_in_place, test_layer_norm, test_lrn, test_matmul, test_matmul_int, test_max_pool, test_pad, test_pad_crop,
    test_pool_1d_and_global, test_pow, test_reduce, test_reduce_int, test_shape_op, test_shape_ops, test_slice,
    test_softmax, test_unary, test_unary_int, test_unary_positive, test_variadic, test_where,
    test_binary_narrow_and_unsigned_ints, test_cast_and_reduce_narrow_and_unsigned_ints, test_dequantize_16_bit,
    test_quantize_16_bit_saturates,
)

RTOL, ATOL = 1e-4, 1e-5
SLOW = {"resnet18", "mobilenet_v2"}


class _SimSession:
    """Stands in for a CPU Session in test_kernels: lowers for sm_87, emits PTX, runs simulated."""

    def __init__(self, graph, optimize: bool):
        program = lower_ptx(graph, gpu_target("test", "sm_87"), optimize=optimize)
        assert ".entry" in jit.emit_assembly(program.llvm_ir, program.target)  # NVPTX selects it all
        self.sim = SimulatedGpu(program)

    def run(self, feeds):
        return self.sim.run(feeds)


@pytest.fixture(autouse=True)
def _gpu_backend(monkeypatch):
    monkeypatch.setattr(tk, "compile_graph", lambda graph, cache_dir=None, optimize=True: _SimSession(graph, optimize))


# --- the zoo ----------------------------------------------------------------------------------------
_GRAPHS: dict[str, tuple] = {}


def zoo_graph(name: str):
    torch = pytest.importorskip("torch")
    if name not in _GRAPHS:
        from cuvil.compiler.frontends.torch import import_torch
        from tests.zoo import ZOO

        _GRAPHS.clear()
        model, example = ZOO[name]()
        with torch.no_grad():
            _GRAPHS[name] = (import_torch(model, example), [x.numpy() for x in example])
    return _GRAPHS[name]


def _zoo_names():
    from tests.zoo import ZOO

    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ZOO]


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.parametrize("name", _zoo_names())
def test_zoo_ptx_assembles_and_computes_the_reference(name, tmp_path):
    graph, example = zoo_graph(name)
    feeds = dict(zip(graph.inputs, example))
    want = run_reference(graph, feeds)
    for arch, ptxas_arch in PTXAS_ARCH.items():
        program = lower_ptx(graph, gpu_target(name, arch))
        ptx = jit.emit_assembly(program.llvm_ir, program.target)
        assert f".target {arch}" in ptx and ptx.count(".entry") == len(program.kernels)
        if shutil.which("ptxas"):
            done = ptxas(ptx, ptxas_arch, tmp_path)
            assert done.returncode == 0, f"ptxas -arch={ptxas_arch} rejected {arch} PTX of {name}: {done.stderr[:2000]}"
    got = SimulatedGpu(program).run(feeds)
    for out in graph.outputs:
        np.testing.assert_allclose(got[out], want[out], rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.skipif(not shutil.which("ptxas"), reason="ptxas (CUDA toolkit) not installed")
def test_profiles_gpu_targets(tmp_path):
    """The Jetson profiles' own GPU architectures and PTX versions, Thor's sm_110 included."""
    graph, _ = zoo_graph("mlp")
    from cuvil.devices import load_profile

    for name, arch in (("jetson-xavier", "sm_75"), ("jetson-orin", "sm_87"), ("jetson-thor", "sm_110")):
        p = load_profile(name)
        program = lower_ptx(graph, gpu_target(p.name, p.gpu_arch, p.gpu_features))
        done = ptxas(jit.emit_assembly(program.llvm_ir, program.target), arch, tmp_path)
        assert done.returncode == 0, done.stderr


def test_launch_plan_shape():
    graph, _ = zoo_graph("tiny_transformer")
    program = lower_ptx(graph, gpu_target("t", "sm_87"))
    assert len(program.kernels) < len(program.launches)  # identical nodes share one kernel
    for launch in program.launches:
        assert launch.block == 256 and 1 <= launch.grid <= 65535
        for arg in launch.args:
            limit = program.arena_bytes if arg.space == "arena" else len(program.weights)
            assert arg.space in ("arena", "weights") and 0 <= arg.offset < limit and arg.offset % 64 == 0


def test_cpu_targets_old_ptx_and_unknown_ops_are_refused():
    graph, _ = zoo_graph("mlp")
    with pytest.raises(CompileError, match=r"sm_110 needs PTX ISA 9.0"):
        gpu_target("thor", "sm_110", ("+ptx78",))  # LLVM would abort the whole process
    with pytest.raises(CompileError, match="NVPTX"):
        lower_ptx(graph, resolve_target("rpi5"))
    from cuvil.compiler.codegen.driver import prepare
    from cuvil.compiler.codegen.nvptx.ops import EMITTERS

    with pytest.raises(CompileError, match="no GPU kernel for 2 op.*Gemm .*Relu"):
        prepare(graph, gpu_target("t", "sm_87"), 1, optimize=False, kernels=set(EMITTERS) - {"Gemm", "Relu"},
                backend="GPU")


def test_symbolic_batch_on_the_simulated_gpu():
    from cuvil.compiler import DType, TensorType
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import N

    gb = GraphBuilder("batched")
    x = gb.input("x", TensorType(DType.F32, (N, 3, 9, 9)))
    w = gb.constant(np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    (y,) = gb.add("Conv", [x, w], strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1))
    (z,) = gb.add("LayerNormalization", [y, gb.constant(np.full((5,), 0.5, np.float32), "s")], axis=-1)
    graph = gb.build([z])
    feeds = {"x": np.random.default_rng(2).standard_normal((6, 3, 9, 9)).astype(np.float32)}
    got = SimulatedGpu(lower_ptx(graph, gpu_target("t", "sm_87"), batch=6)).run(feeds)
    np.testing.assert_allclose(got[z], run_reference(graph, feeds)[z], rtol=RTOL, atol=ATOL)


ELEMENTWISE_PTX = {  # op -> operand dtypes of one node each (f32 and f16 math, integer and bool logic)
    **{op: ["float32"] for op in ("Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh",
                                  "Cosh", "Asinh", "Acosh", "Atanh", "IsNaN", "IsInf")},
    **{op: ["float16"] for op in ("Sin", "Atan", "Acosh")},
    **{op: ["bool", "bool"] for op in ("And", "Or", "Xor")}, "Not": ["bool"],
    **{op: ["int32", "int32"] for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitShift", "Mod", "Pow")},
    "BitwiseNot": ["int64"], "Mean": ["float32"] * 3, "GreaterOrEqual": ["int64"] * 2, "LessOrEqual": ["float32"] * 2,
}


@pytest.mark.skipif(not shutil.which("ptxas"), reason="ptxas (CUDA toolkit) not installed")
def test_new_ops_assemble_with_ptxas(tmp_path):
    """Math and logic elementwise ops, ConvTranspose, Resize (constant tables in global memory) and GridSample."""
    from cuvil.compiler import DType, TensorType
    from cuvil.compiler.frontends.builder import GraphBuilder

    gb = GraphBuilder("ops")
    outs = []
    for k, (op, dtypes) in enumerate(ELEMENTWISE_PTX.items()):
        xs = [gb.input(f"x{k}_{i}", TensorType(DType.from_numpy(np.dtype(d)), (7, 33))) for i, d in enumerate(dtypes)]
        attrs = {"direction": "RIGHT"} if op == "BitShift" else {}
        outs += gb.add(op, xs, name=f"n{k}", **attrs)
    image = gb.input("image", TensorType(DType.F32, (1, 4, 6, 5)))
    outs += gb.add("ConvTranspose", [image, gb.constant(np.ones((4, 2, 3, 3), np.float32), "w")], strides=[2, 2],
                   pads=[1, 1, 0, 0], dilations=[1, 1], output_padding=[1, 0], group=2)
    outs += gb.add("Trilu", [image], upper=0, k=1) + gb.add("CumSum", [image], axis=2, exclusive=1, reverse=0)
    outs += gb.add("CumProd", [image], axis=3, exclusive=0, reverse=1)
    outs += gb.add("GatherElements", [image, gb.constant(np.ones((1, 4, 2, 5), np.int64), "gi")], axis=2)
    for op in ("ReduceMin", "ReduceProd"):
        outs += gb.add(op, [image], axes=(1, 3), keepdims=0)
    for op in ("ArgMax", "ArgMin"):
        outs += gb.add(op, [image], axis=1, keepdims=1, select_last_index=1)
    for mode in ("nearest", "linear", "cubic"):
        outs += gb.add("Resize", [image], sizes=[-1, -1, 12, 7], scales=[1.0, 1.0, 2.0, 1.4], mode=mode,
                       coordinate_transformation_mode="tf_crop_and_resize", roi=(0, 0, 0.1, 0, 1, 1, 1.2, 1))
    for reduction in ("none", "add", "max"):
        outs += gb.add("ScatterElements", [image, gb.constant(np.ones((1, 4, 2, 5), np.int64), f"si_{reduction}"),
                                           gb.constant(np.ones((1, 4, 2, 5), np.float32), f"sv_{reduction}")],
                       axis=2, reduction=reduction)
        outs += gb.add("ScatterND", [image, gb.constant(np.zeros((3, 2), np.int32), f"sn_{reduction}"),
                                     gb.constant(np.ones((3, 6, 5), np.float32), f"su_{reduction}")], reduction=reduction)
    outs += gb.add("GatherND", [image, gb.constant(np.zeros((1, 3, 2), np.int64), "gnd")], batch_dims=1)
    for mode in ("nearest", "linear", "cubic"):
        grid = gb.input(f"grid_{mode}", TensorType(DType.F32, (1, 3, 8, 2)))
        outs += gb.add("GridSample", [image, grid], mode=mode, padding_mode="reflection", align_corners=0)
    program = lower_ptx(gb.build(outs), gpu_target("ops", "sm_87"))
    done = ptxas(jit.emit_assembly(program.llvm_ir, program.target), "sm_87", tmp_path)
    assert done.returncode == 0, done.stderr[:2000]


def test_storage_only_casts_bitcast_and_half_sums_assemble_with_ptxas(tmp_path):
    """Cast to and from every storage-only dtype, BitCast, and the f16 Softmax/MatMul/Conv summed in f32."""
    from cuvil.compiler import DType, TensorType
    from cuvil.compiler.frontends.builder import GraphBuilder

    gb = GraphBuilder("narrow")
    x = gb.input("x", TensorType(DType.F32, (7, 33)))
    h16 = gb.input("h", TensorType(DType.F16, (1, 4, 33)))
    outs = []
    for d in sorted((d for d in DType if d.is_narrow), key=lambda d: d.value):
        for saturate in (0, 1):
            narrow = gb.add1("Cast", [x], name=f"to_{d.value}_{saturate}", to=d, saturate=saturate)
            outs.append(gb.add1("Cast", [narrow], name=f"from_{d.value}_{saturate}", to=DType.F16))
    outs.append(gb.add1("Cast", [x], to=DType.F8E8M0, round_mode="nearest"))
    outs.append(gb.add1("BitCast", [x], to=DType.I32))
    outs.append(gb.add1("Softmax", [h16], axis=-1))
    outs.append(gb.add1("MatMul", [h16, gb.constant(np.ones((33, 5), np.float16), "w")]))
    outs.append(gb.add1("Conv", [h16, gb.constant(np.ones((4, 1, 3), np.float16), "k")], group=4, pads=(1, 1),
                        strides=(1,), dilations=(1,)))
    program = lower_ptx(gb.build(outs), gpu_target("narrow", "sm_87"))
    done = ptxas(jit.emit_assembly(program.llvm_ir, program.target), "sm_87", tmp_path)
    assert done.returncode == 0, done.stderr[:2000]


def test_half_matmul_and_gemm_sum_in_f32_on_the_simulated_gpu():
    """A long f16 dot product summed in f16 drifts by many ulps; in f32, rounded once, it is the reference's."""
    from cuvil.compiler import DType, TensorType
    from cuvil.compiler.frontends.builder import GraphBuilder

    gb = GraphBuilder("half_sums")
    a = gb.input("a", TensorType(DType.F16, (3, 1024)))
    w = gb.constant(np.random.default_rng(1).uniform(0.5, 1.5, (1024, 4)).astype(np.float16), "w")
    outs = gb.add("MatMul", [a, w]) + gb.add("Gemm", [a, w], alpha=1.0, beta=1.0, transA=0, transB=0)
    graph = gb.build(outs)
    feeds = {"a": np.random.default_rng(2).uniform(0.5, 1.5, (3, 1024)).astype(np.float16)}
    got = SimulatedGpu(lower_ptx(graph, gpu_target("half", "sm_87"))).run(feeds)
    want = run_reference(graph, feeds)
    for out in graph.outputs:
        np.testing.assert_array_equal(got[out], want[out], err_msg=out)
