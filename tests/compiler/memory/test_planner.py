"""The planner places every arena value safely (proved by the checker, confirmed by running in the
arena), reuses in place where allowed, and stays within 5% of the lower bound on the zoo models."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types, run_reference, verify
from cuvil.compiler.memory.checker import PlanError, check_plan
from cuvil.compiler.memory.planner import lifetimes, plan_memory

from .arena import run_in_arena


def f32(*shape) -> TensorType:
    return TensorType(DType.F32, tuple(shape))


def make(inputs, nodes, outputs, constants=None):
    return verify(infer_graph_types("g", inputs, constants or {}, nodes, outputs))


def feed(g, rng, batch=1):
    return {n: rng.standard_normal(g.types[n].bind(batch).shape).astype(np.float32) for n in g.inputs}


def assert_plan_runs(g, plan, rng):
    check_plan(g, plan)
    x = feed(g, rng, plan.batch)
    want, got = run_reference(g, x), run_in_arena(g, plan, x)
    for name in g.outputs:
        np.testing.assert_array_equal(got[name], want[name])


CHAIN = make({"x": f32(1, 1000)}, [
    Node.make("Exp", ["x"], ["a"]), Node.make("Neg", ["a"], ["b"]),
    Node.make("Concat", ["a", "b"], ["c"], axis=1), Node.make("Relu", ["c"], ["y"])], ["y"])


def test_values_fields_and_alignment(rng):
    p = plan_memory(CHAIN)
    assert set(p.offsets) == {"x", "a", "b", "c", "y"} and all(o % 64 == 0 for o in p.offsets.values())
    assert p.sizes["c"] == 8000 and p.naive_bytes == 4000 * 3 + 8000 * 2
    assert p.aliases == {"y": "c"}  # Relu over the dying concat result; Neg cannot take a (Concat reads it)
    assert p.lower_bound == 4000 + 4000 + 8000  # at the Concat: a, b and c
    assert p.lower_bound <= p.arena_bytes <= p.naive_bytes + 64 * len(p.offsets)
    assert_plan_runs(CHAIN, p, rng)


def test_a_held_value_keeps_its_bytes_from_later_outputs(rng):
    g = make({"x": f32(1, 1000)}, [Node.make("Exp", ["x"], ["a"]), Node.make("Neg", ["a"], ["b"]),
                                   Node.make("Abs", ["b"], ["c"]), Node.make("Exp", ["c"], ["y"])], ["y"])
    free = plan_memory(g)
    assert free.offsets["c"] == free.offsets["a"]  # a dies at the Neg: the Abs's output may take its bytes
    held = plan_memory(g, held={"a": 3})
    assert lifetimes(g, {"a": 3})["a"].end == 3 and lifetimes(g, {"a": 99})["a"].end == 5  # at most the last step
    assert held.offsets["c"] != held.offsets["a"] and held.offsets["b"] != held.offsets["a"]
    assert_plan_runs(g, held, rng)


def test_lifetimes_cover_inputs_outputs_and_dead_values():
    g = make({"x": f32(4)}, [Node.make("Split", ["x"], ["a", "b"], split=[2, 2]), Node.make("Neg", ["a"], ["y"])], ["y"])
    live = lifetimes(g)
    assert (live["x"].start, live["x"].end) == (0, 1)
    assert (live["b"].start, live["b"].end) == (1, 1)  # never read, but written
    assert live["y"].end == 3  # outputs live past the last node


def test_constants_are_not_in_the_arena_and_graph_inputs_are_never_overwritten(rng):
    g = make({"x": f32(2, 8)}, [Node.make("Relu", ["x"], ["r"]), Node.make("Mul", ["r", "w"], ["y"])], ["y"],
             {"w": np.ones(8, np.float32)})
    p = plan_memory(g)
    assert "w" not in p.offsets and "r" not in p.aliases  # x is a graph input: r gets its own bytes
    assert p.aliases == {"y": "r"}
    assert_plan_runs(g, p, rng)


def test_views_alias_and_chains_share_one_root(rng):
    g = make({"x": f32(2, 3, 4)}, [
        Node.make("Exp", ["x"], ["e"]), Node.make("Reshape", ["e"], ["r"], shape=[2, 12]),
        Node.make("Relu", ["r"], ["s"]), Node.make("Flatten", ["s"], ["f"], axis=1),
        Node.make("Unsqueeze", ["f"], ["y"], axes=[0])], ["y"])
    p = plan_memory(g)
    assert p.aliases == {"r": "e", "s": "e", "f": "e", "y": "e"}
    assert p.arena_bytes == 2 * 128 and p.lower_bound == 2 * 96
    assert_plan_runs(g, p, rng)


def test_no_in_place_while_the_operand_is_still_needed(rng):
    g = make({"x": f32(64)}, [
        Node.make("Exp", ["x"], ["a"]), Node.make("Add", ["a", "a"], ["b"]), Node.make("Mul", ["a", "b"], ["y"])], ["y"])
    p = plan_memory(g)
    assert "b" not in p.aliases and p.aliases == {"y": "a"}
    assert_plan_runs(g, p, rng)


def test_an_input_read_twice_is_reused_only_where_every_read_allows_it(rng):
    """relu(conv(r) + r): fused, the conv reads r as its input and as its residual; the output may take a
    residual's bytes, never the input's, which the kernel reads after it writes the first outputs."""
    from cuvil.compiler.passes import optimize

    w, bias = rng.standard_normal((8, 8, 3, 3)).astype(np.float32), np.zeros(8, np.float32)
    conv = dict(pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1)
    g = optimize(make({"x": f32(1, 8, 6, 6)}, [
        Node.make("Relu", ["x"], ["r"]), Node.make("Conv", ["r", "w", "b"], ["c"], **conv),
        Node.make("Add", ["c", "r"], ["s"]), Node.make("Relu", ["s"], ["y"])], ["y"], {"w": w, "b": bias}))
    fused = next(n for n in g.nodes if n.op == "FusedConv")
    assert fused.inputs[0] == fused.inputs[-1]  # one tensor, input and residual
    p = plan_memory(g)
    assert fused.outputs[0] not in p.aliases
    assert_plan_runs(g, p, rng)
    out, src = fused.outputs[0], fused.inputs[0]
    in_place = corrupt(p, offsets={**p.offsets, out: p.offsets[src]}, aliases={**p.aliases, out: p.aliases.get(src, src)})
    with pytest.raises(PlanError, match="overlap"):
        check_plan(g, in_place)


def test_broadcast_operand_is_not_reused(rng):
    g = make({"x": f32(4, 16), "v": f32(16)}, [
        Node.make("Exp", ["v"], ["e"]), Node.make("Add", ["x", "e"], ["y"])], ["y"])
    assert plan_memory(g).aliases == {}


def test_batch_symbol_and_alignment(rng):
    g = make({"x": f32(N, 10)}, [Node.make("Exp", ["x"], ["a"]), Node.make("Neg", ["a"], ["y"])], ["y"])
    p = plan_memory(g, batch=3, alignment=128)
    assert p.batch == 3 and p.sizes["x"] == 120 and all(o % 128 == 0 for o in p.offsets.values())
    assert_plan_runs(g, p, rng)
    with pytest.raises(ValueError, match="power of two"):
        plan_memory(g, alignment=48)


# --- joins: a Concat's operands computed in place of its output ----------------------------------------
def branches(*after: Node, batch=1, width=16, shared=False):
    """x -> Relu a, Neg b -> Concat(a, b) c -> Exp y, then ``after`` (a, b: width x 4 x 4 floats)."""
    x = f32(N if batch != 1 else 1, width, 4, 4)
    nodes = [Node.make("Relu", ["x"], ["a"]), Node.make("Neg", ["x"], ["b"]),
             Node.make("Concat", ["a", "a" if shared else "b"], ["c"], axis=1), Node.make("Exp", ["c"], ["y"]), *after]
    return make({"x": x}, nodes, ["y"] + [n.outputs[0] for n in after])


def test_concat_operands_are_computed_in_place_of_its_output(rng):
    g = branches()
    p = plan_memory(g)
    assert p.joined == {"a": ("c", 0), "b": ("c", 1024)} and p.joined_outputs == {"c"}
    assert p.offsets["a"] == p.offsets["c"] and p.offsets["b"] == p.offsets["c"] + 1024
    assert p.arena_bytes == 1024 + 2048  # x beside c, which holds a and b, then y in place (apart: 5 KiB)
    assert_plan_runs(g, p, rng)  # the Concat runs no code there


@pytest.mark.parametrize("g, why", [
    (branches(batch=2), "batch 2: the operands' rows interleave"),
    (branches(Node.make("Neg", ["a"], ["z"])), "a is read after the Concat"),
    (branches(shared=True), "one operand twice"),
    (make({"x": f32(1, 16), "v": f32(1, 16)}, [Node.make("Relu", ["x"], ["a"]),
                                                Node.make("Concat", ["a", "v"], ["y"], axis=1)], ["y"]), "a graph input"),
    (make({"x": f32(1, 16)}, [Node.make("Relu", ["x"], ["a"]), Node.make("Concat", ["a", "w"], ["y"], axis=1)], ["y"],
          {"w": np.ones((1, 16), np.float32)}), "a constant"),
    (make({"x": f32(1, 5)}, [Node.make("Relu", ["x"], ["a"]), Node.make("Neg", ["x"], ["b"]),
                             Node.make("Concat", ["a", "b"], ["y"], axis=1)], ["y"]), "b at byte 20: unaligned"),
], ids=["batch", "read-after", "twice", "graph-input", "constant", "unaligned"])
def test_concat_operands_stay_apart_where_they_cannot_be_joined(g, why, rng):
    p = plan_memory(g, batch=2 if "batch" in why else 1)
    assert p.joined == {}, why
    assert_plan_runs(g, p, rng)


def test_joins_nest_and_follow_in_place_chains(rng):
    """c = Concat(a2, b) where a2 is Relu(a) in place; z = Concat(c, d): a (a2's storage) lies in c, c in z."""
    g = make({"x": f32(1, 16, 4, 4)}, [
        Node.make("Exp", ["x"], ["a"]), Node.make("Relu", ["a"], ["a2"]), Node.make("Neg", ["x"], ["b"]),
        Node.make("Concat", ["a2", "b"], ["c"], axis=1), Node.make("Abs", ["x"], ["d"]),
        Node.make("Concat", ["c", "d"], ["z"], axis=1), Node.make("Exp", ["z"], ["y"])], ["y"])
    p = plan_memory(g)
    assert p.aliases["a2"] == "a" and p.joined == {"a": ("c", 0), "b": ("c", 1024), "c": ("z", 0), "d": ("z", 2048)}
    z = p.offsets["z"]
    assert [p.offsets[v] - z for v in ("a", "a2", "b", "c", "d")] == [0, 0, 1024, 0, 2048]
    assert_plan_runs(g, p, rng)


def test_checker_rejects_a_join_off_its_place_or_one_the_op_cannot_make():
    g = branches()
    p = plan_memory(g)
    swapped = corrupt(p, offsets={**p.offsets, "a": p.offsets["b"], "b": p.offsets["a"]})
    with pytest.raises(PlanError, match="'a' is not at byte 0 of the joined 'c'"):
        check_plan(g, swapped)
    two = branches(batch=2)
    q = plan_memory(two, batch=2)
    c = q.offsets["c"]
    declared = corrupt(q, offsets={**q.offsets, "a": c, "b": c + 2048}, joined={"a": ("c", 0), "b": ("c", 2048)})
    with pytest.raises(PlanError, match="cannot make 'c' of its operands in place"):
        check_plan(two, declared)
    with pytest.raises(PlanError, match="no node makes it"):
        check_plan(g, corrupt(p, joined={**p.joined, "x": ("nope", 0)}))


def test_checker_rejects_a_join_whose_operand_outlives_the_output_it_lies_in():
    """a is an output too, so it lives on while Relu(c) -> r, in place over c, rewrites its bytes."""
    g = make({"x": f32(1, 16, 4, 4)}, [
        Node.make("Relu", ["x"], ["a"]), Node.make("Neg", ["x"], ["b"]), Node.make("Concat", ["a", "b"], ["c"], axis=1),
        Node.make("Relu", ["c"], ["r"])], ["r", "a"])
    p = plan_memory(g)
    assert p.joined == {} and p.aliases.get("r") == "c"
    c, free = p.offsets["c"], p.arena_bytes
    forced = corrupt(p, offsets={**p.offsets, "a": c, "b": c + 1024, "x": free}, arena_bytes=free + 1024,
                     joined={"a": ("c", 0), "b": ("c", 1024)})
    with pytest.raises(PlanError, match="'a' .* and 'r' .* overlap while both live"):
        check_plan(g, forced)


# --- the checker rejects what is wrong ---------------------------------------------------------------
def corrupt(plan, **changes):
    return dataclasses.replace(plan, **changes)


def test_checker_rejects_an_overlapping_plan():
    p = plan_memory(CHAIN)
    bad = corrupt(p, offsets={**p.offsets, "b": p.offsets["a"]})  # a and b are both live at the Concat
    with pytest.raises(PlanError, match="overlap while both live") as info:
        check_plan(CHAIN, bad)
    assert "'a'" in str(info.value) and "'b'" in str(info.value)
    half = corrupt(p, offsets={**p.offsets, "b": p.offsets["a"] + 64 * 31})  # partial overlap
    with pytest.raises(PlanError, match="overlap"):
        check_plan(CHAIN, half)


def test_checker_rejects_an_undeclared_or_illegal_reuse():
    p = plan_memory(CHAIN)
    undeclared = corrupt(p, aliases={})
    with pytest.raises(PlanError, match="overlap"):
        check_plan(CHAIN, undeclared)
    g = make({"x": f32(64)}, [Node.make("Exp", ["x"], ["a"]), Node.make("Neg", ["a"], ["b"]),
                              Node.make("Add", ["a", "b"], ["y"])], ["y"])
    q = plan_memory(g)
    illegal = corrupt(q, offsets={**q.offsets, "b": q.offsets["a"]}, aliases={**q.aliases, "b": "a"})
    with pytest.raises(PlanError, match="overlap"):  # a is still read by the Add
        check_plan(g, illegal)
    onto_input = corrupt(q, offsets={**q.offsets, "a": q.offsets["x"]}, aliases={"a": "x"})
    with pytest.raises(PlanError, match="overlap"):  # the caller's input is never overwritten
        check_plan(g, onto_input)


@pytest.mark.parametrize("change,message", [
    (lambda p: {"offsets": {**p.offsets, "y": p.offsets["y"] + 8}}, "aligned"),
    (lambda p: {"arena_bytes": p.arena_bytes - 64}, "does not fit"),
    (lambda p: {"offsets": {k: v for k, v in p.offsets.items() if k != "b"}}, "missing \\['b'\\]"),
    (lambda p: {"sizes": {**p.sizes, "c": 4000}}, "needs 8000 bytes"),
    (lambda p: {"naive_bytes": 1}, "naive_bytes"),
    (lambda p: {"aliases": {"y": "nope"}}, "declared to reuse"),
    (lambda p: {"lower_bound": p.arena_bytes + 1}, "lower bound"),
])
def test_checker_rejects_broken_fields(change, message):
    p = plan_memory(CHAIN)
    with pytest.raises(PlanError, match=message):
        check_plan(CHAIN, corrupt(p, **change(p)))


# --- random DAGs -------------------------------------------------------------------------------------
UNARY, BINARY = ("Relu", "Neg", "Exp", "Abs", "Identity"), ("Add", "Mul", "Sub", "Max")


@st.composite
def random_dags(draw):
    inputs = {f"in{i}": f32(1, draw(st.sampled_from((1, 2, 3))), 8) for i in range(draw(st.integers(1, 3)))}
    types = dict(inputs)
    nodes = []
    for k in range(draw(st.integers(1, 14))):
        names = sorted(types)
        kind = draw(st.sampled_from(("unary", "binary", "concat", "reshape")))
        out = f"v{k}"
        if kind == "unary":
            nodes.append(Node.make(draw(st.sampled_from(UNARY)), [draw(st.sampled_from(names))], [out]))
        elif kind == "binary":
            a = draw(st.sampled_from(names))
            same = [n for n in names if types[n].shape[1] in (types[a].shape[1], 1)]
            nodes.append(Node.make(draw(st.sampled_from(BINARY)), [a, draw(st.sampled_from(same))], [out]))
        elif kind == "concat":
            parts = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))
            nodes.append(Node.make("Concat", parts, [out], axis=1))
        else:
            nodes.append(Node.make("Reshape", [draw(st.sampled_from(names))], [out], shape=[1, -1, 8]))
        types[out] = infer_graph_types("g", inputs, {}, nodes, []).types[out]
    produced = [n.outputs[0] for n in nodes]
    extra = draw(st.lists(st.sampled_from(produced), max_size=2, unique=True))
    outputs = list(dict.fromkeys([produced[-1], *extra]))
    return make(inputs, nodes, outputs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=random_dags(), seed=st.integers(0, 2**16))
