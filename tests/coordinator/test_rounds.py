"""The coordinator's main loop over a fake in-memory transport (unit tests only; e2e tests use Flower)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from cuvil.coordinator.messages import Code
from cuvil.coordinator.config import RunConfig
from cuvil.coordinator.rounds import BundleRef, Coordinator, Reply, compare
from cuvil.coordinator.store import ResultsStore

from .helpers import device_report

A = BundleRef("m", "1", "a" * 64, b"A" * 1000)
B = BundleRef("m", "2", "b" * 64, b"B" * 2000)
NODE = 2**63 + 100  # Flower node ids are uint64: beyond int64 and exact float range


@dataclass
class FakeDevice:
    device_id: str
    profile: str
    behaviour: str = "ok"  # ok | silent | crash | refuse | exhausted | forgetful
    held: set = field(default_factory=set)
    accuracy: float = 0.9
    received_bytes: int = 0
    calls: int = 0


class FakeTransport:
    def __init__(self, devices: dict[int, FakeDevice]):
        self.devices = devices
        self.outbox: dict[str, Reply] = {}
        self.n = 0

    def node_ids(self):
        return list(self.devices)

    def send(self, requests):
        handles = []
        for r in requests:
            self.n += 1
            h = f"m{self.n}"
            handles.append(h)
            dev = self.devices[r.node_id]
            dev.calls += 1
            if dev.behaviour == "silent":
                continue
            if r.kind == "info":
                self.outbox[h] = Reply(h, True, {"device_id": dev.device_id, "profile": dev.profile, "emulated": 0,
                                                 "held_bundles": sorted(dev.held), "cpu": "x", "features": "",
                                                 "runtime_version": "t"})
                continue
            dev.received_bytes += len(r.bundle or b"")
            code = {"crash": Code.DEVICE_ERROR, "refuse": Code.SIGNATURE_REJECTED,
                    "exhausted": Code.BUDGET_EXHAUSTED}.get(dev.behaviour)
            if dev.behaviour == "forgetful" and r.bundle is None:
                dev.behaviour = "ok"
                code = Code.BUNDLE_MISSING
            if code is not None:
                self.outbox[h] = Reply(h, False, code=code, reason=f"{code}")
                continue
            dev.held.add(r.config["bundle-hash"])
            metrics, _ = device_report(self.n, dev.accuracy if r.config["bundle-hash"] == A.content_hash else 0.5)
            self.outbox[h] = Reply(h, True, metrics)
        return handles

    def poll(self, handles):
        return [self.outbox.pop(h) for h in list(handles) if h in self.outbox]


def _fleet(**behaviours):
    devs = {}
    for i, cls in enumerate(["x86", "x86", "x86", "rpi5", "rpi5", "orin"]):
        devs[NODE + i] = FakeDevice(f"d{i}", cls, behaviours.get(f"d{i}", "ok"))
    return devs


@pytest.fixture
def store(tmp_path):
    s = ResultsStore(tmp_path / "r.db")
    yield s
    s.close()


def _coord(store, devs, **cfg):
    config = RunConfig(round_timeout=1.0, inventory_timeout=0.5, poll_interval=0.01, node_wait=0.1, **cfg)
    return Coordinator(FakeTransport(devs), store, store.start_run({}), config)


def test_inventory_records_devices_and_never_waits_for_a_silent_one(store):
    devs = _fleet(d5="silent")
    coord = _coord(store, devs)
    t0 = time.monotonic()
    found = coord.inventory()
    assert time.monotonic() - t0 < 2.0
    assert sorted(v.device_id for v in found.values()) == ["d0", "d1", "d2", "d3", "d4"]
    assert [d["device_id"] for d in store.devices()] == ["d0", "d1", "d2", "d3", "d4"]


def test_sampling_is_per_class(store):
    coord = _coord(store, _fleet(), sample_per_class=1)
    coord.inventory()
    picked = coord.sample(1)
    assert sorted(coord.devices[n].profile for n in picked) == ["orin", "rpi5", "x86"]
    assert coord.sample(1) == picked  # seeded per round


def test_bundle_goes_only_to_devices_that_do_not_hold_it(store):
    devs = _fleet()
    devs[NODE + 1].held.add(A.content_hash)
    coord = _coord(store, devs)
    coord.inventory()
    r1 = coord.evaluate_round(A, 1)
    assert len(r1.reports) == 6 and r1.bundle_bytes_sent == 5 * len(A.data)
    assert devs[NODE + 1].received_bytes == 0
    r2 = coord.evaluate_round(A, 2)
    assert len(r2.reports) == 6 and r2.bundle_bytes_sent == 0
    assert [r["bundle_bytes_sent"] for r in store.rounds(coord.run_id)] == [5000, 0]


def test_failures_timeouts_refusals_and_budget_are_counted_apart(store):
    devs = _fleet(d1="crash", d3="refuse", d4="exhausted")
    coord = _coord(store, devs)
    coord.inventory()
    devs[NODE + 5].behaviour = "silent"  # answered the inventory, then went away
    t0 = time.monotonic()
    out = coord.evaluate_round(A, 1)
    assert time.monotonic() - t0 < 3.0  # bounded by the round timeout
    assert out.failure_counts() == {"failure": 1, "refused": 1, "budget_exhausted": 1, "timeout": 1}
    assert len(out.reports) == 2
    kinds = sorted((f["device_id"], f["kind"]) for f in store.failures(out.round_id))
    assert kinds == [("d1", "failure"), ("d3", "refused"), ("d4", "budget_exhausted"), ("d5", "timeout")]
    agg = out.aggregates
    assert agg["all"].failures == {"failure": 1, "refused": 1, "budget_exhausted": 1, "timeout": 1}


def test_a_device_whose_budget_is_spent_is_not_sampled_again_for_that_dataset(store):
    devs = _fleet(d4="exhausted")
    coord = _coord(store, devs)
    coord.inventory()
    coord.evaluate_round(A, 1)
    calls = devs[NODE + 4].calls
    coord.evaluate_round(A, 2)
    assert devs[NODE + 4].calls == calls and store.exhausted_devices("digits-local") == {"d4"}
    other = _coord(store, devs, dataset="other-data")
    other.inventory()
    assert NODE + 4 in other.sample(1)


def test_a_device_that_lost_the_bundle_gets_it_again_in_the_same_round(store):
    devs = _fleet(d2="forgetful")
    devs[NODE + 2].held.add(A.content_hash)
    coord = _coord(store, devs)
    coord.inventory()
    out = coord.evaluate_round(A, 1)
    assert len(out.reports) == 6 and not out.failures and devs[NODE + 2].received_bytes == len(A.data)


def test_ab_round_compares_both_versions_on_the_same_devices(store):
    devs = _fleet(d5="exhausted")
    coord = _coord(store, devs, sample_per_class=2)
    coord.inventory()
    ra, rb, cmp = coord.ab_round(A, B, 1)
    assert {r["device_id"] for r in ra.reports} == {r["device_id"] for r in rb.reports}
    assert [r["kind"] for r in store.rounds(coord.run_id)] == ["ab:A", "ab:B"]
    assert cmp["all"]["devices"] == len(ra.reports) and cmp["all"]["diff"] < -0.2
    assert cmp["all"]["se"] > 0 and "x86" in cmp


def test_compare_uses_only_paired_devices():
    ra = [{"device_id": "x", "profile": "p", "metrics": device_report(1, 0.9)[0]}]
    rb = [{"device_id": "y", "profile": "p", "metrics": device_report(2, 0.5)[0]}]
    assert compare(ra, rb) == {}


def test_results_survive_a_killed_coordinator(tmp_path):
    path = tmp_path / "r.db"
    s1 = ResultsStore(path)
    coord = _coord(s1, _fleet())
    coord.inventory()
    coord.evaluate_round(A, 1)
    del coord, s1  # no close, no finish_run: as if killed
    s2 = ResultsStore(path)
    (run,) = s2.runs()
    assert run["status"] == "running" and len(s2.reports(s2.rounds(run["id"])[0]["id"])) == 6
