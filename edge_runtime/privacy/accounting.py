"""Privacy accounting with an established accountant (dp-accounting's RDP), never hand-rolled.

Every charge is a :class:`ChargeEvent`: a Gaussian mechanism with noise multiplier ``z``, Poisson-
subsampled at rate ``q`` and self-composed ``steps`` times. An evaluation release is the plain case
(``q = 1``, one step): the discrete Gaussian with integer sensitivity Δ and scale σ satisfies the
same Rényi/concentrated DP curve as the continuous Gaussian (Canonne, Kamath, Steinke 2020, Thm. 4),
so it is a ``GaussianDpEvent`` with multiplier σ/Δ. A DP-SGD training round is the general case
(``PoissonSampledDpEvent`` of that Gaussian, ``SelfComposedDpEvent`` over its steps), composed in
the same accountant against the same per-dataset budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChargeEvent:
    noise_multiplier: float  # z: the Gaussian's standard deviation over the L2 sensitivity
    sample_rate: float = 1.0  # q: Poisson sampling probability of each example (1: every example)
    steps: int = 1  # how many times the (sampled) Gaussian runs

    def __post_init__(self) -> None:
        ok = (all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  for v in (self.noise_multiplier, self.sample_rate, self.steps))
              and self.noise_multiplier > 0 and 0 < self.sample_rate <= 1
              and self.steps == int(self.steps) and self.steps >= 1)
        if not ok:
            raise ValueError("a privacy charge needs a finite noise multiplier > 0, a sampling rate in (0, 1] "
                             "and a whole number of steps >= 1")

    def dp_event(self):
        import dp_accounting

        event = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sample_rate < 1:
            event = dp_accounting.PoissonSampledDpEvent(self.sample_rate, event)
        return event if self.steps == 1 else dp_accounting.SelfComposedDpEvent(event, int(self.steps))


def epsilon_spent(events: Sequence[ChargeEvent | float], delta: float) -> float:
    """ε at ``delta`` of all ``events`` composed (a bare number is a plain Gaussian's noise multiplier)."""
    if not events:
        return 0.0
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant()
    for e in events:
        acc.compose((e if isinstance(e, ChargeEvent) else ChargeEvent(float(e))).dp_event())
    return float(acc.get_epsilon(delta))