def test_random_dags_plan_safely(g, seed):
    p = plan_memory(g)
    assert p.lower_bound <= p.arena_bytes
    assert_plan_runs(g, p, np.random.default_rng(seed))


# --- the zoo -----------------------------------------------------------------------------------------
ZOO_MODELS = ("mlp", "small_cnn", "resnet18", "mobilenet_v2", "tiny_transformer")


@pytest.fixture(scope="module")
def zoo_graphs():
    """Imported and optimized once per module (the frontend is the slow part)."""
    pytest.importorskip("torch")
    zoo = pytest.importorskip("tests.zoo")
    frontend = pytest.importorskip("cuvil.compiler.frontends.torch")
    from cuvil.compiler.passes import optimize

    cache = {}

    def get(name):
        if name not in cache:
            model, example = zoo.ZOO[name]()
            g = frontend.import_torch(model, example)
            cache[name] = (g, optimize(g), {g.inputs[0]: example[0].numpy()})
        return cache[name]

    return get


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_arena_is_within_5_percent_of_the_lower_bound(zoo_graphs, name):
    for g in zoo_graphs(name)[:2]:
        p = check_plan(g, plan_memory(g))
        assert p.arena_bytes <= 1.05 * p.lower_bound, p.summary()
        assert p.arena_bytes < p.naive_bytes


