"""The compile entry point's care for the device process: what a cold compile leaves behind."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types
from cuvil.edge_runtime import compile as compile_mod
from cuvil.edge_runtime import heap


def test_only_a_cache_miss_trims(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "release", lambda: calls.append(1))
    rng = np.random.default_rng(0)
    graph = infer_graph_types("g", {"x": TensorType(DType.F32, (N, 8))}, {"w": rng.standard_normal((8, 4)).astype(np.float32)},
                              [Node.make("MatMul", ["x", "w"], ["y"])], ["y"])
    first = compile_mod.compile_graph(graph, cache_dir=tmp_path, tune=False)
    second = compile_mod.compile_graph(graph, cache_dir=tmp_path, tune=False)
    assert (first.stats.cache_hit, second.stats.cache_hit) == (False, True)
    assert len(calls) == 2  # once lowered (before the session's arena), once compiled; never on the hit


def test_a_float_models_cold_compile_loads_neither_ml_dtypes_nor_numpy_random(tmp_path):
    """ml_dtypes (~7 MiB resident) holds the narrow types only, and numpy.random (~6 MiB) is not needed
    to time kernels (``compiler/spread.py``): a float32 model's cold compile, tuned, Casts between
    standard types included, imports neither."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types
        from cuvil.edge_runtime.compile import compile_graph
        consts = {"w": np.ones((32, 32, 3, 3), np.float32) / 288}
        nodes = [Node.make("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1),
                 Node.make("Relu", ["c"], ["r"]), Node.make("Cast", ["r"], ["h"], to=DType.F64),
                 Node.make("Cast", ["h"], ["y"], to=DType.F32)]
        g = infer_graph_types("g", {"x": TensorType(DType.F32, (N, 32, 16, 16))}, consts, nodes, ["y"])
        s = compile_graph(g, cache_dir=sys.argv[1], tune=True)
        out = s.run({"x": np.ones((1, 32, 16, 16), np.float32)})["y"]
        print(float(out.max()), s.stats.tune_ms > 0, "ml_dtypes" in sys.modules, "numpy.random" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1.0", "True", "False", "False"]
