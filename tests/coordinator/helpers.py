"""Build schema-conformant device reports through the real privacy mechanism."""

import numpy as np

from cuvil.coordinator.schema import check_report
from cuvil.edge_runtime.latency import histogram
from cuvil.edge_runtime.privacy.mechanism import PrivacyParams, add_noise, encode_sums
from cuvil.edge_runtime.privacy.rng import ChaChaRandom


def device_report(seed: int, accuracy: float, n: int = 400, latency_ms: float = 1.0, emulated: bool = False):
    gen = np.random.default_rng(seed)
    correct = gen.random(n) < accuracy
    losses = np.where(correct, 0.1, 2.0)
    params = PrivacyParams()
    noisy = add_noise(*encode_sums(correct[:512], losses[:512], params), params, ChaChaRandom(bytes([seed % 256]) * 32))
    lat = gen.normal(latency_ms, latency_ms * 0.05, 50).clip(1e-3)
    return check_report({
        "dp_correct": noisy.sums["correct"], "dp_loss": noisy.sums["loss"], "dp_count": noisy.sums["count"],
        "dp_sigma": params.sigma, "dp_quantum": params.quantum, "dp_loss_clip": params.loss_clip,
        "dp_epsilon_spent": 0.77, "latency_hist": list(histogram(lat)),
        "latency_p50_ms": float(np.median(lat)), "latency_p90_ms": float(np.percentile(lat, 90)),
        "latency_p99_ms": float(np.percentile(lat, 99)), "latency_emulated": int(emulated),
        "compile_ms": 12.0, "cache_hit": 1, "arena_bytes": 4096, "bundle_was_cached": 1,
    }), correct.sum() / n
