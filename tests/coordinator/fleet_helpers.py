"""Shared set-up for coordinator tests: keys, small signed bundles (no torch), provisioned devices."""

from __future__ import annotations

from pathlib import Path

from cuvil import api
from cuvil.fleet_example import digits_mlp


def make_keys(root: Path, name: str = "author"):
    return api.keygen(root / "keys", name, force=True)


def make_bundle(root: Path, keys, version: str = "1", seed: int = 0, epochs: int = 8) -> Path:
    path = root / f"digits-v{version}.cuvil"
    api.export(digits_mlp(seed, epochs=epochs), path, keys.private_path, name="digits-mlp", version=version)
    return path


def simulate_results(root: Path) -> Path:
    """A real Flower simulation (5 devices over the default classes, ARM emulated): an evaluation
    round and an A/B round; one device's budget is already spent (a refusal) and one device's data is
    unreadable (a failure with its reason). Returns the results database's path."""
    from cuvil.coordinator import fleet
    from cuvil.coordinator.simulation import run_fleet_simulation

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
