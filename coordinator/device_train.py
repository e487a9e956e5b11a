"""One device's training round (domain logic, no Flower): capability, charge, DP-SGD, release.

The coordinator sends the weights to start from as a signed bundle (pushed only when the device does
not hold it, verified like any other) and the round's public DP-SGD parameters. What comes back is
the clipped update, the noisy example count and the ε the device has spent: see
:mod:`cuvil.edge_runtime.training.release`, the one way a round's result leaves the device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..edge_runtime.loader import Model
from ..edge_runtime.privacy.errors import PrivacyRefusal, Reason, RefusalCode
from ..edge_runtime.privacy.request import MAX_EPSILON, number, release_id
from ..edge_runtime.training import DpSgdConfig, TrainingError
from ..edge_runtime.training.release import release_update
from .device import DeviceState

PREFIX = "dp-sgd-"  # a round's DP-SGD parameters travel as "dp-sgd-<field>" config keys


@dataclass(frozen=True)
class TrainRequest:
    bundle_hash: str
    release_id: str
    dp: DpSgdConfig
    epsilon: float = 0.0  # requested budget; 0 asks for the device's own (more is refused)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> TrainRequest:
        """Parse a train message's config, every field checked as the evaluation request's are: a missing,
        mistyped or out-of-range value is a PrivacyRefusal PARAMS_REJECTED (the device could train; the
        request is what is wrong)."""
        names = {f.name for f in fields(DpSgdConfig)}
        try:
            dp = DpSgdConfig(**{k[len(PREFIX):].replace("-", "_"): v for k, v in cfg.items()
                                if k.startswith(PREFIX) and k[len(PREFIX):].replace("-", "_") in names})
        except TrainingError as e:
            raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.OUT_OF_RANGE, str(e)) from None
        bundle_hash = cfg.get("bundle-hash")
        if not isinstance(bundle_hash, str):
            raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.MISSING if bundle_hash is None else
                                 Reason.WRONG_TYPE, "bundle-hash must be a string")
        return cls(bundle_hash, release_id(cfg.get("release-id")), dp,
                   number("dp-epsilon", cfg.get("dp-epsilon", 0.0), 0.0, MAX_EPSILON))

def config_key(name: str) -> str:
    """The message config key of DpSgdConfig field ``name``."""
    return PREFIX + name.replace("_", "-")


def config_keys(dp: DpSgdConfig) -> dict[str, Any]:
    """The message config of ``dp`` (what :meth:`TrainRequest.from_config` reads back)."""
    return {config_key(f.name): getattr(dp, f.name) for f in fields(DpSgdConfig)}


def train(state: DeviceState, model: Model, request: TrainRequest) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Charge, fine-tune on the local data, release; (metrics, update) or a typed refusal/error."""
    can = state.training_capability()
    if not can.can_train:
        raise TrainingError(f"this device does not fine-tune: {can.reason}")
    from ..edge_runtime.training.dpsgd import fine_tune, prepare

    x, y = state.dataset()
    module = prepare(model.graph, x.shape[1:])  # the model and the records' shape: refused before any charge

    def run():
        return fine_tune(model.graph, x, y, request.dp, module=module)

    ledger = state.ledger()
    try:
        out = release_update(ledger, state.dataset_name, request.release_id, request.dp, run, request.epsilon,
                             request.bundle_hash)
    finally:
        ledger.close()
    metrics = {"dp_count": int(out.dp_count), "dp_count_sigma": float(out.count_sigma),
               "dp_epsilon_spent": float(out.epsilon_spent), "dp_delta": float(out.delta)}
    return metrics, out.update
