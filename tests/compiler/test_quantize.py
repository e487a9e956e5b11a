"""Post-training quantization: per-channel symmetric weights, calibrated activations, the report."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from cuvil.compiler import DType, N, TensorType, run_reference
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.frontends.onnx import import_onnx
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.passes.pipeline import optimize
from cuvil.compiler.quantize import QuantizationError, quantize
from cuvil.devices.detect import resolve_target
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.compile import compile_graph

from tests.guarded import run_in_child
from tests.qdq import draws
from tests.zoo import export_onnx


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))
        self.c2 = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU6())
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        y = self.c1(x)
        return self.fc(torch.flatten(y + self.c2(y), 1))


@pytest.fixture(scope="module")
def float_graph():
    torch.manual_seed(0)
    net = _Net().eval()
    with torch.no_grad():
        net.c1[1].running_var.uniform_(0.5, 1.5)
    return optimize(import_onnx(export_onnx(net, (torch.randn(1, 2, 8, 8),), dynamic_batch=True)),
                    passes=())


def _calib(n=24, seed=0):
    return {"input": np.stack(draws((2, 8, 8), n, seed))}


def test_quantized_graph_runs_on_integer_ops_and_matches_float(float_graph):
    done = quantize(float_graph, _calib())
    ops = Counter(n.op for n in optimize(done.graph).nodes)
    assert ops["QConv"] == 2 and ops["QAdd"] == 1 and ops["QMatMul"] == 1 and ops["MaxPool"] == 1
    for n in done.graph.nodes:  # weights: per output channel, symmetric, int8 using the full range
        if n.op == "DequantizeLinear" and n.inputs[0] in done.graph.constants:
            w = done.graph.constants[n.inputs[0]]
            assert not any(n.attr["zero_point"])
            if w.dtype == np.int8:
                assert len(n.attr["scale"]) == w.shape[n.attr["axis"]] > 1
                assert np.abs(np.moveaxis(w, n.attr["axis"], 0).reshape(w.shape[n.attr["axis"]], -1)).max(1).min() == 127
    report = done.report
    assert {e.op for e in report.layers} == {"Conv", "Gemm", "Add"} and len(report.layers) == 4
    assert all(0 < e.rel_rms < 0.1 for e in report.layers) and report.output_rel_rms < 0.1
    assert report.top1_agreement >= 0.9 and "top-1 agreement" in report.format()
    held_out = _calib(8, seed=5)["input"]
    want = run_reference(float_graph, {"input": held_out})["output"]
    got = run_reference(optimize(done.graph), {"input": held_out})["output"]
    assert np.linalg.norm(got - want) < 0.1 * np.linalg.norm(want)  # held-out inputs may leave the calibrated range


def test_compiled_int8_equals_the_int8_reference(float_graph):
    graph = optimize(quantize(float_graph, _calib()).graph)
    sess = compile_graph(graph, optimize=False, use_cache=False, jobs=1, guard_pages=True)
    x = _calib(3, seed=9)["input"]
    for i in range(3):
        assert np.array_equal(run_in_child(sess, {"input": x[i:i + 1]})["output"],
                              run_reference(graph, {"input": x[i:i + 1]})["output"])


def test_outputs_stay_float_unless_requantized(float_graph):
    """By default the last layer (the Gemm) emits float32 logits; ``requantize_outputs`` puts them
    through u8 as before."""
    default, requant = quantize(float_graph, _calib()), quantize(float_graph, _calib(), requantize_outputs=True)
    last = optimize(default.graph).nodes[-1]
    assert last.op == "QMatMul" and last.attr["to"] is DType.F32 and last.outputs == ("output",)
    ops = [n.op for n in optimize(requant.graph).nodes]
    assert ops[-2:] == ["QMatMul", "DequantizeLinear"]
    x = _calib(64, seed=3)["input"]
    want = run_reference(float_graph, {"input": x})["output"]
    for done in (default, requant):
        assert {e.op for e in done.report.layers} == {"Conv", "Gemm", "Add"} and len(done.report.layers) == 4
    levels = [np.unique(run_reference(optimize(d.graph), {"input": x})["output"]).size for d in (default, requant)]
    assert levels[1] <= 256 < levels[0]  # u8 logits take at most 256 values; float ones are not on a grid
    err = [np.abs(run_reference(optimize(d.graph), {"input": x})["output"] - want).max() for d in (default, requant)]
    assert err[0] < err[1]


def test_a_conv_output_is_still_requantized():
    """Only QMatMul has a float-output form: a graph ending in a conv keeps its QConv and u8 output."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 3, 1)).eval()
    g = optimize(import_onnx(export_onnx(net, (torch.randn(1, 2, 8, 8),), dynamic_batch=True)), passes=())
    ops = [n.op for n in optimize(quantize(g, _calib()).graph).nodes]
    assert ops.count("QConv") == 2 and ops[-1] == "DequantizeLinear" and "Conv" not in ops


