"""A training round is charged its exact DP-SGD event before it runs, in the one ledger evaluation uses."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cuvil.edge_runtime.privacy import DEFAULT_PARAMS, PrivacyRefusal, RefusalCode
from cuvil.edge_runtime.privacy.errors import Reason
from cuvil.edge_runtime.privacy.ledger import PrivacyFloors, PrivacyLedger
from cuvil.edge_runtime.privacy.release import release_report
from cuvil.edge_runtime.training import DpSgdConfig
from cuvil.edge_runtime.training.dpsgd import LocalUpdate
from cuvil.edge_runtime.training.release import release_update

CFG = DpSgdConfig(sample_rate=0.05, noise_multiplier=1.5, steps=30)


def expected_epsilon(rounds: int, evals: int = 0, delta: float = 1e-6) -> float:
    """dp-accounting directly: the Poisson-subsampled Gaussian over 30 steps, the count's and evaluations' Gaussians."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant()
    for _ in range(rounds):
        acc.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.5)), 30))
        acc.compose(dp_accounting.GaussianDpEvent(10.0))  # the noisy count: sensitivity 1, sigma 10
    for _ in range(evals):
        acc.compose(dp_accounting.GaussianDpEvent(10.0 / 3**0.5))
    return acc.get_epsilon(delta)


class Trainer:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> LocalUpdate:
        self.calls += 1
        return LocalUpdate({"w": np.full(3, 0.25, np.float32)}, 0.4, 300)


@pytest.fixture
def ledger(tmp_path):
    led = PrivacyLedger.create(tmp_path / "ledger.db", PrivacyFloors(epsilon=2.0))
    yield led
    led.close()


def test_each_round_is_charged_its_exact_event_and_the_ledger_refuses_past_the_budget(ledger):
    train = Trainer()
    first = release_update(ledger, "local", "t1", CFG, train)
    assert first.epsilon_spent == pytest.approx(expected_epsilon(1), rel=1e-9)
    assert abs(first.dp_count - 300) < 80  # noised with sigma 10 examples
    second = release_update(ledger, "local", "t2", CFG, train)
    assert second.epsilon_spent == pytest.approx(expected_epsilon(2), rel=1e-9) and second.epsilon_spent < 2.0
    assert expected_epsilon(3) > 2.0  # a third round would pass the budget: refused, and nothing runs
    with pytest.raises(PrivacyRefusal) as e:
        release_update(ledger, "local", "t3", CFG, train)
    assert e.value.code is RefusalCode.BUDGET_EXHAUSTED
    assert train.calls == 2 and ledger.releases("local") == 2 and not ledger.is_charged("t3")


def test_training_and_evaluation_share_one_budget_per_dataset(ledger):
    for i in range(2):
        release_report(ledger, "local", f"e{i}", np.ones(50, bool), np.zeros(50), replace(DEFAULT_PARAMS, epsilon=2.0))
    out = release_update(ledger, "local", "t1", CFG, Trainer())
    assert out.epsilon_spent == pytest.approx(expected_epsilon(1, evals=2), rel=1e-9)
    assert ledger.spent("local") == pytest.approx(out.epsilon_spent)
    with pytest.raises(PrivacyRefusal, match="DP_BUDGET_EXHAUSTED"):  # 1 round + 2 evals leave too little
        release_update(ledger, "local", "t2", CFG, Trainer())
    assert release_update(ledger, "other", "t2", CFG, Trainer()).epsilon_spent < 2.0  # budgets are per dataset


def test_a_repeated_round_is_answered_from_the_stored_reply_and_a_lost_one_is_never_rerun(ledger):
    train = Trainer()
    a = release_update(ledger, "local", "t1", CFG, train)
    b = release_update(ledger, "local", "t1", CFG, train)
    assert train.calls == 1 and a.dp_count == b.dp_count and ledger.releases("local") == 1
    np.testing.assert_array_equal(a.update["w"], b.update["w"])
    release_report(ledger, "local", "e1", np.ones(50, bool), np.zeros(50), replace(DEFAULT_PARAMS, epsilon=2.0))
    again = release_update(ledger, "local", "t1", CFG, train)  # another release charged the dataset since
    assert again.epsilon_spent == a.epsilon_spent == pytest.approx(expected_epsilon(1), rel=1e-9)
    assert ledger.spent("local") > a.epsilon_spent  # the repeat says what the round's reply said, not the total now
    ledger.charge("local", "lost", 10.0, 2.0, 1e-6)  # charged, then the device died before it replied
    with pytest.raises(PrivacyRefusal) as e:
        release_update(ledger, "local", "lost", CFG, train)
    assert e.value.reason is Reason.RELEASE_LOST and "not run twice" in e.value.detail
    assert train.calls == 1


@pytest.mark.parametrize("epsilon", [float("nan"), float("inf"), 2.5, -1.0])
def test_a_budget_beyond_the_device_or_not_a_number_is_refused(ledger, epsilon):
    train = Trainer()
    with pytest.raises(PrivacyRefusal, match="DP_PARAMS_REJECTED"):
        release_update(ledger, "local", "t1", CFG, train, epsilon=epsilon)
    assert train.calls == 0 and ledger.releases("local") == 0


def test_a_release_id_charged_for_anything_else_is_refused_as_rebound_and_nothing_runs(ledger):
    train = Trainer()
    release_update(ledger, "local", "t1", CFG, train, bundle_hash="v1")
    release_report(ledger, "local", "e1", np.ones(50, bool), np.zeros(50), replace(DEFAULT_PARAMS, epsilon=2.0))
    for rid, cfg, bundle in (("t1", replace(CFG, steps=31), "v1"), ("t1", CFG, "v2"), ("e1", CFG, "v1")):
        with pytest.raises(PrivacyRefusal) as e:
            release_update(ledger, "local", rid, cfg, train, bundle_hash=bundle)
        assert e.value.reason is Reason.RELEASE_REBOUND
    assert train.calls == 1 and ledger.releases("local") == 2
