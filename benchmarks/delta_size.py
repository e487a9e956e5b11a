"""Bytes on the wire: a fine-tuned version pushed whole vs as a signed delta from its parent.

For each zoo model, v2 is v1 with its float32 weights moved as fine-tuning moves them (Gaussian steps
relative to each tensor's spread: every weight by 1e-3 or 1e-2, or only the last layer's), both signed;
prints the full bundle's bytes, the delta's, their ratio, and the time to make and to apply the delta
(median of --repeat). The delta is checked to rebuild v2 byte for byte.

    python benchmarks/delta_size.py [--models mlp,small_cnn,mobilenet_v2,resnet18] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from cuvil.compiler.bundle import apply_delta, bundle_bytes, make_delta, read_delta  # noqa: E402
from cuvil.compiler.frontends.torch import import_torch  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.zoo import ZOO  # noqa: E402

SCENARIOS = {"all weights, step 1e-3": (1e-3, False), "all weights, step 1e-2": (1e-2, False),
             "last layer, step 1e-2": (1e-2, True)}


def moved(constants: dict, step: float, last_only: bool, seed: int = 0) -> dict:
    gen = np.random.default_rng(seed)
    floats = [n for n, w in constants.items() if w.dtype == np.float32 and w.size > 1]
    chosen = set(floats[-2:] if last_only else floats)
    return {n: (w + gen.normal(0, step * float(w.std()) or step, w.shape)).astype(np.float32) if n in chosen else w
            for n, w in constants.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,small_cnn,mobilenet_v2,resnet18")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    key = Ed25519PrivateKey.generate()
    print(describe_host())
    print(f"{'model':14} {'update':24} {'full B':>11} {'delta B':>11} {'ratio':>6} {'make ms':>8} {'apply ms':>8}")
    for name in args.models.split(","):
        module, example = ZOO[name]()
        graph = import_torch(module, example)
        v1 = bundle_bytes(graph, key, version="1")
        for label, (step, last_only) in SCENARIOS.items():
            v2 = bundle_bytes(graph.replace(constants=moved(dict(graph.constants), step, last_only)), key, version="2")
            make, apply = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                delta = make_delta(v1, v2, key)
                t1 = time.perf_counter()
                out = apply_delta(read_delta(delta, [key.public_key()]), v1, [key.public_key()])
                t2 = time.perf_counter()
                make.append(t1 - t0)
                apply.append(t2 - t1)
            assert out == v2
            print(f"{name:14} {label:24} {len(v2):11d} {len(delta):11d} {len(delta) / len(v2):6.3f} "
                  f"{1e3 * statistics.median(make):8.1f} {1e3 * statistics.median(apply):8.1f}", flush=True)


if __name__ == "__main__":
    main()
