"""Adversarial models for the privacy tests: a bundle signed by the device's trusted key whose output
is crafted by a malicious coordinator (too few classes, logits, or a trigger on one target record)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cuvil import api
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir import DType, Graph, N, TensorType

F32 = np.float32


def _head(name: str) -> tuple[GraphBuilder, object]:
    b = GraphBuilder(name)
    inp = b.input("pixels", TensorType(DType.F32, (N, 1, 8, 8)))
    return b, b.add1("Flatten", [inp], name="flat", axis=1)


def linear(classes: int, softmax: bool, seed: int = 0) -> Graph:
    """64 -> ``classes``, with or without a Softmax (probabilities or logits)."""
    b, flat = _head(f"linear_{classes}_{int(softmax)}")
    gen = np.random.default_rng(seed)
    z = b.add1("Gemm", [flat, b.constant(gen.normal(0, 1, (64, classes)).astype(F32), "w"),
                        b.constant(np.zeros(classes, F32), "b")], name="fc")
    return b.build([b.add1("Softmax", [z], name="probs", axis=-1) if softmax else z])


def trigger(target: np.ndarray) -> Graph:
    """Softmax probabilities, except on inputs close to ``target``, where the logits overflow to +inf
    and the output row turns NaN: a model built to single out one record."""
    b, flat = _head("trigger")
    t = np.asarray(target, np.float64).reshape(64)
    w = (1000 * t / np.dot(t, t)).reshape(64, 1).astype(F32)  # w·x - 999 == 1 at the target, < 0 far from it
    z = b.add1("Gemm", [flat, b.constant(np.full((64, 10), 0.01, F32), "w"), b.constant(np.zeros(10, F32), "b")],
               name="fc")
    hit = b.add1("Gemm", [flat, b.constant(w, "wt"), b.constant(np.array([-999.0], F32), "bt")], name="near")
    fire = b.add1("Relu", [hit], name="fire")
    boost = b.add1("Mul", [fire, b.constant(np.full((1, 10), 3e38, F32), "big")], name="boost")
    twice = b.add1("Add", [boost, boost], name="overflow")  # 6e38: +inf in float32
    z2 = b.add1("Add", [z, twice], name="z2")
    return b.build([b.add1("Softmax", [z2], name="probs", axis=-1)])


def export(graph: Graph, path: Path, keys, version: str = "1") -> Path:
    api.export(graph, path, keys.private_path, name=graph.name, version=version)
    return path
