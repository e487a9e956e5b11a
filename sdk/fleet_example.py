"""`cuvil fleet example`: a small signed model and each device's evaluation data, to try a fleet with.

Two versions of a 64-h-10 softmax MLP on scikit-learn's bundled digits (trained with NumPy in well
under a second, no PyTorch needed), signed with the author's key, and one non-IID slice of the
held-out digits per device (``x``: [n, 1, 8, 8] float32, ``y``: int64 labels), the ``.npz`` format
``cuvil device-provision --data`` reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import api
from .compiler.frontends.builder import GraphBuilder
from .compiler.ir import DType, Graph, N, TensorType
from .coordinator import fleet

VERSIONS = (("1", 16, 8), ("2", 32, 2))  # (version, hidden units, epochs): v2 is wider but under-trained


@dataclass(frozen=True)
class Example:
    bundles: tuple[Path, ...]
    data: tuple[Path, ...]


def digits_mlp(seed: int = 0, hidden: int = 16, epochs: int = 8) -> Graph:
    """A 64-h-10 softmax MLP on [N, 1, 8, 8] digits, trained on the training half with plain SGD."""
    x, y = fleet.digits("train")
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


def write_example(out_dir: str | os.PathLike, key: str | os.PathLike, devices: int,
                  force: bool = False) -> Example:
    """Write ``digits-v1.cuvil``, ``digits-v2.cuvil`` and ``data/device-<i>.npz`` (i = 1..devices) into
    ``out_dir``, which must be new or empty unless ``force``."""
    out = api.output_dir(out_dir, force)
    (out / "data").mkdir(exist_ok=True)
    bundles = tuple(api.export(digits_mlp(0, hidden, epochs), out / f"digits-v{version}.cuvil", Path(key),
                               name="digits-mlp", version=version).path for version, hidden, epochs in VERSIONS)
    data = []
    for i in range(1, devices + 1):
        x, y = fleet.device_data(i - 1, devices)
        path = out / "data" / f"device-{i}.npz"
        np.savez(path, x=x, y=y)
        data.append(path)
    return Example(bundles, tuple(data))
