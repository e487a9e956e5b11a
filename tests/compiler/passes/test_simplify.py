import subprocess
import sys
import textwrap

import numpy as np

from cuvil.compiler import DType, Node, TensorType
from cuvil.compiler.passes import dce, simplify
from cuvil.compiler.passes.simplify import exact_widening, holds_only

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


def test_holds_only_bf16_reads_bits_as_ml_dtypes_rounds(rng):
    """The bits check says what a round trip through ml_dtypes' bfloat16 says, for float16/32/64 arrays
    of bf16 values, near ones (one low bit set), random ones, and the special values."""
    import ml_dtypes

    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, 3.0e38, 9.2e-41, 1e-40, 1.17e-38], np.float32)
    high = rng.integers(0, 2 ** 16, 400, dtype=np.uint32) << 16
    kinds = [high.view(np.float32), (high | 1).view(np.float32), rng.standard_normal(400).astype(np.float32), specials]
    for dtype in (np.float16, np.float32, np.float64):
        for values in kinds:
            with np.errstate(all="ignore"):
                for c in [values.astype(dtype)] + [values[i:i + 3].astype(dtype) for i in range(0, len(values), 3)]:
                    want = np.array_equal(c.astype(ml_dtypes.bfloat16).astype(dtype), c, equal_nan=True)
                    assert holds_only(c, DType.BF16) == want, (dtype, c)
    assert not holds_only(np.array([1e300, 1.0]), DType.BF16)  # beyond float32's range


def test_simplifying_a_float_graph_does_not_import_ml_dtypes():
    """A float constant an op selects from (TextCNN's embedding table) is checked for bf16 values by its
    bits: importing ml_dtypes for it cost a cold compile 0.6 s and ~10 MiB."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        from cuvil.compiler import DType, Node, TensorType, infer_graph_types
        from cuvil.compiler.passes import simplify
        consts = {"table": np.arange(40, dtype=np.float32).reshape(10, 4) / 3}
        nodes = [Node.make("Gather", ["table", "ids"], ["e"], axis=0)]
        g = infer_graph_types("g", {"ids": TensorType(DType.I64, (1, 5))}, consts, nodes, ["e"])
        simplify(g)
        print("ml_dtypes" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]
