"""The canary decision rule: its verdicts, and its stated error rates checked by simulation."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.coordinator.rollout_rule import (
    PROMOTE, ROLLBACK, DecisionRule, RolloutError, decide, detectable_loss, promote_probability,
)


def test_verdicts_at_the_boundary_of_the_noise():
    rule = DecisionRule(alpha=0.05)
    assert rule.z == pytest.approx(1.6448536, rel=1e-6)
    assert decide("x", 5, -0.016, 0.01, rule).decision == PROMOTE  # -0.016 + 1.645 * 0.01 >= 0
    assert decide("x", 5, -0.017, 0.01, rule).decision == ROLLBACK
    assert decide("x", 5, +0.05, 0.01, rule).decision == PROMOTE
    assert decide("x", 5, -0.03, 0.01, DecisionRule(margin=0.02)).decision == PROMOTE  # within the margin
    for devices, diff, se in ((0, 0.1, 0.01), (3, None, None), (3, float("nan"), 0.01)):
        d = decide("x", devices, diff, se, rule)
        assert d.decision == ROLLBACK and "no canary" in d.reason


def test_stated_error_rates_hold_in_simulation():
    """False rollback <= alpha when B = A; promotion of a B worse by detectable_loss <= beta."""
    rule, se = DecisionRule(alpha=0.05), 0.012
    gen = np.random.default_rng(7)
    same = gen.normal(0.0, se, 20_000)
    false_rollbacks = np.mean([decide("x", 4, d, se, rule).decision == ROLLBACK for d in same])
    assert false_rollbacks == pytest.approx(0.05, abs=0.006)
    loss = detectable_loss(se, rule, beta=0.05)
    worse = gen.normal(-loss, se, 20_000)
    promoted = np.mean([decide("x", 4, d, se, rule).decision == PROMOTE for d in worse])
    assert promoted == pytest.approx(0.05, abs=0.006)
    assert promote_probability(-loss, se, rule) == pytest.approx(0.05, abs=1e-9)
    assert promote_probability(0.0, se, rule) == pytest.approx(0.95, abs=1e-9)


@pytest.mark.parametrize("alpha,margin", [(0.0, 0.0), (0.6, 0.0), (0.05, -0.1), (0.05, 1.0), (1, 0.0)])
def test_bad_rule_parameters_are_refused(alpha, margin):
    with pytest.raises(RolloutError):
        DecisionRule(alpha=alpha, margin=margin)
