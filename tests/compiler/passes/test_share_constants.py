import numpy as np
import torch
from torch import nn

from cuvil.compiler import DType, N, Node
from cuvil.compiler.frontends.torch import import_torch
from cuvil.compiler.passes.pipeline import DEFAULT_PIPELINE
from cuvil.compiler.passes.share_constants import PROBE, share_constants

from .graphs import assert_same, f32, graph, weights


def test_identical_constants_become_one_and_every_reader_reads_it(rng):
    w = weights(rng, 4, 4)
    g = graph({"x": f32(N, 4)}, {"a": w, "b": w.copy(), "c": w.copy()}, [
        Node.make("MatMul", ["x", "a"], ["y1"]), Node.make("MatMul", ["y1", "b"], ["y2"]),
        Node.make("MatMul", ["y2", "c"], ["y"])], ["y"])
    out = share_constants(g)
    assert set(out.constants) == {"a"} and [n.inputs[1] for n in out.nodes] == ["a", "a", "a"]
    assert_same(g, out, rng)


def test_constants_that_differ_anywhere_or_in_kind_stay_apart(rng):
    w = weights(rng, 8, 8)
    late = w.copy()
    late.reshape(-1)[-1] += 1  # the same first PROBE bytes, another last one
    assert w.nbytes > PROBE
    g = graph({"x": f32(2, 8)}, {"a": w, "late": late, "other_shape": w.reshape(4, 16)}, [
        Node.make("MatMul", ["x", "a"], ["y1"]), Node.make("MatMul", ["y1", "late"], ["y2"]),
        Node.make("Reshape", ["y2"], ["r"], shape=[1, 16]), Node.make("Add", ["r", "other_shape"], ["y"])], ["y"])
    assert share_constants(g) is g
    ints = graph({"x": f32(N, 8)}, {"a": w, "bits": w.view(np.int32)}, [
        Node.make("MatMul", ["x", "a"], ["y1"]), Node.make("Cast", ["bits"], ["z"], to=DType.F32),
        Node.make("MatMul", ["y1", "z"], ["y"])], ["y"])
    assert share_constants(ints) is ints  # the same bytes as another dtype


def test_a_constant_that_is_a_graph_output_keeps_its_name(rng):
    w = weights(rng, 4)
    g = graph({"x": f32(4)}, {"a": w, "out": w.copy()}, [Node.make("Add", ["x", "a"], ["y"])], ["y", "out"])
    out = share_constants(g)
    assert set(out.constants) == {"a", "out"} and out.outputs == ("y", "out")


def test_an_exported_lstm_holds_each_weight_once():
    """torch's export transposes each recurrent matrix once per step: 8 steps, 7 more copies of each."""
    torch.manual_seed(0)
    lstm = nn.LSTM(16, 32, batch_first=True).eval()
    x = torch.randn(1, 8, 16)
    graph = import_torch(lstm, (x,))
    sizes = sorted(v.nbytes for v in graph.constants.values())
    assert sizes.count(32 * 4 * 32 * 4) == 1  # weight_hh (128 x 32 floats), once
    assert sum(sizes) < 2 * sum(p.numel() * 4 for p in lstm.parameters())
    with torch.no_grad():
        want = lstm(x)[0].numpy()
    from cuvil.compiler.interpreter import run_reference
    got = run_reference(graph, {graph.inputs[0]: x.numpy()})
    assert np.allclose(got[graph.outputs[0]], want, atol=1e-5)


def test_named_parameters_stay_and_a_repeated_copy_becomes_one_of_them(rng):
    ones = np.ones(4, np.float32)
    g = graph({"x": f32(N, 4)}, {"bn.weight": ones, "bn.running_var": ones.copy(), "folded_1": ones.copy()}, [
        Node.make("Mul", ["x", "bn.weight"], ["a"]), Node.make("Add", ["a", "bn.running_var"], ["b"]),
        Node.make("Sub", ["b", "folded_1"], ["y"])], ["y"])
    out = share_constants(g, keep={"bn.weight", "bn.running_var"})
    assert set(out.constants) == {"bn.weight", "bn.running_var"} and out.nodes[-1].inputs[1] == "bn.weight"


def test_it_runs_right_after_folding():
    names = [p.__name__ for p in DEFAULT_PIPELINE]
    assert names.index("share_constants") == names.index("fold_constants") + 1
