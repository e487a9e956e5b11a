"""ONNX control flow (If, Loop, Scan) unrolled at import, against ONNX Runtime; bounds on hostile models."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from onnx import TensorProto, helper, numpy_helper

from cuvil.compiler import run_reference
from cuvil.compiler.bundle.reader import read_bundle
from cuvil.compiler.bundle.writer import bundle_bytes
from cuvil.compiler.errors import LimitError, UnsupportedModelError
from cuvil.compiler.frontends import onnx_control
from cuvil.compiler.frontends.onnx import import_onnx

from .test_onnx_frontend import make_model, run_ort

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def graph(nodes, inputs, outputs, name="body"):
    return helper.make_graph(nodes, name, inputs, outputs)


def matches_ort(model, feeds, constant_inputs=None):
    """Import, run the reference interpreter, compare with ONNX Runtime in order; return the graph."""
    g = import_onnx(model, constant_inputs=constant_inputs)
    want = list(run_ort(model, feeds).values())
    got = run_reference(g, {k: v for k, v in feeds.items() if k not in (constant_inputs or {})})
    assert len(got) == len(want)
    for out, w in zip(g.outputs, want):
        assert got[out].shape == w.shape and got[out].dtype == w.dtype, (out, got[out].shape, w.shape)
        np.testing.assert_allclose(got[out], w, rtol=1e-5, atol=1e-6)
    return g


def if_model(cond_from_shape=False, else_shape=(2, 3)):
    """y = If(cond) then x + 1 (outer-scope x) else x * 2 (or a different shape)."""
    then_g = graph([const("one", np.float32(1)), helper.make_node("Add", ["x", "one"], ["t"])], [], [vi("t", F, None)], "then")
    if else_shape == (2, 3):
        else_nodes = [const("two", np.float32(2)), helper.make_node("Mul", ["x", "two"], ["e"])]
    else:
        else_nodes = [const("e", np.zeros(else_shape, np.float32))]
    else_g = graph(else_nodes, [], [vi("e", F, None)], "else")
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    inputs = {"x": (F, [2, 3])}
    if cond_from_shape:  # exporters compare shapes: the condition folds at import
        nodes[:0] = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("ReduceProd", ["s"], ["p"], keepdims=0),
                     helper.make_node("Equal", ["p", "six"], ["c"])]
        return make_model(nodes, inputs, ["y"], {"six": np.int64(6)}, 13)
    inputs["c"] = (B, [])
    return make_model(nodes, inputs, ["y"], opset=13)


@pytest.mark.parametrize("cond", [True, False])
def test_if_on_a_run_time_condition_selects_between_both_branches(rng, cond):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    g = matches_ort(if_model(), {"x": x, "c": np.array(cond)})
    assert "Where" in {n.op for n in g.nodes}


def test_if_on_a_condition_known_at_import_keeps_only_its_branch(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    g = matches_ort(if_model(cond_from_shape=True), {"x": x})
    assert {n.op for n in g.nodes} == {"Add"}


def test_if_branches_of_different_shapes_on_a_run_time_condition_are_unsupported():
    with pytest.raises(UnsupportedModelError, match=r"If \(a condition computed at run time picks between outputs "
                                                    r"of types f32\[2, 3\] and f32\[4\]\)") as e:
        import_onnx(if_model(else_shape=(4,)))
    assert e.value.constant_inputs == ("c",)


def scan_model(opset=13, reverse=False, axis=0):
    """Running sum over ``x`` on ``axis``; scan outputs the partial sums (stacked on axis 1) and their doubles."""
    body = graph([helper.make_node("Add", ["s_in", "xi"], ["s_out"]), helper.make_node("Add", ["s_out", "s_out"], ["d"])],
                 [vi("s_in", F, [3]), vi("xi", F, [3])], [vi("s_out", F, [3]), vi("d", F, [3])])
    x_shape = [4, 3] if axis == 0 else [3, 4]
    if opset == 8:
        node = helper.make_node("Scan", ["", "s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                                directions=[int(reverse)])
        return make_model([node], {"s0": (F, [2, 3]), "x": (F, [2, *x_shape])}, ["s", "ys"], opset=8)
    node = helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[axis],
                            scan_input_directions=[int(reverse)], scan_output_axes=[1], scan_output_directions=[int(reverse)])
    return make_model([node], {"s0": (F, [3]), "x": (F, x_shape)}, ["s", "ys"], opset=opset)


@pytest.mark.parametrize("reverse, axis", [(False, 0), (True, 0), (False, 1), (True, -1)])
def test_scan_unrolls_over_its_axis_in_either_direction(rng, reverse, axis):
    model = scan_model(reverse=reverse, axis=axis)
    x = rng.standard_normal((4, 3) if axis == 0 else (3, 4)).astype(np.float32)
    matches_ort(model, {"s0": rng.standard_normal(3).astype(np.float32), "x": x})


def test_scan_8_runs_once_per_batch_row_and_keeps_its_interface(rng):
    """(onnx.version_converter's Scan 8 -> 9 would drop the batch axis of the graph inputs.)"""
    model = scan_model(opset=8, reverse=True)
    attrs = model.graph.node[0].attribute  # Scan 8's default direction; then the same with "directions"
    attrs.remove(next(a for a in attrs if a.name == "directions"))
    feeds = {"s0": rng.standard_normal((2, 3)).astype(np.float32), "x": rng.standard_normal((2, 4, 3)).astype(np.float32)}
    matches_ort(model, feeds)
    matches_ort(scan_model(opset=8, reverse=True), feeds)


def loop_model(trip_input=False, trips=5, cond_init=True):
    """Adds row ``i`` of a table to ``y`` for i < trips; a scan output keeps every partial y."""
    table = np.arange(24, dtype=np.float32).reshape(6, 4)
    body = graph([const("table", table), const("one", np.int64(1)),
                  helper.make_node("Add", ["i", "one"], ["end"]),
                  helper.make_node("Unsqueeze", ["i", "zero"], ["start1"]), helper.make_node("Unsqueeze", ["end", "zero"], ["end1"]),
                  helper.make_node("Slice", ["table", "start1", "end1"], ["row"]),
                  helper.make_node("Add", ["y_in", "row"], ["y_out"]), helper.make_node("Identity", ["y_out"], ["keep"]),
                  helper.make_node("Identity", ["c_in"], ["c_out"])],
                 [vi("i", I64, []), vi("c_in", B, []), vi("y_in", F, [1, 4])],
                 [vi("c_out", B, []), vi("y_out", F, [1, 4]), vi("keep", F, [1, 4])])
    node = helper.make_node("Loop", ["m", "c", "y"], ["y_final", "ys"], body=body)
    inputs = {"y": (F, [1, 4])}
    inits = {"zero": np.array([0], np.int64), "c": np.array(cond_init)}
    if trip_input:
        inputs["m"] = (I64, [])
    else:
        inits["m"] = np.array(trips, np.int64)
    return make_model([node], inputs, ["y_final", "ys"], inits, 13)


def test_loop_with_a_known_trip_count_unrolls_with_its_scan_outputs(rng):
    y = rng.standard_normal((1, 4)).astype(np.float32)
    g = matches_ort(loop_model(), {"y": y})
    assert "Slice" not in {n.op for n in g.nodes}  # the iteration number is a constant: the rows fold


def test_loop_whose_trip_count_is_a_graph_input_asks_for_it_as_a_constant(rng):
    model = loop_model(trip_input=True)
    with pytest.raises(UnsupportedModelError, match=r"Loop \(a trip count computed at run time\)") as e:
        import_onnx(model)
    assert e.value.constant_inputs == ("m",)
    y = rng.standard_normal((1, 4)).astype(np.float32)
    matches_ort(model, {"y": y, "m": np.array(3, np.int64)}, constant_inputs={"m": np.array(3, np.int64)})


def test_a_loop_whose_condition_starts_false_keeps_its_initial_values(rng):
    model = loop_model(cond_init=False)
    for outputs in (model.graph.output, model.graph.node[0].output, model.graph.node[0].attribute[0].g.output):
        outputs.pop()  # no iteration: a scan output would have no shape
    matches_ort(model, {"y": rng.standard_normal((1, 4)).astype(np.float32)})


def test_an_unrolled_model_travels_in_a_signed_bundle(rng):
    key = Ed25519PrivateKey.generate()
    g = import_onnx(loop_model())
    back = read_bundle(bundle_bytes(g, key), [key.public_key()]).graph
    y = rng.standard_normal((1, 4)).astype(np.float32)
    want, got = run_reference(g, {"y": y}), run_reference(back, {"y": y})
    assert all(np.array_equal(want[k], got[k]) for k in g.outputs)


# --- hostile models ---------------------------------------------------------------------------------
def test_a_huge_trip_count_is_a_limit_error_before_any_work():
    with pytest.raises(LimitError, match=r"runs 1000000000000 iterations; Cuvil unrolls at most 4096"):
        import_onnx(loop_model(trips=10**12))


def test_a_loop_that_never_stops_is_a_limit_error(monkeypatch):
    monkeypatch.setattr(onnx_control, "MAX_TRIPS", 64)  # the bound, lowered to keep the test quick
    node = helper.make_node("Loop", ["", "c", "x"], ["y"], body=graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Identity", ["x_in"], ["x_out"])],
        [vi("i", I64, []), vi("c_in", B, []), vi("x_in", F, [2])], [vi("c_out", B, []), vi("x_out", F, [2])]))
    model = make_model([node], {"x": (F, [2])}, ["y"], {"c": np.array(True)}, 13)
    with pytest.raises(LimitError, match="more than 64 iterations"):
        import_onnx(model)


