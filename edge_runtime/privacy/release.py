"""The one way evaluation metrics leave a device: check, prepare, charge, noise, store, send.

:func:`prepare` does everything that can fail or refuse *before* any private data is read: the
parameters against the device's floors, the release-id against what it was charged for, the
accountant and the noise scale, the budget. :func:`release` then charges (durably) before the
first random bit is drawn, so a crash between charge and send leaves the budget spent. Noise comes
from fresh OS randomness for every release; a repeated request is answered from the stored noisy
reply, never re-noised: a charged release whose reply was lost is refused, not drawn again.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from ...compiler.digest import sha256
from .accounting import ChargeEvent
from .errors import PrivacyRefusal, Reason, RefusalCode
from .ledger import PrivacyLedger
from .mechanism import BASE_FAMILIES, NoisyReport, PrivacyParams, add_noise, encode_sums
from .request import check
from .rng import ChaChaRandom


@dataclass(frozen=True)
class Ticket:
    """A release that may go ahead (``cached`` is None) or is already answered (``cached``)."""

    dataset: str
    release_id: str
    params: PrivacyParams
    families: int
    binding: str
    noise_multiplier: float
    variance: int = 0
    epsilon_after: float = 0.0
    cached: tuple[NoisyReport, float] | None = None


def binding_of(dataset: str, params: PrivacyParams, families: int, bundle_hash: str) -> str:
    """What a release-id is charged for: the exact parameters, families, dataset and bundle."""
    text = json.dumps({"dataset": dataset, "params": dataclasses.asdict(params), "families": families,
                       "bundle": bundle_hash}, sort_keys=True)
    return sha256(text.encode()).hexdigest()


def prepare(ledger: PrivacyLedger, dataset: str, release_id: str, params: PrivacyParams, *,
            bundle_hash: str = "", families: int = len(BASE_FAMILIES)) -> Ticket:
    """Validate and pre-compute a release, or refuse it; reads no private data and charges nothing."""
    check(params, ledger.floors)
    binding = binding_of(dataset, params, families, bundle_hash)
    z = params.noise_multiplier(families)
    charged = ledger.binding(release_id)
    if charged is not None:
        if charged and charged != binding:
            raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.RELEASE_REBOUND,
                                 f"release {release_id!r} was charged for other parameters or another bundle")
        stored = ledger.cached_reply(release_id)
        if stored is None:
            raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.RELEASE_LOST,
                                 f"release {release_id!r} was charged but its reply was never stored")
        report = _from_payload(stored)
        spent = float(stored.get("spent", ledger.spent(dataset, params.delta)))
        return Ticket(dataset, release_id, params, families, binding, z, cached=(report, spent))
    variance = params.noise_sigma2  # computed (and able to fail) before the charge, like the accountant
    after = ledger.epsilon_after(dataset, [ChargeEvent(z)], params.epsilon, params.delta)
    return Ticket(dataset, release_id, params, families, binding, z, variance, after)


def release(ledger: PrivacyLedger, ticket: Ticket, sums: dict[str, int], hist: Sequence[int] = ()) -> tuple[NoisyReport, float]:
    """Charge, then noise with fresh randomness, then store the noisy reply; return it and ε after."""
    if ticket.cached is not None:
        return ticket.cached
    if len(BASE_FAMILIES) + (1 if hist else 0) != ticket.families:
        raise ValueError("the sums do not have the families the release was prepared for")
    spent = ledger.charge(ticket.dataset, ticket.release_id, ticket.noise_multiplier, ticket.params.epsilon,
                          ticket.params.delta, binding=ticket.binding)
    report = add_noise(sums, hist, ticket.params, ChaChaRandom.fresh())
    ledger.store_reply(ticket.release_id, {**_to_payload(report), "spent": spent})
    return report, spent


def release_report(ledger: PrivacyLedger, dataset: str, release_id: str, correct: Sequence[bool],
                   losses: Sequence[float], params: PrivacyParams,
                   latency_bucket: Sequence[int] | None = None, buckets: int = 0,
                   bundle_hash: str = "") -> tuple[NoisyReport, float]:
    """Return (noisy report, ε spent on ``dataset`` after it), or raise PrivacyRefusal with no metrics."""
    families = len(BASE_FAMILIES) + (1 if latency_bucket is not None and buckets > 0 else 0)
    ticket = prepare(ledger, dataset, release_id, params, bundle_hash=bundle_hash, families=families)
    if ticket.cached is not None:
        return ticket.cached
    return release(ledger, ticket, *encode_sums(correct, losses, params, latency_bucket, buckets))


def _to_payload(report: NoisyReport) -> dict:
    return {"sums": dict(report.sums), "histogram": list(report.histogram),
            "params": dataclasses.asdict(report.params), "families": report.families}


def _from_payload(payload: dict) -> NoisyReport:
    return NoisyReport(payload["sums"], tuple(payload["histogram"]), PrivacyParams(**payload["params"]),
                       payload["families"])
