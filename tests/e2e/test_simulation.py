"""Federated evaluation in Flower's real simulation engine (Ray): a 12-device fleet and 100 devices."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from cuvil.coordinator import fleet  # noqa: E402
from cuvil.coordinator.aggregate import OVERALL  # noqa: E402
from cuvil.coordinator.report import history_text, round_aggregates  # noqa: E402
from cuvil.coordinator.simulation import run_fleet_simulation  # noqa: E402
from cuvil.coordinator.store import ResultsStore  # noqa: E402

from ..coordinator.fleet_helpers import make_bundle, make_keys  # noqa: E402

pytestmark = pytest.mark.slow


class Recorder:
    def __init__(self):
        self.outcomes, self.ab = [], None

    def __call__(self, event, **kw):
        if event == "round_end":
            self.outcomes.append(kw["outcome"])
        elif event == "ab":
            self.ab = kw["comparison"]


@pytest.fixture(scope="module")
def twelve(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim12")
    keys = make_keys(root)
    b1, b2 = make_bundle(root, keys), make_bundle(root, keys, version="2", seed=1, epochs=2)
    states = fleet.provision_sim_fleet(root / "fleet", 12, [keys.public_path])
    spent = states[5]  # this device's budget is already spent: it must refuse, typed, and not be asked again
    ledger = spent.ledger()
    try:
        for i in range(100):
            ledger.charge(spent.dataset_name, f"earlier-{i}", 10 / 3 ** 0.5, 3.0, 1e-6)
    except Exception:
        pass
    finally:
        ledger.close()
    rec = Recorder()
    rc = {"db-path": str(root / "r.db"), "bundle": str(b1), "bundle-b": str(b2), "num-rounds": 2,
          "round-timeout": 300.0, "inventory-timeout": 300.0, "min-nodes": 12, "poll-interval": 0.05}
    t0 = time.perf_counter()
    run_fleet_simulation(12, rc, root / "fleet", [keys.public_path], on_event=rec)
    store = ResultsStore(root / "r.db")
    yield store, rec, spent.device_id, time.perf_counter() - t0, b1.stat().st_size
    store.close()


def test_fleet_has_twelve_devices_over_four_classes_arm_emulated(twelve):
    store, *_ = twelve
    devs = store.devices()
    assert len(devs) == 12 and len({d["profile"] for d in devs}) >= 4
    host = fleet.host_class()
    assert all(bool(d["emulated"]) == (d["profile"] != host) for d in devs)


def test_first_round_pushes_the_bundle_second_sends_no_bytes_and_compiles_nothing(twelve):
    store, rec, exhausted, _, size = twelve
    r1, r2 = rec.outcomes[0], rec.outcomes[1]
    assert (r1.number, r2.number) == (1, 2)
    assert len(r1.reports) == 11 and r1.bundle_bytes_sent == 12 * size
    assert all(r["metrics"]["bundle_was_cached"] == 0 and r["metrics"]["cache_hit"] == 0 for r in r1.reports)
    assert r2.sampled == 11 and len(r2.reports) == 11 and r2.bundle_bytes_sent == 0
    assert all(r["metrics"]["cache_hit"] == 1 and r["metrics"]["bundle_was_cached"] == 1 for r in r2.reports)
    rounds = store.rounds(store.runs()[-1]["id"])
    assert [r["bundle_bytes_sent"] for r in rounds[:2]] == [12 * size, 0]


def test_spent_budget_is_recorded_apart_from_failures_and_never_sampled_again(twelve):
    store, rec, exhausted, *_ = twelve
    r1, r2 = rec.outcomes[0], rec.outcomes[1]
    assert r1.failure_counts() == {"budget_exhausted": 1} and r1.failures[0]["device_id"] == exhausted
    assert exhausted not in {r["device_id"] for r in r2.reports} and not r2.failures
    assert store.exhausted_devices("digits-local") == {exhausted}


def test_emulated_latency_is_flagged_and_kept_out_of_aggregates(twelve):
    store, rec, *_ = twelve
    r2 = rec.outcomes[1]
    native = [r for r in r2.reports if not r["emulated"]]
    assert all(r["metrics"]["latency_emulated"] == int(r["emulated"]) for r in r2.reports)
    agg = round_aggregates(store, store.rounds(store.runs()[-1]["id"])[1])
    assert agg[OVERALL].latency_devices == len(native) and agg[OVERALL].emulated_devices == 11 - len(native)
    assert agg[fleet.host_class()].latency_p50_ms is not None
    assert 0.5 < agg[OVERALL].accuracy < 1.0


def test_ab_round_compares_versions_on_the_same_devices(twelve):
    store, rec, *_ = twelve
    a, b = rec.outcomes[2], rec.outcomes[3]
    assert (a.kind, b.kind) == ("ab:A", "ab:B") and a.number == b.number == 3
    assert {r["device_id"] for r in a.reports} == {r["device_id"] for r in b.reports}
    assert rec.ab[OVERALL]["devices"] == 11 and rec.ab[OVERALL]["diff"] < 0  # v2 is the under-trained one


def test_history_shows_epsilon_per_device(twelve):
    store, *_ = twelve
    text = history_text(store, store.runs()[-1]["id"])
    assert "ε spent per device" in text and "sim-000" in text


def test_hundred_devices_complete_one_round(tmp_path):
    """All 100 report within the round's deadline; the round's speed is measured by
    benchmarks/fleet_scale.py, not asserted here."""
    keys = make_keys(tmp_path)
    b1 = make_bundle(tmp_path, keys)
    rec = Recorder()
    rc = {"db-path": str(tmp_path / "r.db"), "bundle": str(b1), "num-rounds": 1, "round-timeout": 120.0,
          "inventory-timeout": 300.0, "min-nodes": 100, "poll-interval": 0.05}
    t0 = time.perf_counter()
    run_fleet_simulation(100, rc, tmp_path / "fleet", [keys.public_path], on_event=rec, shared_cache=True)
    wall = time.perf_counter() - t0
    (r1,) = rec.outcomes
    print(f"100 devices: round {r1.seconds:.1f}s, whole simulation (Ray start, inventory) {wall:.1f}s")
    assert len(r1.reports) == 100 and not r1.failures
