"""The canary decision rule: promote a class when B is not worse than A beyond what the DP noise can hide.

On a class's canary devices the A/B round gives d = acc(B) - acc(A) on the same examples, with the
standard error s of the DP noise (the two releases' noise is independent). The rule is a one-sided
non-inferiority test at level ``alpha`` with margin ``m``:

    promote  iff  d + z(1 - alpha) * s  >=  -m          (otherwise roll back)

Its errors, under Gaussian noise (see ``docs/rollout.md``):

- a B that is truly at least as good as A - m is rolled back with probability at most ``alpha``;
- a B truly worse than A by ``w > m`` is promoted with probability Phi(z(1 - alpha) - (w - m) / s): at
  most ``beta`` once w >= m + (z(1 - alpha) + z(1 - beta)) * s, :func:`detectable_loss`.

A class whose canaries gave no paired report is rolled back (no evidence is not evidence of safety).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from ..compiler.errors import CuvilError

PROMOTE, ROLLBACK = "promote", "rollback"


class RolloutError(CuvilError):
    """A rollout's parameters or state do not allow a decision."""


@dataclass(frozen=True)
class DecisionRule:
    alpha: float = 0.05  # chance of rolling back a B that is not worse (beyond the margin)
    margin: float = 0.0  # accuracy B may lose against A and still be promoted

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, float) and 0 < self.alpha < 0.5):
            raise RolloutError(f"the rollout's alpha must be in (0, 0.5), got {self.alpha!r}")
        if not (isinstance(self.margin, float) and 0 <= self.margin < 1):
            raise RolloutError(f"the rollout's margin must be in [0, 1), got {self.margin!r}")

    @property
    def z(self) -> float:
        return NormalDist().inv_cdf(1 - self.alpha)


@dataclass(frozen=True)
class Decision:
    device_class: str
    decision: str  # PROMOTE or ROLLBACK
    devices: int  # canaries that reported both versions
    diff: float | None  # B - A on them
    se: float | None
    bound: float | None  # the one-sided upper confidence bound d + z * s that was compared with -margin
    reason: str


def decide(device_class: str, devices: int, diff: float | None, se: float | None, rule: DecisionRule) -> Decision:
    """Apply the rule to one class's paired A/B result (``devices`` = canaries that reported both)."""
    if devices <= 0 or diff is None or se is None or not (math.isfinite(diff) and math.isfinite(se) and se >= 0):
        return Decision(device_class, ROLLBACK, max(devices, 0), None, None, None,
                        "no canary reported both versions: nothing shows B is safe")
    bound = diff + rule.z * se
    if bound >= -rule.margin:
        why = (f"B - A = {diff:+.4f} ± {se:.4f}: not worse than A by more than {rule.margin:g} "
               f"at level {rule.alpha:g} (upper bound {bound:+.4f})")
        return Decision(device_class, PROMOTE, devices, diff, se, bound, why)
    why = (f"B - A = {diff:+.4f} ± {se:.4f}: worse than A beyond the noise "
           f"(upper bound {bound:+.4f} < {-rule.margin:g} at level {rule.alpha:g})")
    return Decision(device_class, ROLLBACK, devices, diff, se, bound, why)


def detectable_loss(se: float, rule: DecisionRule, beta: float = 0.05) -> float:
    """The accuracy loss beyond which a worse B is promoted with probability at most ``beta``."""
    return rule.margin + (rule.z + NormalDist().inv_cdf(1 - beta)) * se


def promote_probability(true_diff: float, se: float, rule: DecisionRule) -> float:
    """P(promote) for a B whose true B - A is ``true_diff``, when the estimate's noise has s.d. ``se``."""
    if se <= 0:
        return 1.0 if true_diff >= -rule.margin else 0.0
    return NormalDist().cdf((true_diff + rule.margin) / se + rule.z)
