"""Shared set-up for coordinator tests: keys, small signed bundles (no torch), provisioned devices."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cuvil import api
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.compiler.ir import DType, Graph, N, TensorType


def digits_mlp(seed: int = 0, hidden: int = 16, epochs: int = 8) -> Graph:
    """A 64-h-10 softmax MLP on [N, 1, 8, 8] digits, trained in well under a second with NumPy."""
    from cuvil.coordinator.fleet import digits

    x, y = digits("train")
    x = x.reshape(len(x), 64).astype(np.float64)
    gen = np.random.default_rng(seed)
    w1, b1 = gen.normal(0, np.sqrt(2 / 64), (64, hidden)), np.zeros(hidden)
    w2, b2 = gen.normal(0, np.sqrt(2 / hidden), (hidden, 10)), np.zeros(10)
    onehot = np.eye(10)[y]
    for _ in range(epochs):
        for s in range(0, len(x), 32):
            xb, tb = x[s:s + 32], onehot[s:s + 32]
            h = np.maximum(xb @ w1 + b1, 0)
            z = h @ w2 + b2
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            dz = (p - tb) / len(xb)
            dh = (dz @ w2.T) * (h > 0)
            for param, grad in ((w2, h.T @ dz), (b2, dz.sum(0)), (w1, xb.T @ dh), (b1, dh.sum(0))):
                param -= 0.3 * grad
    b = GraphBuilder(f"digits_mlp_{seed}")
    inp = b.input("pixels", TensorType(DType.F32, (N, 1, 8, 8)))
    flat = b.add1("Flatten", [inp], name="flat", axis=1)
    f32 = np.float32
    h = b.add1("Gemm", [flat, b.constant(w1.astype(f32), "w1"), b.constant(b1.astype(f32), "b1")], name="fc1")
    h = b.add1("Relu", [h], name="relu")
    z = b.add1("Gemm", [h, b.constant(w2.astype(f32), "w2"), b.constant(b2.astype(f32), "b2")], name="fc2")
    return b.build([b.add1("Softmax", [z], name="probs", axis=-1)])


def make_keys(root: Path, name: str = "author"):
    return api.keygen(root / "keys", name, force=True)


def make_bundle(root: Path, keys, version: str = "1", seed: int = 0, epochs: int = 8) -> Path:
    path = root / f"digits-v{version}.cuvil"
    api.export(digits_mlp(seed, epochs=epochs), path, keys.private_path, name="digits-mlp", version=version)
    return path
