"""Privacy accounting: every charge is a list of Gaussian events, composed in RDP.

Every charge is a :class:`ChargeEvent`: a Gaussian mechanism with noise multiplier ``z``, Poisson-
subsampled at rate ``q`` and self-composed ``steps`` times. An evaluation release is the plain case
(``q = 1``): the discrete Gaussian with integer sensitivity Δ and scale σ satisfies the same
Rényi/concentrated DP curve as the continuous Gaussian (Canonne, Kamath, Steinke 2020, Thm. 4), so
order α costs ``steps · α / (2 z²)`` with z = σ/Δ, and charges compose by adding. For plain events
this module computes that curve and its conversion to (ε, δ) (Proposition 12 of Canonne, Kamath,
Steinke 2020, over dp-accounting's default orders) in closed form, exactly as
``dp_accounting.rdp.RdpAccountant`` does (tests compare the two): a device that only evaluates needs
no dp-accounting. A DP-SGD training round (``q < 1``) is composed in dp-accounting's accountant,
which the training extra installs with Opacus.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

# dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS
RDP_ORDERS: tuple[float, ...] = (*(1 + x / 10.0 for x in range(1, 100)), *map(float, range(11, 64)),
                                 128.0, 256.0, 512.0, 1024.0)


class AccountingError(ValueError):
    """Events or δ for which no ε can be stated (not finite, not positive, not a whole step count)."""


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
            raise AccountingError("a privacy charge needs a finite noise multiplier > 0, a sampling rate in (0, 1] "
                                  "and a whole number of steps >= 1")

    def dp_event(self):
        import dp_accounting

        event = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sample_rate < 1:
            event = dp_accounting.PoissonSampledDpEvent(self.sample_rate, event)
        return event if self.steps == 1 else dp_accounting.SelfComposedDpEvent(event, int(self.steps))


def epsilon_spent(events: Sequence[ChargeEvent | float], delta: float) -> float:
    """ε at ``delta`` of all ``events`` composed (a bare number is a plain Gaussian's noise multiplier)."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not (math.isfinite(delta) and 0 < delta < 1):
        raise AccountingError("delta must be a number in (0, 1)")
    events = [e if isinstance(e, ChargeEvent) else ChargeEvent(e) for e in events]
    if not events:
        return 0.0
    if any(e.sample_rate < 1 for e in events):
        return _subsampled_epsilon(tuple(events), float(delta))
    return _gaussian_epsilon(sum(e.steps / (2.0 * e.noise_multiplier**2) for e in events), delta)


@functools.lru_cache(maxsize=256)
def _subsampled_epsilon(events: tuple[ChargeEvent, ...], delta: float) -> float:
    """ε of events that include a subsampled one, in dp-accounting's accountant (a pure function of its
    arguments, remembered: the RDP of a subsampled Gaussian costs tens of milliseconds, and a process that
    serves many devices with one history, a simulation's worker, asks the same question again and again)."""
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant()
    for e in events:
        acc.compose(e.dp_event())
    return float(acc.get_epsilon(delta))


def _gaussian_epsilon(per_order: float, delta: float) -> float:
    """ε of an RDP curve α·``per_order`` at ``delta`` (dp_accounting.rdp.compute_epsilon's bound)."""
    best = math.inf
    for a in RDP_ORDERS:
        rdp = a * per_order
        if delta**2 + math.expm1(-rdp) > 0:
            return 0.0
        best = min(best, rdp + math.log1p(-1 / a) - math.log(delta * a) / (a - 1))
    return max(0.0, best)
