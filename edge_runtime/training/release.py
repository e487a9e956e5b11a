"""The one way a training round's result leaves a device: check, charge, then train, then release.

A round releases two things about the device's examples: the DP-SGD update (Opacus: Poisson-
sampled, clipped, noised steps; the returned update is post-processing of them) and a noisy
example count, FedAvg's weight (sensitivity one example, discrete Gaussian of the device's own
``min_sigma``). Both are one charge in the device's privacy ledger, against the same per-dataset
budget as evaluation releases, made durable **before** any data is read or any step is taken; a
charge that would pass the budget is refused and nothing runs.

A repeated release-id is answered from the stored reply at no cost. A release-id that was charged
but has no stored reply (the device died mid-round) is refused, never run again with fresh noise.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...compiler.digest import sha256
from ..privacy.accounting import ChargeEvent
from ..privacy.dgauss import discrete_gaussian
from ..privacy.errors import PrivacyRefusal, Reason, RefusalCode
from ..privacy.ledger import PrivacyLedger
from ..privacy.request import MAX_EPSILON, number
from ..privacy.rng import ChaChaRandom
from .config import DpSgdConfig
from .dpsgd import LocalUpdate


@dataclass(frozen=True)
class ReleasedUpdate:
    """What leaves the device after a training round: nothing else about its data."""

    update: dict[str, np.ndarray]
    dp_count: int  # noisy number of examples trained on
    epsilon_spent: float  # the device's ε on its dataset after this round
    count_sigma: float
    delta: float  # the δ of that ε


def round_events(cfg: DpSgdConfig, count_sigma: float) -> list[ChargeEvent]:
    """The exact events a round runs: the subsampled Gaussian over its steps, and the count's Gaussian."""
    return [ChargeEvent(cfg.noise_multiplier, cfg.sample_rate, cfg.steps), ChargeEvent(count_sigma)]


def training_binding(dataset: str, cfg: DpSgdConfig, epsilon: float, bundle_hash: str) -> str:
    """What a training release-id is charged for: the dataset, the exact DP-SGD round, the budget, the weights."""
    text = json.dumps({"kind": "train", "dataset": dataset, "dp_sgd": dataclasses.asdict(cfg), "epsilon": epsilon,
                       "bundle": bundle_hash}, sort_keys=True)
    return sha256(text.encode()).hexdigest()


def release_update(ledger: PrivacyLedger, dataset: str, release_id: str, cfg: DpSgdConfig,
                   train: Callable[[], LocalUpdate], epsilon: float = 0.0, bundle_hash: str = "") -> ReleasedUpdate:
    """Charge the round, then run ``train`` and noise its count; or raise PrivacyRefusal having run nothing.

    ``epsilon``: the budget the coordinator asks for (0: the device's own; more than that is refused).
    A release-id already charged for anything else (other parameters, weights, dataset, an evaluation)
    is refused as rebound, never answered with a reply that was released for something else.
    """
    floors = ledger.floors
    epsilon = number("dp-epsilon", epsilon, 0.0, MAX_EPSILON) or floors.epsilon
    if epsilon > floors.epsilon:
        raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.ABOVE_BUDGET,
                             f"budget ε={epsilon} is above this device's {floors.epsilon}")
    count_sigma = floors.min_sigma
    binding = training_binding(dataset, cfg, epsilon, bundle_hash)
    charged = ledger.binding(release_id)
    if charged is not None:
        if charged and charged != binding:  # '' : charged before release-ids were bound
            raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.RELEASE_REBOUND,
                                 "this release-id was charged for another round")
        cached = ledger.cached_reply(release_id)
        if cached is None:
            raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.RELEASE_LOST,
                                 "this training round was charged but its reply was lost; it is not run twice")
        return _from_payload(cached, float(cached.get("spent", ledger.spent(dataset, floors.delta))), floors.delta)
    spent = ledger.charge(dataset, release_id, cfg.noise_multiplier, epsilon, floors.delta,
                          round_events(cfg, count_sigma), binding=binding)
    local = train()
    noise = discrete_gaussian(math.ceil(count_sigma**2), ChaChaRandom.fresh())  # a repeat reads the stored reply
    out = ReleasedUpdate(dict(local.update), local.examples + noise, spent, count_sigma, floors.delta)
    ledger.store_reply(release_id, _to_payload(out))
    return out

def _to_payload(r: ReleasedUpdate) -> dict:
    buf = io.BytesIO()
    np.savez(buf, **r.update)
    return {"dp_count": r.dp_count, "count_sigma": r.count_sigma, "spent": r.epsilon_spent,
            "arrays": base64.b64encode(buf.getvalue()).decode()}


def _from_payload(p: dict, spent: float, delta: float) -> ReleasedUpdate:
    with np.load(io.BytesIO(base64.b64decode(p["arrays"])), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return ReleasedUpdate(arrays, int(p["dp_count"]), spent, float(p["count_sigma"]), delta)