@pytest.mark.parametrize("name", ("small_cnn", "resnet18", "mobilenet_v2"))
def test_zoo_runs_in_its_arena(zoo_graphs, name):
    _, g, x = zoo_graphs(name)
    p = plan_memory(g)
    want, got = run_reference(g, x), run_in_arena(g, p, x)
    for out in g.outputs:
        np.testing.assert_array_equal(got[out], want[out])


@pytest.mark.slow
def test_mobilenet_v2_imagenet_figure():
    """MobileNetV2 fp32 at 3x224x224: 28.2 MB naive -> 6.02 MB, equal to the lower bound (docs/performance.md).

    6.02 MB is the 96x112x112 expansion plus the 96x56x56 depthwise result it feeds. 28.2 MB counts one
    buffer per conv and per residual Add; our fuse also absorbs the 10 residual Adds (0.87 MB).
    """
    torch = pytest.importorskip("torch")
    zoo = pytest.importorskip("tests.zoo")
    frontend = pytest.importorskip("cuvil.compiler.frontends.torch")
    from cuvil.compiler.passes import optimize

    torch.manual_seed(0)
    model = zoo._finish(zoo.MobileNetV2(classes=1000), 0)
    g = optimize(frontend.import_torch(model, (torch.randn(1, 3, 224, 224),)))
    p = check_plan(g, plan_memory(g))
    assert p.arena_bytes == p.lower_bound == 4 * (96 * 112 * 112 + 96 * 56 * 56) == 6_021_120
    residuals = sum(g.types[n.outputs[0]].nbytes() for n in g.nodes if n.attr.get("has_residual"))
    assert round((p.naive_bytes + residuals) / 1e6, 1) == 28.2