def test_deeply_nested_sub_graphs_are_a_limit_error():
    leaf = graph([helper.make_node("Identity", ["x"], ["o0"])], [], [vi("o0", F, None)], "g0")
    inner = leaf
    for depth in range(1, 30):
        node = helper.make_node("If", ["c"], [f"o{depth}"], then_branch=inner, else_branch=leaf)
        inner = graph([node], [], [vi(f"o{depth}", F, None)], f"g{depth}")
    model = make_model(list(inner.node), {"x": (F, [2]), "c": (B, [])}, [inner.output[0].name], opset=13)
    with pytest.raises(LimitError, match="nest more than 8 deep"):
        import_onnx(model)


def test_unrolling_past_the_node_budget_is_a_limit_error(monkeypatch):
    """Nested loops multiply: 64 x 64 iterations of a 5-node body is over the budget (lowered to keep the test quick),
    though each loop alone is under it."""
    monkeypatch.setattr(onnx_control, "MAX_UNROLLED", 1000)
    inner_body = graph([helper.make_node("Identity", ["c_in"], ["c_out"])] +
                       [helper.make_node("Neg" if k % 2 else "Abs", [f"v{k}"], [f"v{k + 1}"]) for k in range(4)],
                       [vi("j", I64, []), vi("c_in", B, []), vi("v0", F, [2])], [vi("c_out", B, []), vi("v4", F, [2])])
    outer_body = graph([helper.make_node("Identity", ["c_in2"], ["c_out2"]),
                        helper.make_node("Loop", ["m", "", "w_in"], ["w_out"], body=inner_body)],
                       [vi("i", I64, []), vi("c_in2", B, []), vi("w_in", F, [2])], [vi("c_out2", B, []), vi("w_out", F, [2])])
    node = helper.make_node("Loop", ["m", "", "x"], ["y"], body=outer_body)
    model = make_model([node], {"x": (F, [2])}, ["y"], {"m": np.array(64, np.int64)}, 13)
    with pytest.raises(LimitError, match="unrolls into more than 1000 nodes"):
        import_onnx(model)


