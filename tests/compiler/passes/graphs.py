"""Small graphs for pass tests, and the check every pass test makes: same outputs, verified graph."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cuvil.compiler import Graph, Node, TensorType, infer_graph_types, run_reference, verify
from cuvil.compiler.ir.types import Batch


def graph(inputs: Mapping[str, TensorType], constants: Mapping[str, np.ndarray], nodes: Sequence[Node],
          outputs: Sequence[str]) -> Graph:
    consts = {k: np.asarray(v, dtype=np.float32) if np.asarray(v).dtype == np.float64 else np.asarray(v)
              for k, v in constants.items()}
    return verify(infer_graph_types("test", dict(inputs), consts, list(nodes), list(outputs)))


def random_inputs(g: Graph, rng: np.random.Generator, batch: int = 2) -> dict[str, np.ndarray]:
    out = {}
    for name in g.inputs:
        t = g.types[name]
        shape = tuple(d.bind(batch) if isinstance(d, Batch) else d for d in t.shape)
        out[name] = rng.standard_normal(shape).astype(t.dtype.numpy)
    return out


def assert_same(before: Graph, after: Graph, rng: np.random.Generator, tol: float = 1e-5, trials: int = 2) -> None:
    """``after`` verifies and computes what ``before`` computes, on random inputs."""
    verify(after)
    assert after.inputs == before.inputs and after.outputs == before.outputs
    for _ in range(trials):
        feed = random_inputs(before, rng)
        want, got = run_reference(before, feed), run_reference(after, feed)
        for name in before.outputs:
            assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype
            np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol)


def ops(g: Graph) -> list[str]:
    return [n.op for n in g.nodes]


def f32(*shape) -> TensorType:
    from cuvil.compiler import DType

    return TensorType(DType.F32, tuple(shape))


def weights(rng: np.random.Generator, *shape, scale: float = 0.5) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(np.float32)
