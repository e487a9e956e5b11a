"""ONNX LSTM, GRU and RNN (onnx_recurrent: unrolled into op-set-v1 ops) against ONNX Runtime: gate
orders, GRU's linear_before_reset, directions, layouts, initial states, peepholes, clip; the forms
left out fail with a typed error. The reference interpreter runs most cases; one compiles natively."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.compiler.errors import UnsupportedModelError
from cuvil.compiler.frontends.onnx import import_onnx
from cuvil.compiler import run_reference
from cuvil.edge_runtime.compile import compile_graph

from .test_onnx_frontend import check, make_model, run_ort

F = TensorProto.FLOAT
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
S, B, I, H = 5, 2, 3, 4  # steps, batch, features, hidden


def recurrent(rng, op, direction="forward", layout=0, bias=True, states=(), peephole=False, lens=None, opset=17,
              outputs=None, **attrs):
    """A model of one ``op`` node over input ``x``; ``states``: which of initial_h/initial_c it is given."""
    d, g = (2 if direction == "bidirectional" else 1), GATES[op]
    inits = {"w": rng.standard_normal((d, g * H, I)), "r": rng.standard_normal((d, g * H, H)) * 0.5}
    if bias:
        inits["b"] = rng.standard_normal((d, 2 * g * H))
    if lens is not None:
        inits["lens"] = np.asarray(lens, np.int32)
    for name in states:
        inits[name] = rng.standard_normal((B, d, H) if layout else (d, B, H))
    if peephole:
        inits["p"] = rng.standard_normal((d, 3 * H))
    names = ["x", "w", "r", "b" if bias else "", "lens" if lens is not None else "",
             "h0" if "h0" in states else "", "c0" if "c0" in states else "", "p" if peephole else ""]
    while not names[-1]:
        names.pop()
    outputs = outputs or (["y", "yh", "yc"] if op == "LSTM" else ["y", "yh"])
    node = helper.make_node(op, names, outputs, hidden_size=H, direction=direction,
                            **({"layout": layout} if layout else {}), **attrs)
    inits = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in inits.items()}
    model = make_model([node], {"x": (F, [B, S, I] if layout else [S, B, I])}, [o for o in outputs if o], inits, opset)
    return model, {"x": rng.standard_normal((B, S, I) if layout else (S, B, I)).astype(np.float32)}


@pytest.mark.parametrize("op, kw", [
    ("LSTM", {}),
    ("LSTM", {"direction": "bidirectional", "states": ("h0", "c0"), "peephole": True}),
    ("LSTM", {"direction": "reverse", "layout": 1, "opset": 14, "states": ("c0",), "clip": 0.7, "lens": [S] * B}),
    ("LSTM", {"bias": False, "activations": ["Relu", "Tanh", "Sigmoid"], "outputs": ["", "yh"]}),
    ("GRU", {"linear_before_reset": 1}),
    ("GRU", {"direction": "bidirectional", "states": ("h0",)}),
    ("GRU", {"linear_before_reset": 1, "direction": "reverse", "states": ("h0",), "layout": 1, "opset": 14}),
    ("RNN", {"direction": "bidirectional", "states": ("h0",), "activations": ["Relu", "Tanh"]}),
])
def test_recurrent_matches_onnxruntime(rng, op, kw):
    model, feeds = recurrent(rng, op, **kw)
    if not kw.get("layout"):
        check(model, feeds)
        return
    got = run_reference(import_onnx(model), feeds)
    for name, want in batch_major_by_onnxruntime(model, feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def batch_major_by_onnxruntime(model, feeds):
    """Outputs of a ``layout=1`` model, by ONNX Runtime (which only runs layout 0) on the time-major
    model: inputs and initial states transposed in, outputs transposed back."""
    (node,) = model.graph.node
    for a in node.attribute:
        if a.name == "layout":
            a.i = 0
    for t in model.graph.initializer:
        if t.name in ("h0", "c0"):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).transpose(1, 0, 2), t.name))
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", F, [S, B, I]))
    out = run_ort(model, {"x": feeds["x"].transpose(1, 0, 2)})
    return {k: v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2) for k, v in out.items()}


def test_a_compiled_lstm_matches_onnxruntime(rng):
    model, feeds = recurrent(rng, "LSTM", direction="bidirectional", states=("h0", "c0"))
    graph = import_onnx(model)
    got = compile_graph(graph, use_cache=False).run(feeds)
    for name, want in run_ort(model, feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("kw, why", [
    ({"lens": [S, S - 2]}, "sequence_lens shorter"),
    ({"input_forget": 1}, "input_forget"),
    ({"activations": ["HardSigmoid", "Tanh", "Tanh"], "activation_alpha": [0.3]}, "alpha/beta"),
    ({"activations": ["Softsign", "Tanh", "Tanh"]}, "activation Softsign"),
])
def test_forms_left_out_are_refused_by_name(rng, kw, why):
    with pytest.raises(UnsupportedModelError, match=f"LSTM \\([^)]*{why}"):
        import_onnx(recurrent(rng, "LSTM", **kw)[0])