def test_reduce_range_weights_are_7_bit_and_run_vpmaddubsw_exactly_at_avx2(float_graph):
    """7-bit weights let AVX2 (no VNNI) multiply u8 x s8 pairs with vpmaddubsw without saturating."""
    graph = optimize(quantize(float_graph, _calib(), reduce_range=True).graph)
    weights = [graph.constants[n.inputs[1]] for n in graph.nodes if n.op == "QConv"]
    assert len(weights) == 2
    for w in weights:
        per_channel = np.abs(w.reshape(w.shape[0], -1).astype(np.int32)).max(1)
        assert per_channel.max() == 63 and per_channel.min() == 63  # each channel's largest weight: 63
    target = resolve_target("x86-avx2")
    asm = jit.emit_assembly(lower(graph, target, optimize=False).llvm_ir, target)
    assert "vpmaddubsw" in asm
    sess = compile_graph(graph, target=target, optimize=False, use_cache=False, jobs=1)
    x = _calib(2, seed=9)["input"]
    for i in range(2):
        assert np.array_equal(sess.run({"input": x[i:i + 1]})["output"],
                              run_reference(graph, {"input": x[i:i + 1]})["output"])


def test_percentile_calibration_clips_outliers(float_graph):
    calib = _calib()
    calib["input"][0, 0, 0, 0] = 400.0  # one outlier in 3072 values
    scale = {}
    for method in ("minmax", "percentile"):
        g = quantize(float_graph, calib, method=method, percentile=99.9).graph
        scale[method] = next(n.attr["scale"][0] for n in g.nodes if n.op == "QuantizeLinear")
    assert scale["minmax"] >= 400 / 255 and scale["percentile"] < scale["minmax"] / 20


def test_bad_calibration_and_options_are_refused(float_graph):
    with pytest.raises(QuantizationError, match="exactly the inputs"):
        quantize(float_graph, {"x": np.zeros((2, 2, 8, 8), np.float32)})
    with pytest.raises(QuantizationError, match="method"):
        quantize(float_graph, _calib(), method="kl")
    with pytest.raises(QuantizationError, match="no calibration"):
        quantize(float_graph, [])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_calibration_inputs_that_are_not_finite_are_refused(float_graph, bad):
    """NaN calibration data signed a model of scale-1 ranges, its report saying rel. RMS nan and 100%
    top-1 agreement, exit 0."""
    calib = _calib()
    calib["input"][3, 1, 2, 2] = bad
    with pytest.raises(QuantizationError, match="NaN or infinite values \\(1 of"):
        quantize(float_graph, calib)


def test_a_model_that_overflows_on_its_calibration_inputs_is_refused():
    """Finite inputs, an infinite activation inside (x * 1e30 * 1e30 before a Gemm): no range is chosen."""
    gb = GraphBuilder("overflow")
    x = gb.input("x", TensorType(DType.F32, (N, 4)))
    big = gb.add1("Mul", [gb.add1("Mul", [x, gb.constant(np.float32(1e30), "a")]), gb.constant(np.float32(1e30), "b")])
    y = gb.add1("Gemm", [big, gb.constant(np.ones((3, 4), np.float32), "w")], transB=1)
    with pytest.raises(QuantizationError, match="reach NaN or infinity"):
        quantize(gb.build([y]), {"x": np.ones((8, 4), np.float32)})


def test_bias_correction_takes_the_weights_mean_error_out_of_each_output():
    """A Linear layer on positive inputs (ReLU outputs' kind): rounding its weights shifts each output
    by sum (w_int8 - w) * E[x]; with bias correction the int8 outputs' mean error per channel is far
    smaller, and the report says it was on."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.ReLU(), nn.Linear(256, 16)).eval()
    g = optimize(import_onnx(export_onnx(net, (torch.randn(1, 256),), dynamic_batch=True)), passes=())
    calib = {"input": np.stack(draws((256,), 512, 0)) + 1.0}
    want = run_reference(g, calib)["output"]
    bias = {}
    for on in (False, True):
        done = quantize(g, calib, bias_correction=on)
        bias[on] = np.abs((run_reference(optimize(done.graph), calib)["output"] - want).mean(axis=0))
        assert ("bias correction" in done.report.format()) == on
    assert bias[True].max() < 0.2 * bias[False].max(), (bias[False], bias[True])


@pytest.mark.parametrize("method", ["mse", "entropy"])
def test_mse_and_entropy_calibrations_quantize_and_report(float_graph, method):
    done = quantize(float_graph, _calib(), method=method)
    assert f"{method} calibration" in done.report.format() and done.report.output_rel_rms < 0.1
    ops = Counter(n.op for n in optimize(done.graph).nodes)
    assert ops["QConv"] == 2 and ops["QMatMul"] == 1


def _wide_first_feature(count: int, seed: int):
    """An MLP whose input's first feature is 300x the others (the first layer weighs it like them):
    its u8 grid leaves the other features a few steps, so the first layer is the costly one; and
    ``count`` inputs drawn for it."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    with torch.no_grad():
        net[0].weight[:, 0] /= 300
    x = np.stack(draws((16,), count, seed))
    x[:, 0] *= 300
    return optimize(import_onnx(export_onnx(net, (torch.randn(1, 16),), dynamic_batch=True)), passes=()), {"input": x}


