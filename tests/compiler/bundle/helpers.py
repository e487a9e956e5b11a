"""Shared by the bundle, loader, API and CLI tests: a small graph covering every weight dtype, keys."""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types, verify
from cuvil.compiler.bundle import frame


def small_graph(scale: int = 1) -> "cuvil.compiler.Graph":  # noqa: F821
    """x: f32[N,8] -> Relu(x * w + b), plus constants of other dtypes and shapes (0-d, empty)."""
    rng = np.random.default_rng(0)
    constants = {
        "w": rng.standard_normal(8 * scale).astype(np.float32)[:8],
        "b": rng.standard_normal(8).astype(np.float32),
        "idx": np.array([3, -1, 2**40], dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float16),
        "mask": np.array([True, False, True]),
        "scale": np.array(0.5, dtype=np.float64),
        "u": np.arange(5, dtype=np.uint8),
        "h": np.array([1.5, -2.25], dtype=np.float16),
        "i8": np.array([-128, 127], dtype=np.int8),
        "i32": np.array([[1, 2], [3, 4]], dtype=np.int32),
    }
    nodes = [
        Node.make("Mul", ["x", "w"], ["xw"]),
        Node.make("Add", ["xw", "b"], ["xwb"]),
        Node.make("Relu", ["xwb"], ["y"]),
        Node.make("Sigmoid", ["xw"], ["z"]),
    ]
    graph = infer_graph_types("small", {"x": TensorType(DType.F32, (N, 8))}, constants, nodes, ["y", "z"])
    return verify(graph)


def big_graph(total_bytes: int = 4 << 20, pieces: int = 40) -> "cuvil.compiler.Graph":  # noqa: F821
    """Odd-sized f32 weights (so alignment padding is exercised) summing to about ``total_bytes``."""
    rng = np.random.default_rng(1)
    constants = {f"layer{i}.weight": rng.standard_normal(total_bytes // 4 // pieces + 3 * i).astype(np.float32)
                 for i in range(pieces)}
    nodes = [Node.make("Relu", ["x"], ["y"])]
    return verify(infer_graph_types("big", {"x": TensorType(DType.F32, (N, 4))}, constants, nodes, ["y"]))


def new_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def resign(manifest: bytes, data: bytes, key: Ed25519PrivateKey) -> bytes:
    """A bundle around arbitrary manifest bytes, stored as the writer stores them and validly signed:
    reaches the parser behind the signature."""
    from cuvil.compiler.bundle.format import store_manifest

    stored, flags = store_manifest(manifest)
    return frame(stored, len(data), key, flags) + data


def split(bundle: bytes) -> tuple[bytes, bytes]:
    """(manifest bytes, inflated, and data region) of a well-formed bundle."""
    from cuvil.compiler.bundle.format import HEADER, MANIFEST_OFFSET, load_manifest

    _, _, flags, mlen, data_offset, _, _ = HEADER.unpack_from(bundle, 0)
    return load_manifest(bundle[MANIFEST_OFFSET:MANIFEST_OFFSET + mlen], flags), bundle[data_offset:]
