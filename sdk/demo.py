"""`cuvil demo`: the whole author-to-device path on a model small enough to train in a second.

Trains a 64-32-10 MLP with NumPy on scikit-learn's bundled digits (no download, no torch),
builds its Graph, signs it into a bundle, then loads (verifies), inspects and runs it with the
reference interpreter. Kept apart from the CLI: a later issue grows it into a federated demo.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import api
from .compiler.analysis import summarize
from .compiler.frontends.builder import GraphBuilder
from .compiler.ir import DType, Graph, N, TensorType
from .compiler.ir.text import print_graph

Echo = Callable[[str], None]


@dataclass(frozen=True)
class DemoResult:
    workdir: Path
    bundle: Path
    accuracy: float  # of the bundle, run by the reference interpreter, on the held-out split
    train_accuracy: float


def digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits scaled to [0, 1], split 80/20 with a fixed permutation."""
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError as e:
        raise api.CuvilError("the demo needs scikit-learn for its bundled digits data (pip install scikit-learn)") from e
    data = load_digits()
    x, y = (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def train_mlp(x: np.ndarray, y: np.ndarray, hidden: int = 32, epochs: int = 30, lr: float = 0.1,
              seed: int = 0) -> dict[str, np.ndarray]:
    """Mini-batch SGD with momentum on softmax cross-entropy; deterministic for a seed."""
    rng = np.random.default_rng(seed)
    classes = int(y.max()) + 1
    p = {"w1": rng.normal(0, np.sqrt(2 / x.shape[1]), (x.shape[1], hidden)), "b1": np.zeros(hidden),
         "w2": rng.normal(0, np.sqrt(2 / hidden), (hidden, classes)), "b2": np.zeros(classes)}
    velocity = {k: np.zeros_like(v) for k, v in p.items()}
    onehot = np.eye(classes)[y]
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), 64):
            idx = order[start:start + 64]
            xb, tb = x[idx].astype(np.float64), onehot[idx]
            h = np.maximum(xb @ p["w1"] + p["b1"], 0)
            logits = h @ p["w2"] + p["b2"]
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            d_logits = (probs - tb) / len(idx)
            d_h = (d_logits @ p["w2"].T) * (h > 0)
            grads = {"w2": h.T @ d_logits, "b2": d_logits.sum(0), "w1": xb.T @ d_h, "b1": d_h.sum(0)}
            for k in p:
                velocity[k] = 0.9 * velocity[k] - lr * grads[k]
                p[k] += velocity[k]
    return {k: v.astype(np.float32) for k, v in p.items()}


def mlp_graph(params: dict[str, np.ndarray], name: str = "digits_mlp") -> Graph:
    b = GraphBuilder(name)
    x = b.input("pixels", TensorType(DType.F32, (N, params["w1"].shape[0])))
    h = b.add1("Gemm", [x, b.constant(params["w1"], "fc1.weight"), b.constant(params["b1"], "fc1.bias")], name="fc1")
    h = b.add1("Relu", [h], name="relu")
    logits = b.add1("Gemm", [h, b.constant(params["w2"], "fc2.weight"), b.constant(params["b2"], "fc2.bias")], name="fc2")
    return b.build([b.add1("Softmax", [logits], name="probs", axis=-1)])


def run_demo(workdir: str | Path | None = None, echo: Echo = print) -> DemoResult:
    work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="cuvil-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    x_train, y_train, x_test, y_test = digits_split()
    start = time.perf_counter()
    params = train_mlp(x_train, y_train)
    graph = mlp_graph(params)
    train_acc = _accuracy(api.run_reference(graph, {"pixels": x_train}), y_train)
    echo(f"trained a 64-32-10 MLP on {len(x_train)} digits in {time.perf_counter() - start:.2f}s "
         f"(train accuracy {train_acc:.3f})")

    keys = api.keygen(work / "keys", "demo", force=True)
    echo(f"key pair in {keys.private_path.parent} (fingerprint {keys.fingerprint})")
    done = api.export(graph, work / "digits.cuvil", keys.private_path, name="digits-mlp", version="1")
    echo(f"signed bundle {done.path}: {done.size} bytes for {done.weight_bytes} weight bytes")

    model = api.load(done.path, trusted_keys=[keys.public_path])
    s = summarize(model.graph)
    echo(print_graph(model.graph, data=False).rstrip())
    echo(f"verified {model.name} {model.version}, signed by {model.signer}; "
         f"{s.parameters} parameters, {s.flops} FLOPs per example")
    accuracy = _accuracy(model.run({"pixels": x_test}), y_test)
    echo(f"reference interpreter accuracy on {len(x_test)} held-out digits: {accuracy:.3f}")
    return DemoResult(work, done.path, accuracy, train_acc)


def _accuracy(outputs: dict[str, np.ndarray], labels: np.ndarray) -> float:
    (probs,) = outputs.values()
    return float((probs.argmax(axis=1) == labels).mean())
