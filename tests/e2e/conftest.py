"""One small simulated run shared by the tests that look at results (dashboard, report, CLI)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def simulated_results(tmp_path_factory):
    """The results database of :func:`..coordinator.fleet_helpers.simulate_results`, made once."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from ..coordinator.fleet_helpers import simulate_results

    return simulate_results(tmp_path_factory.mktemp("simulated-results"))
