"""The device's closed-form Gaussian RDP accountant agrees with dp-accounting's RdpAccountant."""

import math

import pytest

from cuvil.edge_runtime.privacy.accounting import AccountingError, epsilon_spent

dp_accounting = pytest.importorskip("dp_accounting")


def reference(multipliers, delta):
    acc = dp_accounting.rdp.RdpAccountant()
    for z in multipliers:
        acc.compose(dp_accounting.GaussianDpEvent(z))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("z", [0.3, 1.0, 10 / math.sqrt(3), 5.0, 50.0, 5000.0])
@pytest.mark.parametrize("releases", [1, 3, 12, 100])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_closed_form_matches_dp_accounting(z, releases, delta):
    assert epsilon_spent([z] * releases, delta) == pytest.approx(reference([z] * releases, delta), rel=1e-9, abs=1e-12)


def test_mixed_multipliers_match_too():
    zs = [5.77, 10.0, 7.5, 20.0, 5.77]
    assert epsilon_spent(zs, 1e-6) == pytest.approx(reference(zs, 1e-6), rel=1e-9)


@pytest.mark.parametrize("zs, delta", [([math.nan], 1e-6), ([math.inf], 1e-6), ([0.0], 1e-6), ([-1.0], 1e-6),
                                       ([5.0], math.nan), ([5.0], 0.0), ([5.0], 1.0)])
def test_non_finite_or_non_positive_inputs_are_refused(zs, delta):
    with pytest.raises(AccountingError):
        epsilon_spent(zs, delta)
