"""Privacy accounting with an established accountant (dp-accounting's RDP), never hand-rolled.

The discrete Gaussian with integer sensitivity Δ and scale σ satisfies the same Rényi/concentrated
DP curve as the continuous Gaussian (Canonne, Kamath, Steinke 2020, Thm. 4), so each release is
composed as a ``GaussianDpEvent`` with noise multiplier σ/Δ.
"""

from __future__ import annotations

from collections.abc import Sequence


def epsilon_spent(noise_multipliers: Sequence[float], delta: float) -> float:
    if not noise_multipliers:
        return 0.0
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant()
    for z in noise_multipliers:
        acc.compose(dp_accounting.GaussianDpEvent(z))
    return float(acc.get_epsilon(delta))