def test_sensitivity_names_the_costly_layer_and_float_layers_keeps_it_float():
    """The first layer alone costs the output most; kept in float, the output error drops."""
    g, calibration = _wide_first_feature(256, 0)
    x = calibration["input"]
    first = next(n.name for n in g.nodes if n.op == "Gemm")
    done = quantize(g, {"input": x}, sensitivity=True)
    alone = {e.node: e.alone_rel_rms for e in done.report.layers}
    assert len(alone) == 3 and max(alone, key=alone.get) == first and f"costs most: {first}" in done.report.format()
    kept = quantize(g, {"input": x}, float_layers=[first])
    assert kept.report.float_layers == (first,) and first not in {e.node for e in kept.report.layers}
    assert f"kept in float: {first}" in kept.report.format()
    assert kept.report.output_rel_rms < 0.5 * done.report.output_rel_rms
    ops = [n.op for n in optimize(kept.graph).nodes]
    assert ops.count("QMatMul") == 2 and ops[0] == "FusedGemm"  # the first layer in float, with its ReLU
    gemm = next(n for n in kept.graph.nodes if n.name == first)
    assert all(i in g.constants and np.array_equal(kept.graph.constants[i], g.constants[i]) for i in gemm.inputs[1:])
    with pytest.raises(QuantizationError, match="not layers int8 runs here"):
        quantize(g, {"input": x}, float_layers=["nope"])


def test_target_agreement_keeps_the_leading_layer_in_float_where_int8_misses_it():
    """All int8, 91% of the check inputs keep their top-1 class (measured 2026-12-05); the first layer
    in float, 99.8%. A target between takes that one layer, a target met all int8 takes none, and a
    target no search reaches is an error that says the best it found."""
    g, calibration = _wide_first_feature(256, 0)
    _, check = _wide_first_feature(400, 1)
    first = next(n.name for n in g.nodes if n.op == "Gemm")
    done = quantize(g, calibration, target_agreement=0.99, check_inputs=check)
    search = done.report.float_search
    assert search.chosen == 1 and done.report.float_layers == (first,) and search.inputs == 400
    assert [s.float_count for s in search.steps] == [0, 1]
    assert search.steps[0].agreement < 0.95 and search.steps[1].agreement >= 0.99
    assert "the first 1 layers in float" in done.report.format() and f"kept in float: {first}" in done.report.format()
    want = run_reference(g, check)["output"].argmax(-1)
    int8_all = run_reference(quantize(g, calibration).graph, check)["output"].argmax(-1)
    kept = run_reference(done.graph, check)["output"].argmax(-1)
    assert (kept == want).mean() >= 0.99 > (int8_all == want).mean()
    assert quantize(g, calibration, target_agreement=0.8, check_inputs=check).report.float_search.chosen == 0
    with pytest.raises(QuantizationError, match=r"not reached even with 2 of 3 layers in float \(best 99\.8%\)"):
        quantize(g, calibration, target_agreement=1.0, check_inputs=check)


def test_target_agreement_options_are_checked(float_graph):
    with pytest.raises(QuantizationError, match="target_agreement must be in"):
        quantize(float_graph, _calib(), target_agreement=1.5)
    with pytest.raises(QuantizationError, match="check_inputs are for target_agreement"):
        quantize(float_graph, _calib(), check_inputs=_calib(8, 1))
    with pytest.raises(QuantizationError, match="each check item must map exactly the inputs"):
        quantize(float_graph, _calib(), target_agreement=0.9, check_inputs={"other": np.zeros((4, 2, 8, 8), np.float32)})


