"""The lowering driver both backends share: missing ops all named at once, the plan checked before
code, in-place placements read off the plan, and identical nodes sharing one kernel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cuvil.compiler import parse_graph
from cuvil.compiler.codegen import driver
from cuvil.compiler.codegen.driver import WeightBlock
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.codegen.nvptx import gpu_target, lower_ptx
from cuvil.compiler.errors import CompileError
from cuvil.compiler.memory import PlanError
from cuvil.compiler.target import Target

from ...guarded import run_in_child

CPU = Target("t", "x86_64-unknown-linux-gnu", "x86-64", (), 128)
GPU = gpu_target("t", "sm_87", ("+ptx78",))
CHAIN = """graph "chain" (x: f32[N,64]) -> (y) {
  a: f32[N,64] = Sigmoid @a (x)
  b: f32[N,64] = Tanh @b (a)
  c: f32[N,64] = Sigmoid @c (b)
  d: f32[N,64] = Tanh @d (c)
  y: f32[N,64] = Add @y (b, d)
}
"""
BRANCHES = """graph "branches" (x: f32[1,16,4,4]) -> (y) {
  a: f32[1,16,4,4] = Relu @a (x)
  b: f32[1,16,4,4] = Neg @b (x)
  c: f32[1,32,4,4] = Concat @c (a, b) {axis=1}
  y: f32[1,32,4,4] = Exp @y (c)
}
"""
RELUS = """graph "relus" (x: f32[N,64]) -> (y) {
  a: f32[N,64] = Relu @a (x)
  b: f32[N,64] = Relu @b (a)
  y: f32[N,64] = Relu @y (b)
}
"""


def test_every_missing_op_is_named_in_one_error():
    g = parse_graph(CHAIN)
    with pytest.raises(CompileError, match=r"no test kernel for 2 op\(s\): Sigmoid \(a, c\); Tanh \(b, d\)"):
        driver.prepare(g, CPU, 1, optimize=False, kernels={"Add"}, backend="test")


@pytest.mark.parametrize("lowering, target", [(lower, CPU), (lower_ptx, GPU)], ids=["cpu", "ptx"])
def test_both_backends_check_the_plan(lowering, target, monkeypatch):
    real = driver.plan_memory

    def overlapping(graph, batch, alignment=64, held=None):  # a and b both live at Tanh(a) -> b, and share bytes
        plan = real(graph, batch, alignment, held)
        offsets = dict(plan.offsets)
        offsets["c"] = offsets["b"]
        return dataclasses.replace(plan, offsets=offsets)

    monkeypatch.setattr(driver, "plan_memory", overlapping)
    with pytest.raises(PlanError):
        lowering(parse_graph(CHAIN), target, optimize=False)


def test_placement_reads_in_place_handovers_off_the_plan():
    g = parse_graph(CHAIN)
    prep = driver.prepare(g, CPU, 1, optimize=False, kernels={"Add", "Sigmoid", "Tanh"}, backend="test")
    for node in prep.graph.nodes:
        alias = driver.placement(prep, node)
        for i, j in enumerate(alias):
            same = prep.plan.offsets[node.inputs[i]] == prep.plan.offsets[node.outputs[0]]
            assert (j == 0) == same


@pytest.mark.parametrize("lowering, target", [(lower, CPU), (lower_ptx, GPU)], ids=["cpu", "ptx"])
def test_a_joined_concat_has_no_code(lowering, target):
    g = parse_graph(BRANCHES)
    prep = driver.prepare(g, target, 1, optimize=False, kernels={"Relu", "Neg", "Concat", "Exp"}, backend="test")
    assert prep.plan.joined_outputs == {"c"}
    assert [driver.placement(prep, n) is None for n in prep.graph.nodes] == [False, False, True, False]
    low = lowering(g, target, optimize=False)
    kernels = low.kernel_count if hasattr(low, "kernel_count") else len(low.kernels)
    assert kernels == 3  # Relu, Neg, Exp


def test_a_joined_concat_computes_its_operands_into_its_output():
    from cuvil.compiler import run_reference
    from cuvil.edge_runtime.compile import compile_graph

    g = parse_graph(BRANCHES)
    x = {"x": np.random.default_rng(0).standard_normal((1, 16, 4, 4)).astype(np.float32)}
    sess = compile_graph(g, optimize=False, use_cache=False)
    assert sess.lowered.plan.joined_outputs == {"c"}
    np.testing.assert_allclose(sess.run(x)["y"], run_reference(g, x)["y"], rtol=1e-6)


def test_a_kernels_scratch_reuses_the_bytes_of_a_dead_activation():
    """a (1 MiB) dies at the stride-2 conv; the next conv's scratch (its padded copy or Winograd
    transforms) then lies in a's old bytes, inside the values' arena, and the output is still right."""
    from cuvil.compiler import DType, Node, TensorType, infer_graph_types, run_reference, verify
    from cuvil.compiler.memory.scratch import check_scratch
    from cuvil.edge_runtime.compile import compile_graph

    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
          for shape in ((64, 16, 1, 1), (16, 64, 3, 3), (16, 16, 3, 3))]
    conv = dict(dilations=[1, 1], group=1)
    g = verify(infer_graph_types("g", {"x": TensorType(DType.F32, (1, 16, 64, 64))}, dict(zip(("w1", "w2", "w3"), ws)), [
        Node.make("Conv", ["x", "w1"], ["a"], strides=[1, 1], pads=[0, 0, 0, 0], **conv),
        Node.make("Conv", ["a", "w2"], ["b"], strides=[2, 2], pads=[1, 1, 1, 1], **conv),
        Node.make("Conv", ["b", "w3"], ["y"], strides=[1, 1], pads=[1, 1, 1, 1], **conv)], ["y"]))
    sess = compile_graph(g, target="x86-avx2", optimize=False, use_cache=False, tune=False, threads=1)
    low = sess.lowered
    third = [s for s in low.scratch_spans if s.first == 3]
    assert third and third[0].hi <= low.plan.arena_bytes  # within the values' bytes, not above them
    a = (low.plan.offsets["a"], low.plan.offsets["a"] + low.plan.sizes["a"])
    assert a[0] < third[0].hi and third[0].lo < a[1]  # in a's old bytes
    check_scratch(g, low.plan, low.scratch_spans, low.arena_bytes)
    x = {"x": rng.standard_normal((1, 16, 64, 64)).astype(np.float32)}
    np.testing.assert_allclose(sess.run(x)["y"], run_reference(g, x)["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lowering, target", [(lower, CPU), (lower_ptx, GPU)], ids=["cpu", "ptx"])
def test_identical_nodes_share_one_kernel(lowering, target):
    low = lowering(parse_graph(RELUS), target, optimize=False)
    kernels = low.kernel_count if hasattr(low, "kernel_count") else len(low.kernels)
    assert kernels <= 2  # in place or not: at most one kernel per distinct aliasing pattern


def test_weight_block_array_is_aligned_read_only_and_holds_each_tensor_at_its_offset():
    block = WeightBlock()
    a, b = np.arange(5, dtype=np.float32), np.arange(7, dtype=np.int8).reshape(7, 1)
    at_a, at_b = block.add(("a", None), a), block.add(("b", "packed"), b)
    assert block.add(("a", None), a) == at_a == 0 and at_b == 64  # each (name, layout) once, 64-byte aligned
    expected = block.tobytes()
    out = block.array()
    assert out.tobytes() == expected and len(out) == 128
    assert out.ctypes.data % 64 == 0 and not out.flags.writeable
    assert out[:20].view(np.float32).tolist() == [0, 1, 2, 3, 4] and out[64:71].tolist() == list(range(7))


def test_weight_block_places_a_key_again_when_its_bytes_differ():
    """A layout does not say everything a packing depends on (a conv's input size, a GEMM's alpha): the
    same (name, layout) with other bytes is a copy of its own, with equal bytes the copy already there."""
    block = WeightBlock()
    a, b = np.arange(6, dtype=np.float32), np.arange(6, dtype=np.float32)[::-1]
    at_a = block.add(("w", "conv"), a)
    at_b = block.add(("w", "conv"), b)
    assert at_b != at_a and block.add(("w", "conv"), b.copy()) == at_b and block.add(("w", "conv"), a) == at_a
    out = block.array()
    assert out[at_a:at_a + 24].view(np.float32).tolist() == a.tolist()
    assert out[at_b:at_b + 24].view(np.float32).tolist() == b.tolist()


@pytest.mark.parametrize("k, sizes", [(3, (16, 8)), (3, (8, 32, 5)), (1, (12, 4))])
def test_one_weight_read_by_convs_of_other_input_sizes(k, sizes):
    """A conv weight shared by convs on inputs of other sizes (a detection head over pyramid levels): each
    reads its own packing of it (the second read the first's: outputs off by 100, or a crash)."""
    from cuvil.compiler import DType, Node, TensorType, infer_graph_types, run_reference, verify
    from cuvil.edge_runtime.compile import compile_graph

    rng = np.random.default_rng(0)
    consts = {"w": (rng.standard_normal((36, 48, k, k)) * 0.1).astype(np.float32)}
    conv = dict(strides=[1, 1], pads=[k // 2] * 4, dilations=[1, 1], group=1)
    nodes = [Node.make("Conv", [f"x{i}", "w"], [f"y{i}"], **conv) for i in range(len(sizes))]
    inputs = {f"x{i}": TensorType(DType.F32, (1, 48, s, s)) for i, s in enumerate(sizes)}
    graph = verify(infer_graph_types("shared", inputs, consts, nodes, [f"y{i}" for i in range(len(sizes))]))
    feeds = {f"x{i}": rng.standard_normal((1, 48, s, s)).astype(np.float32) for i, s in enumerate(sizes)}
    got, want = run_in_child(compile_graph(graph, use_cache=False), feeds), run_reference(graph, feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)
