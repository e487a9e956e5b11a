"""One small simulated run shared by the tests that look at results (dashboard, report, CLI)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def simulated_results(tmp_path_factory):
    """A real Flower simulation (5 devices over the default classes, ARM emulated): an evaluation
    round and an A/B round; one device's budget is already spent (a refusal) and one device's data is
    unreadable (a failure with its reason). Returns the results database's path."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from cuvil.coordinator import fleet
    from cuvil.coordinator.simulation import run_fleet_simulation

    from ..coordinator.fleet_helpers import make_bundle, make_keys

    root = tmp_path_factory.mktemp("simulated-results")
    keys = make_keys(root)
    b1, b2 = make_bundle(root, keys), make_bundle(root, keys, version="2", seed=1, epochs=2)
    states = fleet.provision_sim_fleet(root / "fleet", 5, [keys.public_path])
    spent = states[4].ledger()
    try:
        for i in range(100):
            spent.charge(states[4].dataset_name, f"earlier-{i}", 10 / 3 ** 0.5, 3.0, 1e-6)
    except Exception:  # the ledger refused: the budget is spent
        pass
    finally:
        spent.close()
    (states[3].root / "data.npz").write_bytes(b"not an npz")
    rc = {"db-path": str(root / "results.db"), "bundle": str(b1), "bundle-b": str(b2), "num-rounds": 1,
          "round-timeout": 120.0, "inventory-timeout": 120.0, "min-nodes": 5, "poll-interval": 0.05}
    run_fleet_simulation(5, rc, root / "fleet", [keys.public_path], shared_cache=True)
    return root / "results.db"
