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
        "threads": 1,
    }).as_metrics(), correct.sum() / n


HOSTILE = "evil\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"  # OSC title, clear screen, 8-bit CSI, bidi override


def recorded_run(path, hostile: bool = False):
    """A results database as a coordinator writes it: an evaluation round and an A/B round over an x86
    class (measured) and rpi5 (emulated), a refusal for budget (its code said twice, as devices did),
    a timeout; ``hostile`` gives one device escape sequences in its id, CPU and failure reason."""
    from cuvil.coordinator.store import DeviceRecord, ResultsStore

    store = ResultsStore(path)
    run = store.start_run({"bundle": "m.cuvil", "bundle-b": "m2.cuvil", "num-rounds": 1})
    devices = [(f"d{i}", "x86-avx2" if i < 3 else "rpi5") for i in range(6)]
    bad = f"x{HOSTILE}" if hostile else "x-gone"
    for dev, prof in devices:
        store.upsert_device(DeviceRecord(dev, prof, "haswell", "+avx2,+fma", "cuvil 0.1.0", prof == "rpi5"))
    store.upsert_device(DeviceRecord(bad, "x86-avx2", f"cpu{HOSTILE}" if hostile else "haswell", "+avx2", "t", False))
    store.upsert_device(DeviceRecord("spent", "rpi5", "cortex-a76", "+neon", "t", True))
    rounds = []
    for kind, model, acc in (("eval", "m@1", 0.9), ("ab:A", "m@1", 0.9), ("ab:B", "m@2", 0.5)):
        rnd = store.start_round(run, 1 if kind == "eval" else 2, kind, model, ("a" if model == "m@1" else "b") * 64,
                                "digits")
        for i, (dev, prof) in enumerate(devices):
            metrics, _ = device_report(i + 10 * len(rounds), acc, latency_ms=0.0012 if prof != "rpi5" else 40.0,
                                       emulated=prof == "rpi5")
            store.add_report(rnd, dev, prof, prof == "rpi5", metrics)
        store.add_failure(rnd, bad, "timeout", f"no reply within 30 s{HOSTILE if hostile else ''}")
        if kind == "eval":
            store.add_failure(rnd, "spent", "budget_exhausted",
                              "DP_BUDGET_EXHAUSTED: DP_BUDGET_EXHAUSTED: dataset 'local': this release would spend "
                              "ε=3.088 > 3.0")
        store.finish_round(rnd, sampled=len(devices) + 2, bundle_bytes_sent=1000)
        rounds.append(rnd)
    store.add_latency_prediction("a" * 64, "rpi5", "1", 0.0071, {"features": {}})
    store.finish_run(run)
    store.close()
    return path