def test_control_flow_inside_an_expanded_onnx_function_sees_the_function_s_values(rng):
    """AffineGrid imports as its ONNX function body, whose If branches use values the body defines
    (renamed apart by the expansion: the branches must follow)."""
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=0)
    model = make_model([node], {"theta": (F, [2, 2, 3])}, ["grid"], {"size": np.array([2, 1, 3, 4], np.int64)}, 20)
    matches_ort(model, {"theta": rng.standard_normal((2, 2, 3)).astype(np.float32)})


def test_a_trip_count_computed_from_graph_inputs_names_them_for_constant_inputs(rng):
    """Range's ONNX function: trips = ceil((limit - start) / delta), all graph inputs; fixed, it unrolls."""
    body = graph([helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["v_in", "d"], ["v_out"]),
                  helper.make_node("Identity", ["v_in"], ["row"])],
                 [vi("i", I64, []), vi("c_in", B, []), vi("v_in", F, [])], [vi("c_out", B, []), vi("v_out", F, []), vi("row", F, [])])
    nodes = [helper.make_node("Sub", ["limit", "start"], ["span"]), helper.make_node("Div", ["span", "d"], ["q"]),
             helper.make_node("Ceil", ["q"], ["qc"]), helper.make_node("Cast", ["qc"], ["m"], to=I64),
             helper.make_node("Loop", ["m", "", "start"], ["last", "values"], body=body)]
    model = make_model(nodes, {"start": (F, []), "limit": (F, []), "d": (F, [])}, ["values"], opset=13)
    with pytest.raises(UnsupportedModelError, match=r"Loop \(a trip count computed at run time\)") as e:
        import_onnx(model)
    assert set(e.value.constant_inputs) == {"start", "limit", "d"}
    fixed = {"start": np.float32(1.5), "limit": np.float32(4.0), "d": np.float32(0.5)}
    matches_ort(model, {k: np.array(v) for k, v in fixed.items()}, constant_inputs={k: np.array(v) for k, v in fixed.items()})
