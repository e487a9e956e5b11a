import numpy as np

from cuvil.compiler import DType, Node, TensorType
from cuvil.compiler.passes import dce, simplify
from cuvil.compiler.passes.simplify import exact_widening

from .graphs import assert_same, f32, graph, ops


def t(dtype: DType, *shape) -> TensorType:
    return TensorType(dtype, tuple(shape))


def test_a_bf16_round_trip_through_f32_and_no_op_nodes_become_views(rng):
    g = graph({"x": t(DType.BF16, 2, 3)}, {}, [
        Node.make("Cast", ["x"], ["w"], to=DType.F32),
        Node.make("Expand", ["w"], ["e"], shape=[2, 3]),
        Node.make("Cast", ["e"], ["n"], to=DType.BF16),
        Node.make("Cast", ["n"], ["same"], to=DType.BF16),
        Node.make("Cast", ["same"], ["y"], to=DType.F32)], ["y"])
    out = dce(simplify(g))
    assert ops(out) == ["Identity", "Identity", "Cast"] and out.nodes[0].inputs == ("x",)
    assert_same(g, out, rng, tol=0)


def test_lossy_or_clamping_casts_stay(rng):
    g = graph({"x": f32(4), "q": t(DType.F8E5M2, 4)}, {}, [
        Node.make("Cast", ["x"], ["h"], to=DType.BF16),
        Node.make("Cast", ["h"], ["y"], to=DType.F32),  # rounds x: not x
        Node.make("Cast", ["q"], ["z"], to=DType.F8E5M2),  # saturating: clamps infinities
        Node.make("Cast", ["x"], ["i"], to=DType.I64),
        Node.make("Cast", ["i"], ["k"], to=DType.F32)], ["y", "z", "k"])
    assert simplify(g) is g


def test_exact_widening_table():
    widen = [(DType.BF16, DType.F32), (DType.F16, DType.F64), (DType.I32, DType.I64), (DType.U8, DType.I16),
             (DType.I16, DType.F32), (DType.U32, DType.F64), (DType.BOOL, DType.I8)]
    lossy = [(DType.F32, DType.BF16), (DType.F16, DType.BF16), (DType.BF16, DType.F16), (DType.I64, DType.F64),
             (DType.I32, DType.F32), (DType.I8, DType.U64), (DType.U16, DType.I16), (DType.I8, DType.BOOL),
             (DType.F32, DType.F32),
             (DType.F8E4M3FN, DType.F32)]  # float8: exact, but not claimed (only the 16-bit floats are)
    assert all(exact_widening(a, b) for a, b in widen)
    assert not any(exact_widening(a, b) for a, b in lossy)


def test_a_narrowing_round_trip_of_values_that_only_move_or_select_goes(rng):
    inf = np.array([-np.inf], np.float32)
    g = graph({"x": t(DType.BF16, 2, 3), "c": t(DType.BOOL, 3, 2)}, {"ninf": inf, "third": np.array([1 / 3], np.float32)}, [
        Node.make("Cast", ["x"], ["w"], to=DType.F32),
        Node.make("Transpose", ["w"], ["tr"], perm=[1, 0]),
        Node.make("Where", ["c", "ninf", "tr"], ["sel"]),
        Node.make("Cast", ["sel"], ["n"], to=DType.BF16),
        Node.make("Cast", ["n"], ["y"], to=DType.F32),  # sel holds bf16 values only: y is sel
        Node.make("Where", ["c", "third", "tr"], ["s2"]),  # 1/3 is no bf16 value
        Node.make("Cast", ["s2"], ["sn"], to=DType.BF16),
        Node.make("Cast", ["sn"], ["z"], to=DType.F32)], ["y", "z"])
    out = dce(simplify(g))
    assert ops(out) == ["Cast", "Transpose", "Where", "Identity", "Where", "Cast", "Cast"]
    assert_same(g, out, rng, tol=0)
