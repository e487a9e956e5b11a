"""The simulation's guards that need no Ray: trusted keys checked before provisioning, and Ctrl-C."""

from __future__ import annotations

import threading

import pytest

from cuvil.compiler.bundle.signing import KeyFileError
from cuvil.coordinator import simulation

from .fleet_helpers import make_keys


def test_keys_the_devices_could_not_trust_are_refused_before_any_device_is_provisioned(tmp_path, monkeypatch):
    monkeypatch.setattr(simulation, "_provision", lambda *a, **k: pytest.fail("provisioned"))
    first, second = make_keys(tmp_path / "a", "cuvil"), make_keys(tmp_path / "b", "cuvil")
    with pytest.raises(KeyFileError, match="two different trusted keys are named cuvil.pub"):
        simulation.run_fleet_simulation(2, {}, tmp_path / "fleet", [first.public_path, second.public_path])
    with pytest.raises(KeyFileError, match="is not a PEM public key"):
        simulation.run_fleet_simulation(2, {}, tmp_path / "fleet", [first.private_path])


class _Grid:
    nodes = 3

    def get_node_ids(self):
        return list(range(self.nodes))


def test_a_stopped_grid_fails_every_call_so_the_coordinator_thread_ends():
    stop = threading.Event()
    grid = simulation._StoppableGrid(_Grid(), stop)
    assert grid.get_node_ids() == [0, 1, 2] and grid.nodes == 3
    stop.set()
    with pytest.raises(simulation.SimulationInterrupted):
        grid.get_node_ids()


def test_ctrl_c_in_the_engine_ends_the_coordinator_thread_with_its_run_aborted(tmp_path, monkeypatch):
    """Flower's engine stopped on Ctrl-C while its ServerApp thread waited on for ever: Aborted!, and no exit."""
    import flwr.simulation
    from flwr.app import Context

    from cuvil.coordinator.store import ResultsStore

    from .fleet_helpers import make_bundle

    keys = make_keys(tmp_path)
    rc = {"db-path": str(tmp_path / "r.db"), "bundle": str(make_bundle(tmp_path, keys))}
    apps = []

    def interrupted(server_app, **kwargs):
        apps.append(server_app)
        raise KeyboardInterrupt

    monkeypatch.setattr(simulation, "_provision", lambda *a, **k: None)
    monkeypatch.setattr(simulation, "_start_ray", lambda init_args: False)
    monkeypatch.setattr(flwr.simulation, "run_simulation", interrupted)
    with pytest.raises(KeyboardInterrupt):
        simulation.run_fleet_simulation(1, rc, tmp_path / "fleet", [keys.public_path])
    context = Context(run_id=1, node_id=0, node_config={}, state=None, run_config={})
    with pytest.raises(simulation.SimulationInterrupted):
        apps[0](_Grid(), context)  # the ServerApp thread, at its first call after the Ctrl-C
    (run,) = ResultsStore.open_read_only(tmp_path / "r.db").runs()
    assert (run["status"], run["reason"]) == ("aborted", "SimulationInterrupted: the simulation was interrupted")
