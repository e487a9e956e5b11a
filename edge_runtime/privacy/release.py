"""The one way evaluation metrics leave a device: check params, charge, then noise, then cache.

Order matters: the ledger charge is durable before the first random bit is drawn, so a crash
between charge and send leaves the budget spent. Noise is keyed by the release id, so a repeated
request gets the identical reply (from the cache, or recomputed identically) at no extra cost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .errors import PrivacyRefusal, RefusalCode
from .ledger import PrivacyLedger
from .mechanism import BASE_FAMILIES, NoisyReport, PrivacyParams, add_noise, encode_sums
from .rng import ChaChaRandom


def check_params(requested: PrivacyParams, ledger: PrivacyLedger) -> PrivacyParams:
    """The coordinator may ask for more noise or a smaller budget, never less noise or more budget."""
    floors = ledger.floors
    if requested.sigma < floors.min_sigma:
        raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, f"sigma {requested.sigma} is below this device's floor {floors.min_sigma}")
    if requested.epsilon > floors.epsilon or requested.delta > floors.delta:
        raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED,
                             f"budget (ε={requested.epsilon}, δ={requested.delta}) exceeds this device's "
                             f"(ε={floors.epsilon}, δ={floors.delta})")
    if requested.quantum < 1 or requested.loss_clip <= 0 or requested.max_examples < 1:
        raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, "quantum, loss clip and max examples must be positive")
    return requested


def release_report(ledger: PrivacyLedger, dataset: str, release_id: str, correct: Sequence[bool],
                   losses: Sequence[float], params: PrivacyParams,
                   latency_bucket: Sequence[int] | None = None, buckets: int = 0) -> tuple[NoisyReport, float]:
    """Return (noisy report, ε spent on ``dataset`` after it), or raise PrivacyRefusal with no metrics."""
    check_params(params, ledger)
    cached = ledger.cached_reply(release_id)
    if cached is not None:
        return _from_payload(cached), ledger.spent(dataset, params.delta)
    sums, hist = encode_sums(correct, losses, params, latency_bucket, buckets)
    families = len(BASE_FAMILIES) + (1 if hist else 0)
    spent = ledger.charge(dataset, release_id, params.noise_multiplier(families), params.epsilon, params.delta)
    report = add_noise(sums, hist, params, ChaChaRandom.for_release(ledger.device_secret, f"{dataset}\0{release_id}"))
    ledger.store_reply(release_id, _to_payload(report))
    return report, spent


def _to_payload(report: NoisyReport) -> dict:
    return {"sums": dict(report.sums), "histogram": list(report.histogram),
            "params": dataclasses.asdict(report.params), "families": report.families}


def _from_payload(payload: dict) -> NoisyReport:
    return NoisyReport(payload["sums"], tuple(payload["histogram"]), PrivacyParams(**payload["params"]),
                       payload["families"])