def test_target_agreement_needs_classes(rng):
    """A single regression output has no top-1 to agree on."""
    gb = GraphBuilder("regress")
    h = gb.input("input", TensorType(DType.F32, (N, 8)))
    h = gb.add1("Gemm", [h, gb.constant(rng.standard_normal((8, 8)).astype(np.float32), "w0")], name="l0")
    g = gb.build([gb.add1("Gemm", [h, gb.constant(rng.standard_normal((8, 1)).astype(np.float32), "w1")], name="l1")])
    with pytest.raises(QuantizationError, match="needs an output with classes"):
        quantize(g, {"input": rng.standard_normal((16, 8)).astype(np.float32)}, target_agreement=0.9)


def test_an_unknown_float_layer_names_a_few_layers_not_all(rng):
    """A model with many layers: the error stays one readable line."""
    gb = GraphBuilder("deep")
    h = gb.input("input", TensorType(DType.F32, (N, 8)))
    for i in range(20):
        h = gb.add1("Gemm", [h, gb.constant(rng.standard_normal((8, 8)).astype(np.float32), f"w{i}")], name=f"layer{i}")
    g = gb.build([h])
    with pytest.raises(QuantizationError) as info:
        quantize(g, {"input": rng.standard_normal((16, 8)).astype(np.float32)}, float_layers=["nope"])
    msg = str(info.value)
    assert "layer0, layer1" in msg and "layer19" not in msg and "and 12 more" in msg and "\n" not in msg


def test_a_gemm_with_alpha_and_beta_keeps_its_bias_once():
    """The quantized bias holds beta * b, so the Gemm's beta becomes 1 (it multiplied the bias twice
    before) and the pattern fuses to a QMatMul; bias correction works in the same units."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((8, 16)).astype(np.float32), 3 * rng.standard_normal(8).astype(np.float32)
    node = helper.make_node("Gemm", ["input", "W", "b"], ["output"], transB=1, alpha=2.0, beta=0.5)
    proto = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")]), opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(onnx.load_from_string(proto.SerializeToString()))
    x = {"input": rng.standard_normal((64, 16)).astype(np.float32) + 0.5}
    want = 2.0 * x["input"] @ w.T + 0.5 * b
    for on in (False, True):
        q = quantize(g, x, bias_correction=on).graph
        got = run_reference(q, x)["output"]
        assert np.linalg.norm(got - want) < 0.02 * np.linalg.norm(want)
        assert [n.op for n in optimize(q).nodes][-1] == "QMatMul"


def test_a_weight_used_at_every_step_is_held_once_in_integer_form():
    """A recurrent model's one weight matrix feeds a MatMul per time step; each is quantized on its own,
    and the int8 bundle (the integer form) held the same bytes once per step: 6.5x the fp32 bundle."""
    from cuvil.compiler.quantize import integer_form

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    gb = GraphBuilder("steps")
    h = gb.input("x", TensorType(DType.F32, (1, 64)))
    shared = gb.constant(w, "W")
    for _ in range(6):
        h = gb.add1("Relu", [gb.add1("MatMul", [h, shared])])
    g = gb.build([h])
    x = {"x": rng.standard_normal((32, 64)).astype(np.float32)}
    q = quantize(g, x).graph
    form = integer_form(q)
    int8_weights = [v for v in form.constants.values() if v.dtype == np.int8 and v.size == w.size]
    assert len(int8_weights) == 1
    assert sum(v.nbytes for v in form.constants.values()) < 0.3 * w.nbytes
    one = {"x": x["x"][:1]}
    np.testing.assert_array_equal(run_reference(form, one)[form.outputs[0]], run_reference(q, one)[q.outputs[0]])


def test_one_dimensional_convs_are_quantized_too():
    """Conv1d layers (TCNs, WaveNet, PointNet, audio front ends) were left in float without a word in the
    report: they become QConvs over a height of one, reported, and the compiled int8 equals its reference."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv1d(16, 8, 3, dilation=2, padding=2),
                        nn.ReLU(), nn.Flatten(), nn.Linear(8 * 40, 4)).eval()
    graph = optimize(import_onnx(export_onnx(net, (torch.randn(1, 3, 40),), dynamic_batch=False)), passes=())
    calib = {graph.inputs[0]: np.random.default_rng(0).standard_normal((24, 3, 40)).astype(np.float32)}
    done = quantize(graph, calib)
    ops = Counter(n.op for n in optimize(done.graph).nodes)
    assert ops["QConv"] == 2 and ops["Conv"] == 0 and [e.op for e in done.report.layers].count("Conv") == 2
    q = optimize(done.graph)
    x = calib[graph.inputs[0]][:1]
    got = compile_graph(q, optimize=False, use_cache=False).run({graph.inputs[0]: x})
    assert np.array_equal(got[q.outputs[0]], run_reference(q, {graph.inputs[0]: x})[q.outputs[0]])
